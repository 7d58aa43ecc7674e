"""Per-host machinery: the inventory, the transports, the bundle, one host's workspace and job, the fan-out.
"""
