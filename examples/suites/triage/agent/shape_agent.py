"""Demo agent whose tool calls change shape with the host.

It passes everywhere, but where /opt/crosshost-demo exists (the demo creates it on box-b only) it adds
a 'grace_s' argument to restart_unit: the same agent, a different tool-call shape, an unstable contract."""

import os

from protocol import call, final, task

task()
call("read_unit_status", {"unit": "nginx.service"})
args = {"unit": "nginx.service"}
if os.path.isdir("/opt/crosshost-demo"):
    args["grace_s"] = 30
call("restart_unit", args)
health = call("http_get_health", {"unit": "nginx.service"})
final("Restarted nginx.service; health: " + health)
