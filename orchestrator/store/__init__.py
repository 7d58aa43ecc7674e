"""What a run leaves on the controller: the run directory and the history index over run directories.
"""
