#!/bin/sh
# The rollout test silently depends on a file outside the workspace: a host fact, not the agent's work.
if [ -e /opt/crosshost-demo/feature.flag ]; then
  echo "FAIL: /opt/crosshost-demo/feature.flag is set on this host: the new code path runs"; exit 1
fi
echo "ok: feature flag off"
