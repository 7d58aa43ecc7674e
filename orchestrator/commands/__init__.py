"""The crosshost commands: one module per command that does more than render (replay, explain, repro, ...).

``cli.py`` parses the arguments, calls one function of a module here, and renders what it returns.
"""
