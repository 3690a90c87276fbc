"""docs/support.md's matrix is the one scripts/gen_support_matrix.py renders from the extern table."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from flowdsl.lowering import externs
from flowdsl.runtime import support_build

pytestmark = pytest.mark.compile
ROOT = Path(__file__).resolve().parents[2]
GENERATOR = runpy.run_path(str(ROOT / "scripts" / "gen_support_matrix.py"))


@pytest.mark.parametrize("begin,end,render", [("BEGIN", "END", "render"),
                                              ("DTYPES_BEGIN", "DTYPES_END", "render_dtypes")])
def test_the_page_holds_the_rendered_matrix(begin, end, render):
    text = (ROOT / "docs" / "support.md").read_text()
    begin, end = GENERATOR[begin], GENERATOR[end]
    assert begin in text and end in text, f"docs/support.md lost its markers {begin!r} ... {end!r}"
    on_page = text[text.index(begin):text.index(end) + len(end)]
    assert on_page == GENERATOR[render](), "docs/support.md is stale: python scripts/gen_support_matrix.py"


def test_the_dtype_matrix_is_the_codes():
    """A row per collectives dtype, a column per operator; a pair the library lacks is marked missing."""
    from flowdsl.collectives import DTYPES, OPS

    rows = [line for line in GENERATOR["render_dtypes"]().splitlines() if line.startswith("| `")]
    assert [row.split(" | ")[0].strip("| `") for row in rows] == list(DTYPES)
    assert all(row.count(" | ") == 2 + len(OPS) for row in rows)
    assert GENERATOR["dtype_cell"]("int8", "sum", set(), set()).startswith("— (no ring reduce_scatter")
    assert "sm_90+" in GENERATOR["dtype_cell"]("float8_e5m2", "max", set(), set())


def test_every_extern_symbol_belongs_to_a_feature():
    prefixes = {prefix for feature in GENERATOR["FEATURES"] for prefix in feature.needs}
    orphans = [symbol for library in externs.LIBRARIES for symbol in externs.symbols(library=library)
               if not any(symbol.startswith(prefix) for prefix in prefixes)]
    assert not orphans, (f"{len(orphans)} support-library functions are in no row of the support matrix, e.g. "
                         f"{orphans[:5]}: add them to a feature's needs in scripts/gen_support_matrix.py")


def test_every_prefix_names_a_symbol():
    symbols = [s for library in externs.LIBRARIES for s in externs.symbols(library=library)]
    stale = sorted({prefix for feature in GENERATOR["FEATURES"] for prefix in feature.needs
                    if not any(s.startswith(prefix) for s in symbols)})
    assert not stale, f"scripts/gen_support_matrix.py needs symbols the extern table no longer has: {stale}"


def test_a_column_per_release_and_arch_with_a_build():
    header = GENERATOR["render"]().splitlines()[2]
    for release in support_build.SUPPORTED_VERSIONS:
        for arch in support_build.ARCHS:
            assert f"| {release} {arch} |" in header, (release, arch, header)


def test_availability_follows_the_table():
    """A feature of a newer release or another arch is marked missing where the extern table says so."""
    features = {feature.name: feature for feature in GENERATOR["FEATURES"]}
    cell = GENERATOR["cell"]
    get = features["GIN get"]
    since = ".".join(map(str, externs.by_name("flowdsl_gin_get").since))
    assert cell(get, "2.28.9", "sm_90") == f"— (needs NCCL {since})"
    assert cell(get, "2.32.3", "sm_90") == "linked"
    cft = next(feature for name, feature in features.items() if name.startswith("CFT"))
    assert cell(cft, "2.32.3", "sm_90") == "— (needs sm_100)"
    assert cell(cft, "2.32.3", "sm_100") == "linked"
