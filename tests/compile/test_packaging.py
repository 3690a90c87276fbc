"""An installed flowdsl (a wheel: the package alone, outside the source tree) finds its support builds.

The wheel carries ``prebuilt/`` as ``flowdsl/_prebuilt`` (setup.py); a checkout or an
editable install reads ``prebuilt/`` itself. ``.ci/run`` builds the real wheel, installs
it into a fresh environment and runs ``flowdsl info`` and the demo there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flowdsl.runtime import support_build

pytestmark = pytest.mark.compile
ROOT = Path(__file__).resolve().parents[2]

_PROBE = """
import json
from flowdsl.runtime import support, support_build
build = support.support_build_for((2, 28, 9), "sm_90")
cft = support.cft_build_for((2, 32, 3), "sm_100")
print(json.dumps({"prebuilt": str(support_build.PREBUILT_DIR), "abis": sorted(support.manifest()["abis"]),
                  "build": str(build.path), "cft": str(cft.path), "sizes": [len(build.ltoir), len(cft.ltoir)]}))
"""


def _installed_copy(site: Path, with_prebuilt: bool) -> None:
    """The package as a wheel installs it: flowdsl/ alone, plus (from setup.py) flowdsl/_prebuilt."""
    shutil.copytree(ROOT / "flowdsl", site / "flowdsl", ignore=shutil.ignore_patterns("__pycache__", "_prebuilt"))
    if with_prebuilt:
        setup_source = (ROOT / "setup.py").read_text()
        for part in ("build", "include", "src"):
            assert f'"{part}"' in setup_source, f"setup.py no longer ships prebuilt/{part}"
            shutil.copytree(ROOT / "prebuilt" / part, site / "flowdsl" / "_prebuilt" / part)


def _probe(site: Path, cwd: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FLOWDSL_PREBUILT_DIR")}
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, cwd=cwd,
                          env=dict(env, PYTHONPATH=str(site)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_an_installed_package_reads_the_builds_it_carries(tmp_path):
    site = tmp_path / "site-packages"
    _installed_copy(site, with_prebuilt=True)
    found = _probe(site, cwd=tmp_path)
    prebuilt = site / "flowdsl" / "_prebuilt"
    assert found["prebuilt"] == str(prebuilt)
    assert found["abis"] == list(support_build.SUPPORTED_VERSIONS)
    assert found["build"] == str(prebuilt / "build" / "nccl-2.28.9" / "sm_90.ltoir")
    assert found["cft"] == str(prebuilt / "build" / "nccl-2.32.3" / "sm_100-cft.ltoir")
    assert found["sizes"] == [(ROOT / "prebuilt/build/nccl-2.28.9/sm_90.ltoir").stat().st_size,
                              (ROOT / "prebuilt/build/nccl-2.32.3/sm_100-cft.ltoir").stat().st_size]


def test_a_checkout_reads_prebuilt_in_the_source_tree():
    from flowdsl.runtime import support_build

    if os.environ.get("FLOWDSL_PREBUILT_DIR"):
        pytest.skip("FLOWDSL_PREBUILT_DIR is set: it overrides the lookup under test")
    assert support_build.PREBUILT_DIR == ROOT / "prebuilt"
    assert not (ROOT / "flowdsl" / "_prebuilt").exists(), "flowdsl/_prebuilt is made by the wheel build only"
