"""summary.json ``traffic`` and ``nccl``: every matched call's bytes on rank -> rank links.

One row per call (not per rank: the k-th call of a group is one call, matched across its
ranks by tracekit.analyses.matching) goes through tracekit.analyses.traffic's link model with
the algorithm its backend really runs: gloo's ring all_reduce / all_gather, reduce_scatter as a
full all_reduce, binomial broadcast, all_to_all pairs; NCCL's algorithm from the kernel name
(``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` -> RING; TREE for all_reduce; NVLS, COLLNET and PAT
are modelled as the ring, with a warning) and, for calls over the whole world, ring 0's order
from the run's NCCL logs (<run>/nccl/*.log, read by tracekit.ingest.load) when present; p2p on its one link. Links are
intra-node when both ends share a node (tracekit.ingest.topology).

Added to traffic_summary's keys: ``by_group`` per (group, op) named by process group with its
ranks and parallel dimension, ``by_dim`` (bytes per parallel dimension, when run.json names the
dims), ``per_step`` (totals divided by the window's complete steps), ``calls``; frame
``traffic_links`` (src, dst, bytes, intra, src_node, dst_node) summed over calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
import polars as pl

from tracekit.analyses import matching
from tracekit.analyses.group_names import group_label
from tracekit.analyses.section import SectionInput, SectionResult
from tracekit.analyses.traffic import link_bytes, traffic_summary
from tracekit.summary.collectives import Matching
from tracekit.summary.nccl import Nccl
from tracekit.summary.traffic import Traffic

if TYPE_CHECKING:
    from tracekit.events import DType

# What each byte figure of summary.json ``traffic`` counts (docs/traffic.md).
TRAFFIC_BYTES_COUNTED = {
    "bytes": "bytes on the wire: what the call's algorithm puts on every directed rank -> rank "
    "link, summed over all links and calls of the window (intra + inter + unclassified)",
    "intra/inter": "the same, on links inside one node / between nodes",
    "payload_bytes": "payload S per call summed over calls (one member's view, as collectives "
    "per_group call_bytes); bytes = payload_bytes x the algorithm's factor (ring all_reduce "
    "2(n-1), all_gather (n-1), gloo reduce_scatter 2(n-1), ...)",
    "per_step": "the window's totals divided by its complete steps",
}

LINKS_SCHEMA = {
    "src": pl.Int64,
    "dst": pl.Int64,
    "bytes": pl.Int64,
    "intra": pl.Boolean,
    "src_node": pl.Int64,
    "dst_node": pl.Int64,
}
MODEL_SCHEMA: dict[str, DType] = {
    "op": pl.Utf8,
    "bytes": pl.Int64,
    "ranks": pl.List(pl.Int64),
    "backend": pl.Utf8,
    "algorithm": pl.Utf8,
    "root": pl.Int64,
    "src": pl.Int64,
    "dst": pl.Int64,
    "ring": pl.List(pl.Int64),
    "group": pl.Utf8,
    "group_desc": pl.Utf8,
    "dim": pl.Utf8,
}


def _world_size(inp: SectionInput) -> int:
    run_ws = (inp.run.world_size if inp.run is not None else None) or 0
    infos_ws = max((int(i.world_size or 0) for i in inp.infos), default=0)
    ranks = max((int(i.rank) for i in inp.infos), default=0) + 1
    return max(run_ws, infos_ws, ranks)


def model_calls(
    calls: pl.DataFrame, backend: str, ring: list[int] | None
) -> tuple[pl.DataFrame, list[str]]:
    """calls_frame rows -> traffic.link_bytes input (one row per call)."""
    warnings: list[str] = []
    rows, no_group, other_algo = [], 0, set()
    for c in calls.to_dicts():
        p2p = c["op"] in matching.P2P
        if not p2p and not c["ranks"]:
            no_group += 1
            continue
        be = "nccl" if c["device"] == "gpu" else backend
        algo = (c["algorithm"] or "RING").upper()
        if algo not in ("RING", "TREE"):
            other_algo.add(algo)
            algo = "RING"
        ranks = c["ranks"] if not p2p else None
        rows.append(
            {
                "op": c["op"],
                "bytes": c["bytes"],
                "ranks": ranks,
                "backend": be,
                "algorithm": algo.lower(),
                "root": None,
                "src": c["src"] if p2p else None,
                "dst": c["dst"] if p2p else None,
                "ring": ring
                if (be == "nccl" and ring and ranks and sorted(ring) == ranks)
                else None,
                "group": f"p2p {c['src']}->{c['dst']}" if p2p else c["group"],
                "group_desc": c["group_desc"],
                "dim": c["dim"],
            }
        )
    if no_group:
        warnings.append(
            f"traffic: {no_group} calls have no known process group members: their bytes are not on the links"
        )
    if other_algo:
        warnings.append(f"traffic: NCCL algorithms {sorted(other_algo)} are modelled as the ring")
    return pl.DataFrame(rows, schema=MODEL_SCHEMA), warnings


def _by(links: pl.DataFrame, keys: list[str]) -> list[dict[str, Any]]:
    out = links.group_by(keys, maintain_order=True).agg(
        pl.col("bytes").filter(pl.col("link") == "intra").sum().alias("intra"),
        pl.col("bytes").filter(pl.col("link") == "inter").sum().alias("inter"),
        pl.col("bytes").sum().alias("bytes"),
    )
    out = out.sort(["bytes", *keys], descending=[True] + [False] * len(keys), nulls_last=True)
    return [
        {
            **{k: r[k] for k in keys},
            "intra": round(r["intra"]),
            "inter": round(r["inter"]),
            "bytes": round(r["bytes"]),
        }
        for r in out.to_dicts()
    ]


def traffic(inp: SectionInput) -> SectionResult[Traffic]:
    """The ``traffic`` section builder (see the module docstring)."""
    table = inp.collectives
    if table.height == 0 or "call_id" not in table.columns:
        return SectionResult()
    # CPU rows are gloo spans whatever the run says; GPU rows are NCCL kernels (model_calls)
    backend = "gloo"
    ring = None
    if inp.job.nccl is not None:  # ring 0 of the communicator of the whole world
        ring = inp.job.nccl.ring_of(_world_size(inp))
    calls, warnings = model_calls(matching.calls_frame(table), backend, ring)
    if calls.height == 0:
        return SectionResult(None, {}, warnings)
    world = _world_size(inp)
    nodes = dict(inp.nodes)
    summary = traffic_summary(
        calls.drop("group", "group_desc", "dim"), nodes, world, [int(i.rank) for i in inp.infos]
    )
    warnings += summary.pop("warnings", [])

    node = pl.DataFrame(
        {"rank": list(nodes), "node": list(nodes.values())},
        schema={"rank": pl.Int64, "node": pl.Int64},
    )
    meta = calls.with_row_index("call_index").select(
        pl.col("call_index").cast(pl.Int64),
        "op",
        "group",
        "group_desc",
        "dim",
        pl.coalesce("ranks", pl.concat_list("src", "dst")).alias("group_ranks"),
    )
    links = (
        link_bytes(calls.drop("group", "group_desc", "dim"), nodes)
        .join(meta, on="call_index", how="left")
        .join(node.rename({"rank": "src", "node": "src_node"}), on="src", how="left")
        .join(node.rename({"rank": "dst", "node": "dst_node"}), on="dst", how="left")
        .with_columns(
            pl.when(pl.col("src_node").is_null() | pl.col("dst_node").is_null())
            .then(pl.lit("unclassified"))
            .when(pl.col("src_node") == pl.col("dst_node"))
            .then(pl.lit("intra"))
            .otherwise(pl.lit("inter"))
            .alias("link")
        )
    )
    by_group = sorted(_by(links, ["group", "op"]), key=lambda r: (str(r["group"]), str(r["op"])))
    info = {r["group"]: r for r in meta.unique("group", keep="first").to_dicts()}
    # payload S summed over the calls that went on the links, to set beside their wire bytes
    payload = {
        (r["group"], r["op"]): r["bytes"]
        for r in calls.filter(pl.col("bytes").is_not_null())
        .group_by("group", "op")
        .agg(pl.col("bytes").sum())
        .to_dicts()
    }
    for r in by_group:
        g = info.get(r["group"], {})
        r.update(desc=g.get("group_desc"), dim=g.get("dim"), ranks=g.get("group_ranks"))
        r.update(
            label=group_label(r["group"], r["desc"], r["dim"], r["ranks"]),
            payload_bytes=payload.get((r["group"], r["op"])),
        )
    for r in summary["by_op"]:
        known = [v for (_, op), v in payload.items() if op == r["op"]]
        r["payload_bytes"] = sum(known) if known else None
    by_dim = (
        _by(links.filter(pl.col("dim").is_not_null()), ["dim"])
        if links["dim"].drop_nulls().len()
        else []
    )

    steps = inp.steps
    per_step = None
    if steps > 0:
        per_step = {
            "steps": steps,
            **{
                k: summary[k] / steps
                for k in ("intra_node_bytes", "inter_node_bytes", "total_bytes")
            },
        }
        per_step["by_dim"] = [
            {**r, **{k: r[k] / steps for k in ("intra", "inter", "bytes")}} for r in by_dim
        ]
    if calls["bytes"].null_count() == calls.height:  # no call's size known: totals unknown
        for k in ("intra_node_bytes", "inter_node_bytes", "unclassified_bytes", "total_bytes"):
            summary[k] = None
        summary["inter_node_fraction"] = None
        per_step = None
    summary.update(
        bytes_counted=TRAFFIC_BYTES_COUNTED,
        by_group=by_group,
        by_dim=by_dim,
        per_step=per_step,
        calls=calls.height,
        unknown_size_calls=int(calls["bytes"].null_count()),
        nodes=len(set(nodes.values())),
        backend="+".join(sorted(set(calls["backend"]))),
        ring_source="nccl_log" if ring else "group order",
    )
    frame = (
        links.group_by("src", "dst")
        .agg(
            pl.col("bytes").sum().round().cast(pl.Int64),
            pl.col("src_node").first(),
            pl.col("dst_node").first(),
            (pl.col("link").first() == "intra").alias("intra"),
        )
        .select(list(LINKS_SCHEMA))
        .cast(LINKS_SCHEMA)  # type: ignore[arg-type]  # polars#14468: cast() rejects a dict[str, dtype]
        .sort("src", "dst")
    )
    value = msgspec.convert(summary, Traffic, strict=True)
    return SectionResult(value, {"traffic_links": frame}, warnings)


def nccl(inp: SectionInput) -> SectionResult[Nccl]:
    """The ``nccl`` section: what the run's NCCL logs say (layout, ring 0, tuning choices) and
    which algorithm/protocol the traced kernels ran. None without logs and without NCCL kernels."""
    logs = inp.job.nccl
    table = inp.collectives
    kernels: dict[str, dict[str, int]] = {}
    if table.height and "algorithm" in table.columns:
        gpu = table.filter(pl.col("algorithm").is_not_null())
        for r in (
            gpu.group_by("op", "algorithm", "protocol").len().sort("op", "algorithm").to_dicts()
        ):
            kernels.setdefault(str(r["op"]), {})[f"{r['algorithm']}_{r['protocol']}"] = int(
                r["len"]
            )
    if logs is None and not kernels:
        return SectionResult()
    out: dict[str, Any] = {"kernel_algorithms": kernels, "logs": None}
    if logs is not None:
        log, layout = logs.log, logs.layout
        tuning = log.tuning
        chosen = []
        if tuning.height:
            chosen = (
                tuning.group_by("op", "algo", "proto", maintain_order=True)
                .agg(
                    pl.col("bytes").min().alias("min_bytes"),
                    pl.col("bytes").max().alias("max_bytes"),
                    pl.len().alias("lines"),
                )
                .to_dicts()
            )
        out["logs"] = {
            "files": len(log.files),
            "version": log.version,
            "communicators": int(log.comms.select("comm_id").n_unique()) if log.comms.height else 0,
            "layout": {str(r): v for r, v in sorted(layout.items())},
            "nodes": len({v["node"] for v in layout.values()}) if layout else None,
            "ring_order": logs.ring,
            "algorithms": chosen,
            "warnings": list(log.warnings),
        }
    return SectionResult(msgspec.convert(out, Nccl, strict=True))


def matching_section(inp: SectionInput) -> SectionResult[Matching]:
    """The ``matching`` section: how calls were attributed and matched, and the frame
    ``collective_matches`` (one row per rank per matched call)."""
    table = inp.collectives
    if table.height == 0 or "call_id" not in table.columns:
        return SectionResult()
    sources = table.group_by("group_source").len().sort("group_source").to_dicts()
    summary = Matching(
        method="k-th call of a process group on every member rank (flight-recorder collective_seq_id, or "
        "per-group order); p2p: k-th send a->b with k-th recv; transfer = min duration, wait = rest",
        calls=int(table["call_id"].drop_nulls().n_unique()),
        complete_calls=int(table.filter(pl.col("complete"))["call_id"].n_unique()),
        unattributed_rows=int(table["call_id"].null_count()),
        group_sources={str(r["group_source"]): int(r["len"]) for r in sources},
    )
    return SectionResult(summary, {"collective_matches": matching.matches_frame(table)})
