"""Shared setup of the simulator tests: import flowdsl (or a stand-in), register the ``sim`` marker."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _standin import ROOT, ensure_flowdsl  # noqa: E402

ensure_flowdsl()
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def pytest_configure(config):
    config.addinivalue_line("markers", "sim: runs on the flowdsl CPU simulator (no GPU needed)")
