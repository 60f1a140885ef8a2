"""tracekit.summary is summary.json: every analysis converts to it strictly and encodes to the
very bytes analyze() writes today; anything else is refused; docs/metrics.md is generated from it.
"""

from __future__ import annotations

import copy
import functools
import json
import shutil
from pathlib import Path
from typing import Any

import msgspec
import pytest
from builders.corpus_root import HTA_FOLDERS
from conftest import HTA, ROOT, SAMPLES

from tracekit import theory
from tracekit.analysis import analyze
from tracekit.runfolder import is_run_folder
from tracekit.summary import Summary, encode, from_json, to_struct
from tracekit.summary.__main__ import main as summary_main
from tracekit.summary.base import field_docs
from tracekit.summary.markdown import render, struct_paths

GPU = ROOT / "tests" / "data" / "gpu"
NCCL_TUNING_LOG = ROOT / "tests" / "data" / "nccl" / "nccl_issue1453_tuning_truncated_channels.log"
RUNS = sorted(p for p in SAMPLES.iterdir() if is_run_folder(p)) if SAMPLES.is_dir() else []
FOREIGN = [pytest.param(HTA / f, marks=pytest.mark.corpus, id=f"hta/{f}") for f in HTA_FOLDERS]
FOREIGN += [pytest.param(p, id=f"gpu/{p.name}") for p in sorted(GPU.iterdir())]
# inputs whose summary holds a section the folders above leave null or short
VARIANTS = {
    "sampled": ("tp-dp", {"sample": 2}),  # sampling
    "clock-applied": ("hsdp", {"align_clocks": True}),  # clock offsets applied, no reason
    "ranks-subset": ("pp-1f1b", {"ranks": (1, 2)}),  # a pipeline without a replay
}


def written(summary: dict[str, Any]) -> str:
    """What write_analysis writes for a summary dict (tracekit/analysis_folder.py)."""
    return json.dumps(summary, indent=2, default=str) + "\n"


@functools.cache
def summary_of(path: Path, **kw: Any) -> dict[str, Any]:
    return analyze(path, **kw).summary_dict()


def assert_round_trip(summary: dict[str, Any]) -> Summary:
    text = written(summary)
    struct = to_struct(copy.deepcopy(summary))
    assert encode(struct) == text
    assert encode(from_json(text)) == text
    assert from_json(text.encode()) == struct
    return struct


@pytest.mark.parametrize("run", RUNS, ids=[p.name for p in RUNS])
def test_sample_runs_encode_to_the_bytes_analyze_writes(run):
    assert_round_trip(summary_of(run))


@pytest.mark.parametrize("path", FOREIGN)
def test_hta_and_gpu_traces_encode_to_the_bytes_analyze_writes(path):
    assert_round_trip(summary_of(path))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_sampled_aligned_and_subset_analyses_encode_alike(name):
    run, kw = VARIANTS[name]
    struct = assert_round_trip(summary_of(SAMPLES / run, **kw))
    if name == "sampled":
        assert struct.sampling is not None and struct.sampling.ranks == [0, 3]
    if name == "clock-applied":
        assert struct.clock is not None and struct.clock.applied and struct.clock.reason is None
    if name == "ranks-subset":
        assert struct.pipeline is not None and struct.pipeline.bubble_fraction_replay is None


def test_nccl_logs_with_tuning_lines_encode_alike(tmp_path):
    run = tmp_path / "dp"
    shutil.copytree(SAMPLES / "dp", run, ignore=shutil.ignore_patterns("analysis"))
    (run / "nccl").mkdir(exist_ok=True)
    shutil.copy(NCCL_TUNING_LOG, run / "nccl")
    struct = assert_round_trip(analyze(run).summary_dict())
    assert struct.nccl is not None and struct.nccl.logs is not None
    assert [(a.algo, a.proto, a.lines) for a in struct.nccl.logs.algorithms] == [
        ("TREE", "LL", 3),
        ("TREE", "LL128", 5),
    ]


@pytest.mark.corpus
def test_a_trace_without_collectives_has_every_collectives_key_in_order():
    summary = summary_of(HTA / "amd_trace")
    with_calls = summary_of(SAMPLES / "dp")
    assert list(summary["collectives"]) == list(with_calls["collectives"])
    struct = assert_round_trip(summary)
    c = struct.collectives
    assert (c.count, c.rank_bytes, c.call_bytes, c.per_op, c.per_group) == (0, 0, 0, [], [])


@pytest.fixture
def dp() -> dict[str, Any]:
    return copy.deepcopy(summary_of(SAMPLES / "dp"))


@pytest.mark.parametrize(
    "change, where",
    [
        (lambda s: s.update(extra=1), "extra"),
        (lambda s: s["ranks"][1].update(gpu_s=0.5), "gpu_s"),
        (lambda s: s["collectives"]["per_op"][0].update(latency_s=0.1), "latency_s"),
        (lambda s: s["memory"]["theory"].update(k=12), "k"),
        (lambda s: s["collectives"].update(extra=1), "extra"),
    ],
    ids=["top", "ranks", "per_op", "memory.theory", "collectives"],
)
def test_an_unknown_key_is_refused(dp, change, where):
    change(dp)
    with pytest.raises(msgspec.ValidationError, match=where):
        to_struct(dp)


@pytest.mark.parametrize(
    "change, where",
    [
        (lambda s: s["ranks"][0].update(compute_s="0.5"), r"\$\.ranks\[0\]\.compute_s"),
        (lambda s: s["ranks"][0].update(rank=0.0), r"\$\.ranks\[0\]\.rank"),
        (lambda s: s["ranks"][0].update(span_s=None), r"\$\.ranks\[0\]\.span_s"),
        (lambda s: s["topology"].update(nodes={"0": "node0"}), r"\$\.topology\.nodes"),
        (lambda s: s["window"].update(steps=True), r"\$\.window\.steps"),
        (lambda s: s.update(warnings="none"), r"\$\.warnings"),
        (lambda s: s["collectives"].pop("per_group"), "per_group"),
    ],
    ids=[
        "str-for-float",
        "float-for-int",
        "null",
        "dict-value",
        "bool-for-int",
        "str-for-list",
        "missing",
    ],
)
def test_a_wrong_type_or_a_missing_key_is_refused(dp, change, where):
    change(dp)
    with pytest.raises(msgspec.ValidationError, match=where):
        to_struct(dp)


def test_every_field_is_defined_once_with_a_unit_or_meaning():
    structs = struct_paths()
    assert Summary in structs and len(structs) > 20
    for cls in structs:
        for name, _, meta in field_docs(cls):
            assert len(meta.description or "") >= 5, f"{cls.__name__}.{name}"
            if name.endswith("_s"):
                assert "second" in (meta.description or ""), f"{cls.__name__}.{name}: unit"


def test_the_theory_functions_fields_name_exist():
    named = {
        (meta.extra or {})["theory"]
        for cls in struct_paths()
        for _, _, meta in field_docs(cls)
        if (meta.extra or {}).get("theory")
    }
    assert {"pipeline_bubble_fraction", "model_states_bytes"} <= named
    for name in named:
        assert callable(getattr(theory, name, None)), name


@pytest.mark.parametrize("run", ["pp-gpipe", "pp-1f1b", "pp-pipedream"])
def test_sample_pipelines_meet_the_closed_forms_their_fields_name(run):
    pipe = to_struct(summary_of(SAMPLES / run)).pipeline
    assert pipe is not None
    p, m = pipe.stages, pipe.microbatches
    for st in pipe.per_stage:
        assert st.max_inflight_microbatches == theory.inflight_microbatches(
            pipe.schedule or "", p, st.stage, m
        )
        if pipe.schedule == "pipedream":
            assert st.weight_versions == theory.pipedream_weight_versions(p, st.stage)
    if pipe.schedule == "pipedream":
        assert pipe.bubble_fraction_theory is None
    else:
        assert pipe.bubble_fraction_theory == pytest.approx((p - 1) / (m + p - 1))
        assert pipe.bubble_fraction_theory_megatron == pytest.approx((p - 1) / m)


def test_docs_metrics_md_is_generated_from_the_schema():
    doc = ROOT / "docs" / "metrics.md"
    text = doc.read_text()
    assert render(text) == text, "docs/metrics.md is stale: python -m tracekit.summary --markdown"
    for cls, path in struct_paths().items():
        assert f"**`{path}`** ({cls.__name__})" in text


def test_the_generator_fills_blocks_and_refuses_an_undocumented_struct(tmp_path):
    doc = tmp_path / "metrics.md"
    text = (ROOT / "docs" / "metrics.md").read_text()
    # a block emptied by hand is refilled; --check says so first
    block = text.index("<!-- generated from tracekit/summary: Run Sampling -->")
    end = text.index("<!-- end generated -->", block)
    head = "<!-- generated from tracekit/summary: Run Sampling -->\n"
    doc.write_text(text[:block] + head + text[end:])
    assert summary_main(["--markdown", "--check", str(doc)]) == 1
    assert summary_main(["--markdown", str(doc)]) == 0
    assert doc.read_text() == text  # the committed doc is current (test above)
    # a Struct in no block is an error, and so is a name the summary does not have
    with pytest.raises(ValueError, match="Sampling"):
        render(text.replace(" Run Sampling -->", " Run -->"))
    with pytest.raises(ValueError, match="Nothing"):
        render(text.replace(" Run Sampling -->", " Run Sampling Nothing -->"))
