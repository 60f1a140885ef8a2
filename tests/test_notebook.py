"""docs/notebook.md runs as written: its code blocks, executed in order in one namespace (as the
cells of a notebook), from a folder that sees the repository's sample_traces/, give what the text
says; and an Analysis displays in Jupyter (``_repr_html_``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import pytest
from conftest import ROOT, SAMPLES

from tracekit.summary import Summary

DOC = ROOT / "docs" / "notebook.md"


def blocks(text: str) -> list[str]:
    """The ```python blocks of a Markdown text, in order."""
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


@pytest.fixture(scope="module")
def notebook(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """Every block of docs/notebook.md run in order, in a folder of its own whose
    sample_traces/ is the repository's (outputs land beside it, never inside it)."""
    here = tmp_path_factory.mktemp("notebook")
    (here / "sample_traces").symlink_to(SAMPLES, target_is_directory=True)
    ns: dict[str, Any] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(here)
        for i, code in enumerate(blocks(DOC.read_text())):
            exec(compile(code, f"{DOC}:block{i}", "exec"), ns)  # noqa: S102 - the doc's own code
    return ns, here


def test_the_doc_has_its_blocks() -> None:
    assert len(blocks(DOC.read_text())) >= 5


def test_the_summary_is_typed_and_as_json(notebook) -> None:
    ns, _ = notebook
    a = ns["analysis"]
    assert isinstance(a.summary, Summary)
    assert ns["bubble"][:3] == ("1f1b", 4, 4) and 0 < ns["bubble"][3] < 1
    assert ns["no_overlap"] is None and ns["slowest"].step_time_s > 0
    assert '"schedule": "1f1b"' in ns["as_json"]


def test_frames_and_figures(notebook) -> None:
    ns, _ = notebook
    assert ns["ops"].height > 0 and ns["per_rank"].height == 4
    assert set(ns["busy"]["state"]) >= {"compute", "idle"}
    assert isinstance(ns["fig"], go.Figure) and ns["fig"].data
    assert ns["names"][:3] == ["breakdown", "timeline", "pipeline"]
    assert ns["analysis"].figure("overlap") is None  # no all-gathers in a pipeline run
    with pytest.raises(KeyError, match="no figure 'pipelines'"):
        ns["analysis"].figure("pipelines")


def test_report_prediction_and_comparison(notebook) -> None:
    ns, here = notebook
    assert ns["written"] == Path("pp-1f1b-report.html")
    page = (here / "pp-1f1b-report.html").read_text()
    assert ">pipeline</h3>" in page and "Plotly.newPlot(" in page
    assert ns["step_s"] > 0
    md = (here / "gpipe-vs-1f1b.md").read_text()
    assert "## comparison" in md and "pp-gpipe" in md and "pp-1f1b" in md
    assert not list(SAMPLES.glob("*/analysis/prediction.json.*"))  # nothing written into inputs


def test_jupyter_shows_the_compact_summary(notebook) -> None:
    """What Jupyter displays for the cell ending in ``analysis``: the run, the per-rank table, a
    headline per section and the figures' names; a trace's text is escaped."""
    ns, _ = notebook
    html = ns["analysis"]._repr_html_()
    assert "strategy pp-1f1b" in html and "<table>" in html
    assert "pipeline (1f1b, p=4, m=4): bubble" in html
    assert "analysis.figure(name)" in html and "pipeline_stages" in html
    assert "<script" not in html
