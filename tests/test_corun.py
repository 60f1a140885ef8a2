"""The co-run probe (tracekit.capture.corun) against a cause we plant: two ranks of a real gloo
job pinned to one CPU take turns on it whenever both compute, so each runs at about half speed
beside the other; a one-rank job has nothing to run beside."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import torchrun

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def _probe(tmp_path: Path, nproc: int, placement: str) -> list[dict | None]:
    torchrun(REPO / "tests" / "corun_job.py", tmp_path, placement, nproc=nproc, timeout=300)
    return [json.loads((tmp_path / f"corun{r}.json").read_text()) for r in range(nproc)]


def test_ranks_sharing_one_cpu_compute_about_half_as_fast_beside_each_other(
    tmp_path: Path,
) -> None:
    for fig in _probe(tmp_path, 2, "shared"):
        assert fig is not None and fig["ranks"] == 2
        # one CPU between two busy ranks: about 2x (measured 1.64-2.17: the ranks' windows start
        # apart by their barrier exits); ranks on their own CPUs of an idle machine: 0.94-1.06
        assert 1.4 <= fig["slowdown"] <= 2.6, fig
        assert fig["together_s"] > 1.3 * fig["alone_s"], fig


def test_one_rank_has_no_corun_figure(tmp_path: Path) -> None:
    assert _probe(tmp_path, 1, "own") == [None]
