"""Every real trace reads right: tracekit's idle and compute per rank against HTA's definitions
recomputed from the JSON (tests/corpus_reference.py, plain Python, none of tracekit's code), on
every case of the public corpus (tests/corpus_table.py: each Kineto trace alone, each job folder
and each folder with an execution trace as the folder), and docs/corpus.md's table is what
`python tests/corpus_table.py` writes.

The corpus is the folder TRACEKIT_CORPUS names (tests/builders/corpus_root.py); without it this module
skips, with one line saying how to get it. Its miniature schema variants, which run without the
corpus, are tests/test_schema_variants.py.

Within 0.5 points where the reference finds device events. Where it finds none (CPU-only
traces), tracekit's numbers are CPU-side by design: the test asserts that a trace showing a
device (runtime launches, deviceProperties) says so in a warning. Warnings never mention gloo
on a trace that has no gloo in it.
"""

from __future__ import annotations

import pytest
from builders import corpus_root

corpus_root.require()  # skips the whole module without the corpus

import corpus_table  # noqa: E402 - only with the corpus at hand
from corpus_table import Case, analysed, cases, kineto  # noqa: E402

pytestmark = pytest.mark.corpus
TOLERANCE = 0.5  # percentage points
CPU_ONLY = "numbers are CPU-side only"
CASES = cases(corpus_root.CORPUS)


def _has_gloo(trace: dict) -> bool:
    backend = str((trace.get("distributedInfo") or {}).get("backend") or "")
    return "gloo" in backend or any(
        str(e.get("name", "")).startswith("gloo:") for e in trace["traceEvents"]
    )


def test_every_file_of_the_manifest_is_a_case_or_not_a_trace():
    """56 cases over the 55 data files: nothing in the corpus is left out unseen."""
    covered = {f for c in CASES for f in c.files}
    data = sorted(p for p in corpus_root.CORPUS.rglob("*") if p.is_file() and ".json" in p.name)
    assert [p for p in data if p not in covered and kineto(p) is not None] == []
    assert len(CASES) >= 56, len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_idle_and_compute_match_hta_definitions(case: Case) -> None:
    result, rows = analysed(case)
    warnings = result.summary.warnings
    for row in rows:
        if row.delta is None:  # no device events: CPU rules, said so where a device shows
            if row.shows_device:
                assert any(w.startswith(f"{row.file}: ") and CPU_ONLY in w for w in warnings), (
                    f"{row.file}: device shown but no device events, and no warning says so"
                )
            continue
        assert row.delta <= TOLERANCE, (
            f"{row.file}: idle {row.idle:.2f} vs {row.ref_idle:.2f}, "
            f"compute {row.compute:.2f} vs {row.ref_compute:.2f}"
        )
    if not any(_has_gloo(kineto(f) or {"traceEvents": []}) for f in case.files):
        assert not [w for w in warnings if "gloo" in w], warnings


def test_docs_table_is_what_the_command_writes():
    """docs/corpus.md's parity table: regenerate with `python tests/corpus_table.py`."""
    docs = corpus_table.DOCS.read_text(encoding="utf-8")
    assert docs == corpus_table.with_table(docs, corpus_root.CORPUS), (
        "docs/corpus.md's table is stale: run TRACEKIT_CORPUS=... python tests/corpus_table.py"
    )
