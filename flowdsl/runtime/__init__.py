"""flowdsl's host side on GPUs: the communicator, the resources it owns, and the support builds.

:mod:`flowdsl.runtime.communicator` bootstraps ranks and owns symmetric memory, windows and
device communicators (:mod:`flowdsl.runtime.memory`); the other modules find the loaded NCCL,
choose or build the support library for it, and turn ``stream=`` into a driver stream. The
public names are re-exported by :mod:`flowdsl` (``flowdsl.init``, ``flowdsl.Communicator``, ...).
"""
