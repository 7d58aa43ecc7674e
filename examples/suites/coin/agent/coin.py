"""A sampled agent that does nothing but draw: each attempt passes with a probability.

The rate is params.json's "rate" (0.5 unless said), or 0.9 on a host whose /opt holds
crosshost-coin/high: a host difference that only shows in pass rates, never in one attempt. A task
named in params.json's "rates" passes at its own rate on every host.
With a "salt" in params.json each draw is seeded from the salt, the host, the task and the
attempt (reproducible runs, as the tests use); without one it is random. Python 3.9+, stdlib only.
"""

import json
import os
import random
import socket
import sys

sys.stdin.readline()  # the task message; a coin needs no tools
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "params.json")) as fh:
    params = json.load(fh)
# the runner makes <task>.<attempt>.<random>/work the working directory
task, attempt = os.path.basename(os.path.dirname(os.getcwd())).split(".")[:2]
rates = params.get("rates") or {}
rate = float(rates.get(task, params.get("rate", 0.5)))
if task not in rates and os.path.exists("/opt/crosshost-coin/high"):
    rate = 0.9
if "salt" in params:
    host = socket.gethostname()
    host = host if host.startswith("box-") else "local"  # the controller's own name differs by machine
    draw = random.Random("%s:%s:%s:%s" % (params["salt"], host, task, attempt)).random()
else:
    draw = random.random()
with open("verdict", "w") as out:
    out.write("pass" if draw < rate else "fail")
sys.stdout.write(json.dumps({"type": "final", "content": "drew", "finish": "stop"}) + "\n")
