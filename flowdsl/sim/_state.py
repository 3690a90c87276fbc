"""Process-global state of the running simulation (one simulation at a time).

Contents: ``cur`` (the simulated task now running: a kernel thread or a host
rank), ``sched`` (the running :class:`~flowdsl.sim.scheduler.Scheduler`), ``race`` (its
:class:`~flowdsl.sim.races.RaceDetector`, or None when races are not detected).
"""

cur = None
sched = None
race = None
