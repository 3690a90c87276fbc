"""Every public name of NCCL's device API has a flowdsl name or a refusal, and the lists behind that hold.

docs/nccl_device_surface.txt (the newest release) and docs/nccl_device_surface-<release>.txt (each older
release flowdsl has support builds for) are generated from NCCL's headers (scripts/nccl_device_surface.py);
flowdsl/_nccl_coverage.py maps their entries; docs/nccl-coverage.md renders them. A new NCCL release's
additions fail here until its list is generated and each new name is mapped or refused.
"""

from __future__ import annotations

import importlib
import runpy
import shutil
from pathlib import Path

import pytest

from flowdsl import _nccl_coverage as coverage
from flowdsl.host import checks
from flowdsl.runtime.communicator import REQUIREMENT_FIELDS

pytestmark = pytest.mark.compile
ROOT = Path(__file__).resolve().parents[2]
GENERATOR = runpy.run_path(str(ROOT / "scripts" / "nccl_device_surface.py"))
LISTS = GENERATOR["read_lists"]()
ENTRIES = GENERATOR["union"](LISTS)


def test_every_listed_name_has_a_flowdsl_name_or_a_refusal():
    unmapped = [entry for entry in ENTRIES if entry not in coverage.COVERAGE]
    assert not unmapped, (f"{len(unmapped)} NCCL names have neither a flowdsl name nor a refusal: add each to "
                          "COVERAGE in flowdsl/_nccl_coverage.py:\n  " + "\n  ".join(unmapped))


def test_every_mapped_name_is_listed():
    stale = sorted(set(coverage.COVERAGE) - set(ENTRIES))
    assert not stale, ("flowdsl/_nccl_coverage.py maps names that docs/nccl_device_surface.txt does not list "
                       "(renamed or removed by NCCL?):\n  " + "\n  ".join(stale))


def test_every_refusal_says_why():
    for entry, outcome in coverage.COVERAGE.items():
        assert isinstance(outcome, (coverage.Provided, coverage.Refused)), entry
        if isinstance(outcome, coverage.Refused):
            assert outcome.category in (coverage.NOT_YET, coverage.NOT_APPLICABLE), (entry, outcome.category)
            assert outcome.reason.strip(), f"{entry}: a refusal without a reason"


def _resolve(name: str):
    """The object a dotted flowdsl name stands for: the longest importable module, then attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            obj = getattr(obj, attribute)
        return obj
    raise ImportError(name)


def _provided():
    return [(entry, outcome.name) for entry, outcome in coverage.COVERAGE.items()
            if isinstance(outcome, coverage.Provided)]


@pytest.mark.parametrize("entry,name", [(e, n) for e, n in _provided()
                                        if coverage.device_communicator_keyword(n) is None])
def test_a_flowdsl_name_resolves(entry, name):
    assert name.startswith("flowdsl."), f"{entry}: {name} is not a flowdsl name"
    try:
        _resolve(name)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"{entry} is mapped to {name}, which does not resolve ({exc})")


@pytest.mark.parametrize("entry,name", [(e, n) for e, n in _provided()
                                        if coverage.device_communicator_keyword(n) is not None])
def test_a_device_communicator_keyword_is_one(entry, name):
    keyword = coverage.device_communicator_keyword(name)
    assert keyword in checks.DEVICE_REQUIREMENTS, (
        f"{entry} is mapped to the keyword {keyword}, which comm.device_communicator does not take")
    if entry.startswith("field "):
        field = entry.split(".", 1)[1]
        assert REQUIREMENT_FIELDS[keyword] == field, (
            f"{entry} is mapped to {keyword}, which sets {REQUIREMENT_FIELDS[keyword]}")


def test_the_list_is_the_installed_nccls_headers():
    include_dir = GENERATOR["installed_include_dir"]()
    if include_dir is None:
        pytest.skip("no installed NCCL headers (nvidia-nccl-cu13) to compare docs/nccl_device_surface.txt with")
    version = GENERATOR["nccl_version"](include_dir)
    path = GENERATOR["list_for"](version)
    found = GENERATOR["differences"](GENERATOR["read_list"](path)[0], GENERATOR["surface"](include_dir), path.name)
    assert not found, (f"docs/{path.name} differs from the installed NCCL {version}'s headers; run python "
                       "scripts/nccl_device_surface.py (a new release: add it to RELEASES first), then map or "
                       "refuse each new name in flowdsl/_nccl_coverage.py:\n  " + "\n  ".join(found))


def test_there_is_a_list_for_every_release_with_support_builds():
    from flowdsl.runtime.support_build import SUPPORTED_VERSIONS  # noqa: PLC0415

    assert tuple(LISTS) == tuple(SUPPORTED_VERSIONS) == GENERATOR["RELEASES"]
    assert GENERATOR["list_path"](SUPPORTED_VERSIONS[-1]).name == "nccl_device_surface.txt"


def test_the_releases_lists_differ_where_their_headers_do():
    """2.32.3 has NCCL's C API for LLVM IR (ncclGin_C, ncclGinPut, ...), which 2.32.6 dropped; 2.32.6 adds Flow:
    both are on the page, each mapped, with the releases that declare it."""
    assert "function ncclGinPut_v3" in LISTS["2.32.3"] and "function ncclGinPut_v3" not in LISTS["2.32.6"]
    assert "type ncclFlowProcessor" in LISTS["2.32.6"] and "type ncclFlowProcessor" not in LISTS["2.32.3"]
    assert set(LISTS["2.28.9"]) <= set(LISTS["2.32.3"]) | set(LISTS["2.32.6"])
    page = (ROOT / "docs" / "nccl-coverage.md").read_text()
    assert "| `ncclGinPut_v3` | function | 2.32.3 | `flowdsl.gin.put` |" in page
    assert "| `ncclGin::put` | method | all | `flowdsl.gin.put` |" in page


def test_the_page_is_the_rendered_table():
    assert (ROOT / "docs" / "nccl-coverage.md").read_text() == GENERATOR["render"](LISTS), (
        "docs/nccl-coverage.md is stale: python scripts/nccl_device_surface.py --markdown")


def test_the_page_is_in_the_sites_nav():
    assert "nccl-coverage.md" in (ROOT / "mkdocs.yml").read_text()


_ADDITIONS = """\
#ifndef _NEW_H_
#define _NEW_H_
#ifdef __CUDACC__
enum ncclNewLevel : uint32_t { Low = 1u << 0, High = 1u << 1 };
struct ncclNewThing_internal;
template <typename Coop>
struct ncclNewSession : ncclNewThing_internal {
  NCCL_DEVICE_INLINE ncclNewSession(Coop, ncclNewLevel = ncclNewLevel::Low);
  NCCL_DEVICE_INLINE ~ncclNewSession();
  NCCL_DEVICE_INLINE void go(Coop, int x = ncclNewDefault) { helper(); }
  NCCL_DEVICE_INLINE void _hidden();
  ncclNewSession(ncclNewSession const&) = delete;
private:
  NCCL_DEVICE_INLINE void secret();
};
NCCL_DEVICE_INLINE int ncclNewCall(ncclNewSession<int> const&);
#if defined(NCCL_OS_WINDOWS)
NCCL_DEVICE_INLINE int ncclWindowsOnly();
#endif
#endif
#endif
"""


def test_a_new_releases_additions_show_up(tmp_path):
    """A copy of the installed headers with one more header: its names, and only its public ones, are new."""
    include_dir = GENERATOR["installed_include_dir"]()
    if include_dir is None:
        pytest.skip("no installed NCCL headers (nvidia-nccl-cu13) to add a header to")
    copy = tmp_path / "include"
    shutil.copytree(include_dir, copy)
    (copy / "nccl_device" / "new.h").write_text(_ADDITIONS)
    new = set(GENERATOR["surface"](copy)) - set(GENERATOR["surface"](include_dir))
    assert new == {"type ncclNewLevel", "value ncclNewLevel::Low", "value ncclNewLevel::High",
                   "type ncclNewSession", "method ncclNewSession::go", "function ncclNewCall"}
    assert not set(new) & set(coverage.COVERAGE)
