#!/bin/sh
# the agent wrote its draw into the workspace
grep -q pass verdict
