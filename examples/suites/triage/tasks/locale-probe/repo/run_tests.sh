#!/bin/sh
# "café" is 4 characters in a UTF-8 locale and 5 (bytes) in the C locale.
n=$(printf 'caf\303\251' | wc -m | tr -d ' ')
if [ "$n" = 4 ]; then echo "ok: 4 characters (LANG=${LANG:-unset})"; exit 0; fi
echo "FAIL: counted $n characters; the locale is not UTF-8 (LANG=${LANG:-unset} LC_ALL=${LC_ALL:-unset})"; exit 1
