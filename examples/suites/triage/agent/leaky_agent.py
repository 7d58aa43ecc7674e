"""Demo agent that leaks its working directory: it 'attaches' a file by absolute path.

A real agent does this when it builds paths with os.getcwd() or os.path.abspath() and sends them to a
remote tool: the path names the box it ran on, and the contract checker catches it."""

import os

from protocol import call, final, task

task()
status = call("read_unit_status", {"unit": "nginx.service"})
with open("status.txt", "w") as handle:
    handle.write(status + "\n")
attachment = os.path.abspath("status.txt")
ticket = call("open_ticket", {"title": "nginx.service is failing",
                              "body": "Status attached.", "attachment": attachment})
final("Opened the ticket: " + ticket)
