"""The ``flowdsl`` command and the examples' own entry points say what they did, in plain words."""

from __future__ import annotations

import io

import numpy as np
import pytest

import flowdsl
from flowdsl import __main__ as cli
from flowdsl.runtime.support import manifest

pytestmark = pytest.mark.compile


def test_precompile_without_a_gpu_says_which_flags_to_pass(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_gpu_available", lambda: False)
    assert cli.main(["precompile"]) == 2
    out, err = capsys.readouterr()
    assert "no CUDA GPU was found" in err and "--arch sm_90" in err and "--nccl" in err, err
    assert "Traceback" not in err and "CudaSupportError" not in err


def test_info_names_versions_builds_cft_gin_and_the_cache(monkeypatch, tmp_path, capsys):
    cache = tmp_path / "cache"
    (cache / "kernels").mkdir(parents=True)
    (cache / "kernels" / "a.cubin").write_bytes(b"\0" * 3 * 2**20)
    prebuilt = next(iter(manifest()["abis"]))  # a first-use build of a release that has a prebuilt one: unused
    (cache / "support" / f"nccl-{prebuilt}").mkdir(parents=True)
    (cache / "support" / f"nccl-{prebuilt}" / "sm_90.ltoir").write_bytes(b"\0")
    (cache / "support" / "nccl-2.99.1").mkdir(parents=True)
    (cache / "support" / "nccl-2.99.1" / "sm_90.ltoir").write_bytes(b"\0")
    monkeypatch.setenv("FLOWDSL_CACHE_DIR", str(cache))
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    for label in ("flowdsl:", "NCCL:", "CUDA driver:", "CUDA runtime:", "nvJitLink:", "nvcc:", "GPU:", "CFT:",
                  "GIN backend:", "kernel cache:", "support builds:"):
        assert f"\n{label}" in f"\n{out}", f"{label} missing from:\n{out}"
    assert f"{cache} (3.0 MiB in 3 files;" in " ".join(out.split()), out
    for version, entry in manifest()["abis"].items():
        assert f"NCCL {version}: {', '.join(sorted(entry['builds'], key=lambda a: int(a[3:])))}" in out, out
    for version, entry in manifest()["cft"]["abis"].items():
        assert f"CFT: {', '.join(sorted(entry['builds']))}" in out, out
    if not cli._gpus():
        assert "GIN backend:  not knowable without a GPU" in out, out
    flat = " ".join(out.split())
    assert f"also in the cache, not used (the prebuilt {prebuilt} builds above are): {cache}/support/nccl-{prebuilt}/" \
        f"sm_90.ltoir" in flat and f"NCCL 2.99.1: sm_90, built at first use: {cache}/support/nccl-2.99.1/" \
        "sm_90.ltoir" in flat, out


def test_help_is_plain_text_and_says_what_the_options_mean(capsys):
    for argv in (["--help"], ["demo", "--help"], ["info", "--help"], ["precompile", "--help"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        text = capsys.readouterr().out
        assert "``" not in text and ":func:" not in text and ":mod:" not in text, text
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--tokens TOKENS tokens per rank" in text and "--seed SEED seed of the random inputs" in text, text


@pytest.mark.sim
def test_demo_on_the_simulator_says_ranks_and_tokens_per_rank(capsys):
    assert cli.main(["demo", "--sim", "--ranks", "2", "--tokens", "2", "--hidden", "64"]) == 0
    out = capsys.readouterr().out
    assert "2 rank(s) on the CPU simulator (--sim), 2 tokens per rank (4 in all) x 64 hidden" in out, out
    assert "->  OK" in out, out


@pytest.mark.sim
def test_demo_in_bfloat16_says_its_element_type_and_checks_within_its_rounding(capsys):
    assert cli.main(["demo", "--sim", "--ranks", "2", "--tokens", "2", "--hidden", "64", "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "x 64 hidden (bfloat16)" in out and "->  OK" in out, out


@pytest.mark.sim
def test_allgather_example_says_what_it_did(capsys):
    from flowdsl.examples import allgather_lsa

    assert allgather_lsa.main(["--sim", "--ranks", "3", "--count", "64"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("allgather_lsa: 3 rank(s) on the CPU simulator (1 node, --sim): each rank wrote its 64 "
                          "float32 "
                          "values into every LSA rank's window; every rank's window holds all 192"), out
    assert out.rstrip().endswith(": OK"), out


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_draws_on_a_terminal_only():
    from flowdsl._progress import ProgressBar

    term = _Terminal()
    bar = ProgressBar(4, "work", stream=term)
    bar.update(0)
    bar.update(2, "half")
    bar.close()
    lines = term.getvalue().split("\r")
    assert "work [" + "." * 30 + "] 0/4" in lines[1] and "ETA ?" in lines[1], lines
    assert "work [" + "#" * 15 + "." * 15 + "] 2/4" in lines[2] and "ETA 0:" in lines[2] and "half" in lines[2]
    assert term.getvalue().endswith("\n")
    piped = io.StringIO()
    quiet = ProgressBar(4, "work", stream=piped)
    quiet.update(2)
    quiet.close()
    assert piped.getvalue() == ""


@pytest.mark.sim
def test_run_seeds_shows_its_progress_on_a_terminal(monkeypatch, capsys):
    from flowdsl.examples import allgather_lsa
    from flowdsl.testing import run_seeds

    def small(comm):
        return allgather_lsa.run(comm, count=32, blocks=1)

    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    results = run_seeds(small, nranks=2, seeds=range(3))
    assert sorted(results) == [0, 1, 2]
    for per_rank in results.values():
        for result, ref in per_rank:
            np.testing.assert_array_equal(result, ref)
    drawn = term.getvalue()
    assert "run_seeds small x2 ranks [" in drawn and "3/3" in drawn and "seed 2" in drawn, drawn
    monkeypatch.undo()
    run_seeds(small, nranks=2, seeds=range(1))  # stderr captured by pytest: not a terminal
    assert capsys.readouterr().err == ""


def test_flow_kernel_is_flowdsl_kernel():
    from flowdsl import flow

    assert flow.kernel is flowdsl.kernel and flow.device is flowdsl.device


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"flowdsl {flowdsl.__version__}"


@pytest.mark.parametrize("argv, message", [
    (["precompile", "--ops", "bogus"],  # reported before whether this machine has a GPU
     "flowdsl precompile: error: unknown op(s) bogus for --ops: choose from sum, prod, min, max, avg, premulsum"),
    (["precompile", "--arch", "sm_90", "--ops", "bogus"],
     "flowdsl precompile: error: unknown op(s) bogus for --ops: choose from sum, prod, min, max, avg, premulsum"),
    (["precompile", "--arch", "sm_90", "--dtypes", "float32", "bogus"],
     "flowdsl precompile: error: unknown dtype(s) bogus for --dtypes: choose from int8, uint8, int32, uint32"),
    (["precompile", "--arch", "sm_75", "--nccl", "2.28.9", "--dtypes", "float32", "--ops", "sum"],
     "flowdsl precompile: error: Cannot precompile the collectives for sm_75: flowdsl's kernels need sm_80 or "
     "newer"),
    (["precompile", "--arch", "sm_90", "--nccl", "2.32", "--dtypes", "float32", "--ops", "sum"],
     "flowdsl precompile: error: Cannot read the NCCL release '2.32': give it as major.minor.patch, e.g. 2.28.9"),
    (["precompile", "--arch", "90", "--nccl", "2.28.9", "--dtypes", "float32", "--ops", "sum"],
     "flowdsl precompile: error: Cannot precompile the collectives for arch '90': name the GPU architecture as sm_"),
    (["precompile", "--arch", "SM_90", "--nccl", "2.28.9", "--dtypes", "float32", "--ops", "sum"],
     "flowdsl precompile: error: Cannot precompile the collectives for arch 'SM_90': name the GPU architecture"),
])
def test_bad_arguments_are_one_line_with_the_choices(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("argv", [["demo", "--ranks", "0"], ["precompile", "--jobs", "0"]])
def test_counts_below_one_are_refused_by_the_parser(argv, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2 and "must be 1 or more, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("argv, usage", [
    (["precompile", "--bogus"], "usage: flowdsl precompile"),
    (["demo", "--bogus"], "usage: flowdsl demo"),
    (["--ranks", "0"], "usage: flowdsl demo"),  # options before any verb are the default verb's
])
def test_a_verbs_bad_option_is_reported_with_that_verbs_usage(argv, usage, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.startswith(usage) and "VERB" not in err, err


def test_an_unknown_option_without_a_verb_says_that_demo_is_the_default(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--bogus"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.splitlines()[-1] == (
        "flowdsl: error: unrecognized arguments: --bogus (without a verb, flowdsl runs demo, whose options "
        "'flowdsl demo --help' lists)"), err


def test_help_lists_each_verb_once(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    assert [text.count(f"  {verb}  ") for verb in ("demo", "info", "precompile")] == [1, 1, 1], text


def test_ctrl_c_stops_precompile_and_its_workers_at_once(tmp_path):
    """Ctrl-C reaches the whole process group, as a terminal sends it: the command ends within 5 s with
    one line and no traceback, and no worker is left compiling (they had finished the whole queue)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = dict(os.environ, FLOWDSL_CACHE_DIR=str(tmp_path / "cache"))
    # As a terminal's foreground command: Ctrl-C not ignored, even when these tests run as a background job (a
    # shell starts those with SIGINT ignored, and an ignored signal stays ignored in every process started below).
    proc = subprocess.Popen([sys.executable, "-m", "flowdsl", "precompile", "--arch", "sm_90", "--nccl", "2.28.9",
                             "--dtypes", "float32", "bfloat16", "--jobs", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while time.time() < deadline and not any((tmp_path / "cache").rglob("*")):  # the workers have started
        time.sleep(0.2)
    time.sleep(2)
    sent = time.time()
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert time.time() - sent < 5 and proc.returncode == 130, (proc.returncode, err[-2000:])
    assert err.strip().splitlines()[-1] == ("flowdsl precompile: interrupted; the kernels compiled so far stay in "
                                            "the cache") and "Traceback" not in err, err[-2000:]
    for _ in range(50):  # the workers (and multiprocessing's resource tracker) are gone too
        left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
        if not left:
            break
        time.sleep(0.1)
    assert left == [], f"processes of the group still running: {left}"


def test_the_notebook_runner_leaves_the_notebooks_alone_unless_asked(tmp_path, monkeypatch):
    """By default the executed notebooks go to ./executed-notebooks; --in-place rewrites them (to commit)."""
    import runpy
    import shutil
    from pathlib import Path

    pytest.importorskip("nbformat", reason="nbformat is not installed (pip install -e '.[notebooks]')")
    root = Path(__file__).resolve().parents[2]
    runner = runpy.run_path(str(root / "scripts" / "run_notebooks.py"))
    ran = []
    runner["main"].__globals__["execute"] = lambda notebook, folder, timeout, env=None: ran.append(folder)
    original = next((root / "notebooks").glob("*.ipynb"))
    copy = tmp_path / original.name
    shutil.copy(original, copy)
    before = copy.read_bytes()
    monkeypatch.chdir(tmp_path)
    assert runner["main"]([str(copy)]) == 0
    assert copy.read_bytes() == before and (tmp_path / "executed-notebooks" / original.name).exists()
    assert runner["main"]([str(copy), "--in-place"]) == 0 and len(ran) == 2


def test_an_examples_bad_arguments_are_one_line_not_a_traceback(capsys):
    """Every example's command line refuses counts below one in the parser, and a refusal of flowdsl's (ranks
    that do not split over the nodes) in one line with status 2."""
    from flowdsl.examples import _cli, allgather_lsa

    for argv, said in ((["--ranks", "0"], "argument --ranks: must be 1 or more, got 0"),
                       (["--count", "-5"], "argument --count: must be 1 or more, got -5")):
        with pytest.raises(SystemExit) as done:
            allgather_lsa.main(argv)
        assert done.value.code == 2 and said in capsys.readouterr().err
    assert _cli.main("allreduce_lsa", lambda comm: None, "x", argv=["--ranks", "3", "--nodes", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m flowdsl.examples.allreduce_lsa: error: Cannot spawn 3 ranks on 2 nodes") and \
        "Traceback" not in err, err


def test_info_says_when_the_loaded_nccl_has_no_prebuilt_build(monkeypatch, tmp_path):
    (tmp_path / "support" / "nccl-2.99.1").mkdir(parents=True)
    (tmp_path / "support" / "nccl-2.99.1" / "sm_90.ltoir").write_bytes(b"\0")
    monkeypatch.setenv("FLOWDSL_CACHE_DIR", str(tmp_path))
    text = " ".join(cli._support_lines((2, 99, 1)))
    assert "the loaded NCCL 2.99.1 has no prebuilt build: built here at first use for sm_90" in text, text
    text = " ".join(cli._support_lines((2, 99, 2)))
    assert "the loaded NCCL 2.99.2 has no prebuilt build: one is built at its first kernel" in text and \
        "or install nvidia-nccl-cu13==" in text, text
