"""A stand-in for runner.pyz in unit tests (run as ``python3 fake_runner.py ...``; stdlib only).

It speaks the runner's CLI (fingerprint / run) and writes the runner's out/ layout. What it does on a
host is steered by ``behaviour.json`` in the suite: {"<host>": "crash" | "sleep" | "symlink" | "big" | "leak" | "provider_down" | "refuse" | "badresults" | "ok"}.
"""

import hashlib
import json
import os
import sys
import time


def fingerprint(cwd):
    digest = hashlib.sha256(cwd.encode()).hexdigest()[:16]
    # the runner's fingerprint.json shape (agent_runner.records.Fingerprint), fewer fields
    return {"fingerprint": digest, "python": f"CPython {sys.version.split()[0]}", "env_keys": sorted(os.environ)}


def arg(args, name, default=None):
    return args[args.index(name) + 1] if name in args else default


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "fingerprint":
        print(json.dumps(fingerprint(arg(args, "--cwd", os.getcwd()))))
        return 0
    suite, out, host = arg(args, "--suite"), arg(args, "--out"), arg(args, "--host")
    with open(os.path.join(suite, "suite.json")) as fh:
        normalised = json.load(fh)
    with open(os.path.join(suite, "behaviour.json")) as fh:
        behaviour = json.load(fh).get(host, "ok")
    if behaviour == "refuse":  # stops before its fingerprint, as the runner does on bad input
        sys.stderr.write("refused: no such agent on this host\n")
        return 2
    tasks = [t["id"] for t in normalised["tasks"]]
    if arg(args, "--tasks"):
        tasks = arg(args, "--tasks").split(",")
    repeat = int(arg(args, "--repeat", "1"))
    fp = fingerprint(arg(args, "--workspace-root"))
    os.makedirs(os.path.join(out, "traces"), exist_ok=True)
    with open(os.path.join(out, "fingerprint.json"), "w") as fh:
        json.dump(fp, fh)
    rows = []
    for task in tasks:
        for attempt in range(repeat):
            header = {"type": "header", "schema": "crosshost.trace/2", "run_id": arg(args, "--run-id"), "host": host, "task": task, "attempt": attempt,
                      "fingerprint": fp["fingerprint"], "pins": {"prompt_sha": "p" + task},
                      "env": dict(os.environ)}
            row = {"run_id": arg(args, "--run-id"), "task": task, "env": host, "attempt": attempt,
                   "verdict": "pass", "passed": True, "fingerprint": fp["fingerprint"]}
            if behaviour == "provider_down":  # the runner ran fine; the model provider never answered
                row.update(verdict="error", passed=False, reason="agent_error", why="model provider unreachable")
            finish = {"type": "finish", "reason": row.get("reason", "stop"), "verdict": row["verdict"],
                      "predicate_exit": None, "findings": []}
            with open(os.path.join(out, "traces", f"{task}.{attempt}.jsonl"), "w") as fh:
                fh.write(json.dumps(header) + "\n" + json.dumps(finish) + "\n")
            rows.append(row)
            if behaviour == "sleep":
                time.sleep(30)
            if behaviour == "leak":
                sys.stderr.write("auth failed for token ghp_" + "A1b2" * 9 + "\n")
                return 3
            if behaviour == "crash":
                sys.stderr.write("Traceback: boom\n")
                return 3
    if behaviour == "big":
        with open(os.path.join(out, "traces", "big.bin"), "wb") as fh:
            fh.write(b"x" * 1_000_000)
    if behaviour == "symlink":
        os.symlink("/etc/passwd", os.path.join(out, "traces", "evil.jsonl"))
    with open(os.path.join(out, "results.jsonl"), "w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
        if behaviour == "badresults":
            fh.write("{not json\n")
    announce(out)
    return 0


def announce(out):
    """As the runner does: the sha256 of every file it wrote, on stdout (agent_runner/digests.py)."""
    for root, _, files in os.walk(out):
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                with open(path, "rb") as fh:
                    sha = hashlib.sha256(fh.read()).hexdigest()
                print(f"crosshost-digest {sha} {os.path.relpath(path, out)}", flush=True)


sys.exit(main())
