"""Simulator tests: importing flowdsl.sim installs the simulator's hooks."""

import flowdsl.sim  # noqa: F401
