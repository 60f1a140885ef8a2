"""Every byte figure of one run says what it counts, and the views agree with each other.

On sample_traces/hsdp (gloo, 2 x 2 mesh: shard groups {0,1} {2,3}, replicate groups {0,2}
{1,3}) each figure is recomputed here from the collectives frame (collectives.parquet, one row
per rank per call) with its documented definition, not with tracekit's own code:

    collectives per_op bytes / rank_bytes   S summed over every rank's rows
    collectives per_op call_bytes           S summed over distinct calls (one member's view)
    collectives per_group bytes             S summed over the group's calls
    traffic by_op payload_bytes             S summed over calls
    traffic by_op bytes (wire)              S x algorithm factor summed over calls: gloo ring
                                            all_reduce 2(n-1), all_gather (n-1),
                                            reduce_scatter (a full all_reduce) 2(n-1)
    compare "payload bytes (Σ ranks)"       = collectives bytes
"""

from __future__ import annotations

import json

import polars as pl
import pytest
from builders.summary import complete
from conftest import HTA, SAMPLES, run_cli

from tracekit.analyses.group_names import group_label, ranks_text, row_label
from tracekit.analysis import analyze
from tracekit.report import compare_table
from tracekit.summary import to_struct

WIRE_FACTOR = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 2}  # x (n-1), gloo


@pytest.fixture(scope="module")
def hsdp(tmp_path_factory):
    out = tmp_path_factory.mktemp("hsdp")
    done = run_cli("analyze", str(SAMPLES / "hsdp"), "--no-cache", "--out", str(out))
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    frame = pl.read_parquet(out / "collectives.parquet")
    return summary, frame, out


def _calls(frame: pl.DataFrame) -> pl.DataFrame:
    """One row per call: its op, S, and group size, straight from the per-rank rows."""
    assert frame["call_id"].null_count() == 0
    per_call = frame.group_by("call_id").agg(
        pl.col("op").first(),
        pl.col("bytes").first(),
        pl.col("bytes").n_unique().alias("sizes"),
        pl.col("rank").n_unique().alias("n"),
        pl.col("group").first(),
    )
    assert per_call["sizes"].max() == 1  # every member agrees on S
    return per_call


def test_collectives_rank_and_call_bytes(hsdp):
    summary, frame, _ = hsdp
    co = summary["collectives"]
    calls = _calls(frame)
    rank_sum = frame.group_by("op").agg(pl.col("bytes").sum()).rows()
    call_sum = calls.group_by("op").agg(pl.col("bytes").sum()).rows()
    per_op = {r["op"]: r for r in co["per_op"]}
    assert {op: per_op[op]["bytes"] for op, _ in rank_sum} == dict(rank_sum)
    assert {op: per_op[op]["rank_bytes"] for op, _ in rank_sum} == dict(rank_sum)
    assert {op: per_op[op]["call_bytes"] for op, _ in call_sum} == dict(call_sum)
    assert co["bytes"] == co["rank_bytes"] == int(frame["bytes"].sum())
    assert co["call_bytes"] == int(calls["bytes"].sum())
    # every hsdp group has 2 ranks: the per-rank sum is twice the per-call sum, op by op
    for op, row in per_op.items():
        assert row["rank_bytes"] == 2 * row["call_bytes"], op
    # per_group rows count per call: summed over a dimension's groups they give per_op's call_bytes
    for op, row in per_op.items():
        groups = [g for g in co["per_group"] if g["op"] == op]
        assert sum(g["bytes"] for g in groups) == row["call_bytes"], op
        assert sum(g["call_bytes"] for g in groups) == row["call_bytes"], op
        assert sum(g["rank_bytes"] for g in groups) == row["rank_bytes"], op
    assert set(co["bytes_counted"]) >= {"bytes", "rank_bytes", "call_bytes", "wire_bytes"}


def test_traffic_wire_bytes_are_payload_times_the_algorithm_factor(hsdp):
    summary, frame, _ = hsdp
    tr = summary["traffic"]
    calls = _calls(frame).with_columns(
        (
            pl.col("bytes")
            * pl.col("op").replace_strict(WIRE_FACTOR, return_dtype=pl.Int64)
            * (pl.col("n") - 1)
        ).alias("wire")
    )
    expect = {
        r["op"]: (r["payload"], r["wire"])
        for r in calls.group_by("op")
        .agg(pl.col("bytes").sum().alias("payload"), pl.col("wire").sum())
        .to_dicts()
    }
    got = {r["op"]: (r["payload_bytes"], r["bytes"]) for r in tr["by_op"]}
    assert got == expect
    # hsdp's numbers, as the issue notes quote them: the three views of all_gather
    ag = {r["op"]: r for r in summary["collectives"]["per_op"]}["all_gather"]
    assert (got["all_gather"][1], ag["rank_bytes"], ag["call_bytes"]) == (
        expect["all_gather"][1],
        int(frame.filter(pl.col("op") == "all_gather")["bytes"].sum()),
        expect["all_gather"][0],
    )
    assert tr["total_bytes"] == sum(w for _, w in expect.values())
    # per step: the window's totals over its complete steps
    assert tr["per_step"]["total_bytes"] == tr["total_bytes"] / tr["per_step"]["steps"]
    # reduce_scatter: gloo all-reduces the full input, twice the nominal ring volume
    assert got["reduce_scatter"][1] == 2 * got["reduce_scatter"][0]


def test_volume_per_rank_wire_sums_to_traffic(hsdp):
    """volume's per-rank wire bytes (busiest rank) x ranks = traffic's total on the links,
    when (as on hsdp) every rank sends the same."""
    summary, _, _ = hsdp
    vol, tr = summary["volume"], summary["traffic"]
    ranks = len(summary["ranks"])
    assert vol["wire_bytes_per_rank_per_step"] * ranks * vol["steps"] == pytest.approx(
        tr["total_bytes"]
    )


def test_compare_shows_the_documented_number(hsdp):
    summary, _, out = hsdp
    typed = to_struct(summary)
    title, head, rows = compare_table([("hsdp", typed), ("again", typed)])
    col = head.index("payload bytes (Σ ranks)")
    mb = summary["collectives"]["rank_bytes"] / 1e6
    assert rows[0][col] == f"{mb:.2f} MB"
    wire = head.index("wire bytes (all links)")
    assert rows[0][wire] == f"{summary['traffic']['total_bytes'] / 1e6:.2f} MB"


def test_groups_are_named_by_dimension_and_ranks(hsdp):
    summary, _, _ = hsdp
    labels = {g["label"] for g in summary["collectives"]["per_group"]}
    assert labels == {"shard {0,1}", "shard {2,3}", "replicate {0,2}", "replicate {1,3}"}
    assert {g["label"] for g in summary["traffic"]["by_group"]} == labels
    assert all(
        row_label({k: v for k, v in g.items() if k != "label"}) == g["label"]
        for g in summary["collectives"]["per_group"]
    )
    assert group_label("p2p 0->1") == "p2p 0->1"
    assert group_label("0", "default_pg", None, [0, 1]) == "default_pg {0,1}"
    assert group_label("7", None, None, None) == "group 7"
    assert ranks_text([7, 0, 1, 2, 3, 5]) == "{0-3,5,7}"


@pytest.mark.corpus
def test_unknown_sizes_are_null_not_zero(tmp_path):
    """A trace whose collectives carry no size (HTA's df_index_resolver has none): every
    byte and bandwidth figure is null, shown as "–"."""
    from tracekit.report import collectives_table

    trace = HTA / "df_index_resolver"
    a = analyze(trace)
    co = a.summary.collectives
    assert co.per_op and all(r.unknown_size == r.count for r in co.per_op)
    for r in co.per_op:
        for k in ("bytes", "rank_bytes", "call_bytes", "wire_bytes", "algbw_gbps", "busbw_gbps"):
            assert getattr(r, k) is None, k
    assert co.bytes is None and co.ideal_bytes_per_rank is None
    vol = a.summary.volume
    if vol:
        assert vol.ideal_bytes_per_rank_per_step is None
    _, _, rows = collectives_table(a.summary)
    assert rows[0][2] == "–" and rows[0][-1] == "–" and rows[0][-2] == "–"


def test_unknown_sizes_are_null_on_a_hand_built_table():
    """The same without HTA's file: a matched-less table of all_reduce rows with no size."""
    from tracekit.analyses.collectives_section import collectives_summary
    from tracekit.analyses.volume import volume_summary
    from tracekit.report import collectives_table

    n = 4
    table = pl.DataFrame(
        {
            "rank": [0, 1, 0, 1],
            "op": ["all_reduce"] * n,
            "bytes": [None] * n,
            "wire_op": ["all_reduce"] * n,
            "wire_bytes": [None] * n,
            "group_size": [2] * n,
            "duration_s": [0.001, 0.002, 0.001, 0.002],
            "bus_factor": [1.0] * n,
        },
        schema_overrides={"bytes": pl.Int64, "wire_bytes": pl.Int64, "group_size": pl.Int32},
    )
    co = collectives_summary(table)
    (row,) = co["per_op"]
    assert row["unknown_size"] == n and row["time_s"] == pytest.approx(0.006)
    for k in ("bytes", "call_bytes", "wire_bytes", "algbw_gbps", "busbw_gbps"):
        assert row[k] is None, k
    assert co["bytes"] is None and co["call_bytes"] is None and co["ideal_bytes_per_rank"] is None
    vol = volume_summary(table, 2)
    assert (
        vol is not None and vol.ideal_bytes_per_rank_per_step is None and vol.wire_to_ideal is None
    )
    _, _, rows = collectives_table(to_struct(complete({"collectives": co})))
    assert rows[0][2:4] == ["–", "–"] and rows[0][-2:] == ["–", "–"]
    # one known size among unknown ones: the known sum, and the count of unknown ones
    part = collectives_summary(table.with_columns(bytes=pl.Series([1000, None, None, None])))
    assert part["per_op"][0]["bytes"] == 1000 and part["per_op"][0]["unknown_size"] == 3


def test_point_to_point_counts_each_transfer_once(tmp_path):
    """pp-1f1b: a send and its recv are one transfer (one call_id): per op each counts once,
    the total once, and the wire carries S on the one link."""
    done = run_cli("analyze", str(SAMPLES / "pp-1f1b"), "--no-cache", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    frame = pl.read_parquet(tmp_path / "collectives.parquet")
    per_op = {r["op"]: r for r in summary["collectives"]["per_op"]}
    sends = frame.filter(pl.col("op") == "send")
    transfers = frame.filter(pl.col("op").is_in(["send", "recv"])).unique("call_id")
    assert per_op["send"]["call_bytes"] == int(sends["bytes"].sum())
    assert per_op["recv"]["call_bytes"] == int(transfers["bytes"].sum())
    by_op = {r["op"]: r for r in summary["traffic"]["by_op"]}
    assert by_op["send"]["bytes"] == by_op["send"]["payload_bytes"] == int(transfers["bytes"].sum())
    assert summary["collectives"]["call_bytes"] == int(frame.unique("call_id")["bytes"].sum())
