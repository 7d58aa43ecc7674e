"""The command-agent side of crosshost's JSON-lines protocol (stdin: task/observation/abort; stdout:
tool_call/usage/final). Shared by the demo agents; Python 3.9+, standard library only."""

import json
import sys


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def receive():
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)  # the runner went away
    return json.loads(line)


def task():
    message = receive()
    assert message["type"] == "task", message
    return message


def call(name, args):
    """One tool call; returns the observation text, or exits quietly when the runner aborts us."""
    send({"type": "tool_call", "name": name, "args": args})
    send({"type": "usage", "prompt_tokens": 0, "completion_tokens": 0})
    message = receive()
    if message["type"] == "abort":
        sys.exit(0)
    return message["content"]


def final(content):
    send({"type": "final", "content": content, "finish": "stop"})
