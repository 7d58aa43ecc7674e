#!/bin/sh
# Pass when nginx may accept connections: worker_connections is a positive number.
n=$(sed -n 's/^ *worker_connections *\([0-9]*\);.*/\1/p' conf/nginx.conf)
if [ -n "$n" ] && [ "$n" -gt 0 ]; then echo "ok: worker_connections=$n"; exit 0; fi
echo "FAIL: worker_connections is '${n:-missing}'"; exit 1
