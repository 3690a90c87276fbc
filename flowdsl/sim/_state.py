"""Process-global state of the running simulation (one simulation at a time).
"""

cur = None
sched = None
race = None
