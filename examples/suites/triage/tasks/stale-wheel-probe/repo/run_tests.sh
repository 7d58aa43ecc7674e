#!/bin/sh
# The install step reuses wheels from a fixed cache path outside the workspace (not $TMPDIR): whatever an
# earlier session left there on this host is a hidden input of the test.
cache=/tmp/crosshost-demo/wheels
if ls "$cache"/*.whl >/dev/null 2>&1; then
  echo "FAIL: installed a stale cached wheel from $cache ($(cd "$cache" && ls *.whl | head -n 1)), not the pinned one"; exit 1
fi
echo "ok: no cached wheel, installed the pinned one"
