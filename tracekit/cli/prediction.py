"""``tracekit predict``'s output: per-rank tables, the sweep curve, crossovers (docs/predict.md)."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tracekit import outputs, run_inputs
from tracekit import prediction as P
from tracekit.analysis import analyze
from tracekit.cli.tables import safe
from tracekit.errors import TracekitError


def _s(x: float | None) -> str:
    return "–" if x is None else f"{x:.4f}"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:+.1f}%"


def rank_table(pred: dict[str, Any], name: str) -> Table:
    bw = pred["bandwidths"]
    t = Table(
        title=f"{name}: predicted at {P.fmt_rate(bw['inter_node_bits_per_s'])} inter-node "
        f"({bw['inter_node_source']}), intra {P.fmt_rate(bw['intra_node_bits_per_s'])}, "
        f"latency {bw['latency_us']:g} us; per step"
    )
    for col in ("rank", "step s", "measured", "comm s", "measured", "exposed s", "measured"):
        t.add_column(col, justify="right")
    for r in pred["ranks"]:
        t.add_row(
            str(r["rank"]),
            _s(r["step_time_s"]),
            _s(r["measured_step_time_s"]),
            _s(r["comm_s"]),
            _s(r["measured_comm_s"]),
            _s(r["exposed_comm_s"]),
            _s(r["measured_exposed_comm_s"]),
        )
    return t


def sweep_table(preds: list[tuple[str, dict[str, Any]]]) -> Table:
    t = Table(title="predicted step time (s, slowest rank's median) against inter-node bandwidth")
    t.add_column("bandwidth", justify="right")
    for name, _ in preds:
        t.add_column(name, justify="right")
    points = [p["sweep"]["points"] for _, p in preds]
    for i, pt in enumerate(points[0]):
        t.add_row(
            P.fmt_rate(pt["inter_node_bits_per_s"]), *[_s(ps[i]["step_time_s"]) for ps in points]
        )
    return t


def _targets(out: Path | None, paths: list[Path]) -> list[Path]:
    """Where each run's prediction goes: its analysis folder, or in OUT ``prediction.json``
    (one run), ``<run>.prediction.json`` (several), ``<run>-<hash>.prediction.json`` for runs
    whose folders share a name (the hash of its resolved path: two runs never overwrite each
    other's prediction)."""
    if out is None:
        return [P.default_output(p) for p in paths]
    if len(paths) == 1:
        return [Path(out) / "prediction.json"]
    names = [Path(p).resolve().name for p in paths]
    found = []
    for p, name in zip(paths, names):
        if names.count(name) > 1:
            name += "-" + hashlib.sha256(os.fsencode(Path(p).resolve())).hexdigest()[:8]
        found.append(Path(out) / f"{name}.prediction.json")
    return found


def straggler_lines(block: dict[str, Any], name: str) -> list[str]:
    """The straggler what-if beside the measured step (prediction.json ``straggler``)."""
    measured = block["measured_step_time_s"]
    lines = [
        f"{name}: measured step {_s(measured)} s, replayed at measured transfers "
        f"{_s(block['replayed_step_time_s'])} s"
    ]
    wo = block.get("without_straggler")
    if wo is not None and "step_time_s" in wo:
        lines.append(
            f"{name}: without rank {wo['rank']}'s excess ({wo['speed']:.2g}x its busiest peer's "
            f"work) the step would take {_s(wo['step_time_s'])} s (measured {_s(measured)} s); "
            f"per step {', '.join(_s(x) for x in wo['step_times_s'])}"
        )
    elif wo is not None:
        lines.append(f"{name}: --without-straggler: {wo['note']}")
    if block.get("caveat"):
        lines.append(f"{name}: caveat: {block['caveat']}")
    rs = block.get("rank_speeds")
    if rs is not None:
        at = ", ".join(f"rank {x['rank']} x{x['speed']:g}" for x in rs["speeds"])
        lines.append(
            f"{name}: with {at} the step would take {_s(rs['step_time_s'])} s "
            f"(measured {_s(measured)} s); per step {', '.join(_s(x) for x in rs['step_times_s'])}"
        )
    return lines


def curve_table(block: dict[str, Any], name: str) -> Table:
    curve = block["curve"]
    t = Table(title=f"{name}: predicted step (s) against rank {curve['rank']}'s speed")
    t.add_column("speed", justify="right")
    t.add_column("step s", justify="right")
    t.add_column("vs measured", justify="right")
    for pt in curve["points"]:
        t.add_row(
            f"{pt['speed']:.3g}",
            _s(pt["step_time_s"]),
            _pct(P._rel(pt["step_time_s"], block["measured_step_time_s"])),
        )
    return t


def run_predict(
    paths: list[Path],
    inter: str | None,
    intra: str | None,
    latency_us: float,
    out: Path | None,
    console: Console,
    without_straggler: bool = False,
    rank_speeds: list[str] | None = None,
) -> None:
    """Parse the options (bad ones fail before any analysis), predict, print, write."""
    speeds = [P.parse_rank_speed(x) for x in rank_speeds or []]
    straggler = without_straggler or bool(speeds)
    if inter is None and not straggler:
        raise TracekitError(
            "give --inter-node-bandwidth RATE (or LO:HI), --without-straggler or --rank-speed"
        )
    bw = P.parse_bandwidth(inter) if inter is not None else None
    intra_bits = None if intra is None else P.parse_rate(intra, "--intra-node-bandwidth")
    latency_us = P.check_latency(latency_us)
    several = len(paths) > 1
    targets = _targets(out, paths)
    if len(set(map(os.path.realpath, targets))) < len(targets):  # the same run given twice
        raise TracekitError("the same run is given twice; give each run once", paths[0])
    inputs = [i for q in paths for i in run_inputs.inputs_of(q)]
    for target in targets:  # before any analysis
        run_inputs.refuse_input_overlap(target, inputs, "--out")
        outputs.check_file_target(target, "--out")
    models = [P.build(analyze(p)) for p in paths]
    preds = [
        (Path(p).name, P.prediction(m, bw, intra_bits, latency_us)) for p, m in zip(paths, models)
    ]
    if straggler:
        for (_, pred), m in zip(preds, models):
            pred["straggler"] = P.straggler_block(m, without_straggler, speeds)
    cross = (
        P.compare(models, bw[0], bw[1], intra_bits, latency_us)
        if several and bw is not None and bw[1]
        else []
    )
    for (name, pred), p, target in zip(preds, paths, targets):
        if cross:
            pred["crossovers"] = [c for c in cross if str(p) in (c["a"], c["b"])]
            # the other runs' curves, so that this run's figure draws them beside its own
            pred["compared"] = [
                {"name": n, "source": o["source"], "sweep": o["sweep"]}
                for n, o in preds
                if o is not pred
            ]
        if bw is not None:
            console.print(rank_table(pred, name))
        if pred.get("straggler"):
            for line in straggler_lines(pred["straggler"], name):
                console.print(line, highlight=False, soft_wrap=True)
            if pred["straggler"]["curve"]:
                console.print(curve_table(pred["straggler"], name))
            if bw is None:
                P.write_prediction(pred, target, source=p)
                continue
        for w in pred.get("warnings") or []:
            console.print(f"{name}: warning: {w}", highlight=False, soft_wrap=True)
        sc = pred["self_check"]
        console.print(
            f"{name}: predicted step {_s(pred['step_time_s'])} s, measured {_s(pred['measured_step_time_s'])} s; "
            f"free communication {_s(pred['free_step_time_s'])} s; self-check (own conditions) "
            f"{_s(sc['step_time_s'])} s ({_pct(sc['error'])})",
            highlight=False,
        )
        if pred.get("bubble_fraction") is not None:
            console.print(f"{name}: pipeline bubble {pred['bubble_fraction']:.3f}", highlight=False)
        if pred["sweep"]:
            sw = pred["sweep"]
            knee = P.fmt_rate(sw["knee_bits_per_s"]) if sw["knee_bits_per_s"] else sw["knee_note"]
            console.print(f"{name}: knee (>10 % slower than free below) {knee}", highlight=False)
        P.write_prediction(pred, target, source=p)
    if bw is not None and bw[1] is not None:
        console.print(sweep_table(preds))
    for c in cross:
        xs = ", ".join(P.fmt_rate(x) for x in c["crossover_bits_per_s"]) or "none in the sweep"
        console.print(f"crossover {Path(c['a']).name} / {Path(c['b']).name}: {xs}", highlight=False)
    print(safe(f"wrote {', '.join(map(str, targets))}"), file=sys.stderr)
