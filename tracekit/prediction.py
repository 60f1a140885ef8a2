"""``tracekit predict``: a run's step on another network, from its trace (docs/predict.md).

``predict_of(analysis, inter_node_bandwidth=...)`` replays a run's profiled steps (an Analysis:
``tracekit.predict(path, ...)`` and ``Analysis.predict(...)`` analyse first) over the given
network (tracekit.analyses.network_replay) and returns the prediction as a dict;
``write_prediction`` puts it into ``RUN/analysis/prediction.json`` atomically.
Rates are tc's (``400mbit``, ``1gbit``, ``10gbit``, ``mbps`` = 10^6 bytes/s) or plain bits/s;
``LO:HI`` sweeps log-spaced rates between them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from tracekit import run_inputs
from tracekit.analyses import network_replay as model
from tracekit.analyses.network_program import Call, calls_table, programs
from tracekit.errors import TracekitError

SCHEMA_VERSION = 1
_RATE = re.compile(r"^(\d+(?:\.\d+)?(?:e\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)?$")
_UNITS = {
    None: 1.0,
    "bit": 1.0,
    "kbit": 1e3,
    "mbit": 1e6,
    "gbit": 1e9,
    "tbit": 1e12,
    "bps": 8.0,
    "kbps": 8e3,
    "mbps": 8e6,
    "gbps": 8e9,
    "tbps": 8e12,
}


#: the rates (bits/s) and latencies (us) a prediction computes with: 1 bit/s to 1 Pbit/s, and
#: up to 1000 s per message step; beyond them times overflow to infinity or vanish
RATE_RANGE = (1.0, 1e15)
LATENCY_MAX_US = 1e9


def parse_rate(text: str, option: str = "--inter-node-bandwidth") -> float:
    """tc's rate syntax, or plain bits/s -> bits per second (in :data:`RATE_RANGE`)."""
    m = _RATE.match(str(text).strip().lower())
    value = float(m[1]) * _UNITS[m[2]] if m else 0.0
    if not m or value <= 0 or value != value or value == float("inf"):
        raise TracekitError(
            f"{option} {text!r} is not a rate such as 400mbit, 1gbit or 1e9 (bits/s)"
        )
    if not RATE_RANGE[0] <= value <= RATE_RANGE[1]:
        raise TracekitError(f"{option} {text!r} is out of range: give 1 bit/s to 1000 tbit (1e15)")
    return value


def check_latency(latency_us: Any, option: str = "--latency") -> float:
    """A latency in microseconds, finite and 0 .. :data:`LATENCY_MAX_US` (TracekitError)."""
    try:
        value = float(latency_us)
    except (TypeError, ValueError):
        value = float("nan")
    if not 0 <= value <= LATENCY_MAX_US:  # also NaN and infinity
        raise TracekitError(
            f"{option} {latency_us!r} must be a number of microseconds from 0 to 1e9 (1000 s)"
        )
    return value


def parse_bandwidth(
    text: str, option: str = "--inter-node-bandwidth"
) -> tuple[float, float | None]:
    """RATE -> (rate, None); LO:HI -> (lo, hi), lo < hi."""
    if ":" not in str(text):
        return parse_rate(text, option), None
    lo_text, hi_text = str(text).split(":", 1)
    lo, hi = parse_rate(lo_text, option), parse_rate(hi_text, option)
    if hi <= lo:
        raise TracekitError(f"{option} {text!r}: a sweep LO:HI needs LO < HI")
    return lo, hi


def fmt_rate(bits: float | None) -> str:
    """1e9 -> '1 gbit', 4e8 -> '400 mbit'; None -> '–'."""
    if bits is None:
        return "–"
    for unit, scale in (("tbit", 1e12), ("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits >= scale * 0.9995:  # 999.9999 mbit is 1 gbit
            return f"{bits / scale:.3g} {unit}"
    return f"{bits:.3g} bit"


@dataclass
class Model:
    """A run's replay inputs, built once and replayed at many bandwidths."""

    path: Path
    programs: dict
    calls: dict[str, Call]
    run_inter_bits: float | None  # the emulated network's rate, when the run had one
    measured_ranks: dict[int, dict[str, Any]]
    steps: int
    stages: int  # pipeline stages (0: not a pipeline run)
    calibration: dict[str, float | None]
    # ranks of a run whose calls never cross nodes (one node): the inter-node sweep is flat
    one_node_ranks: int | None = None
    why: Any = None  # summary.json why (the straggler what-if's top cause and its numbers)
    work_s: dict[int, float] | None = None  # per rank: work per profiled step (straggler_replay)
    corun_slowdown: float | None = None  # summary.json contention.corun_slowdown_max

    def replay(self, net: model.Network) -> model.Replay:
        return model.replay(self.programs, self.calls, net, self.run_inter_bits)


def _calibration(calls: dict[str, Call]) -> dict[str, float | None]:
    """Measured busbw per link kind: bytes on the busiest NIC (intra link) x 8 / transfer."""
    inter = [(max(c.nic.values()), c.transfer_ns) for c in calls.values() if c.nic]
    intra = [(c.intra_bytes, c.transfer_ns) for c in calls.values() if not c.nic and c.intra_bytes]

    def rate(pairs: list[tuple[float, int]]) -> float | None:
        t = sum(p[1] for p in pairs)
        return sum(p[0] for p in pairs) * 8 / (t * 1e-9) if pairs and t > 0 else None

    return {"inter_node_busbw_bits_per_s": rate(inter), "intra_node_busbw_bits_per_s": rate(intra)}


def build(analysis: Any) -> Model:
    """The replay inputs from a tracekit.analyze result."""
    from tracekit import timeline

    s = analysis.summary
    nodes = {int(k): v for k, v in s.topology.nodes.items()}
    calls = calls_table(analysis.collectives, nodes)
    if not calls:
        raise TracekitError("no matched collective or p2p calls: nothing to predict", analysis.path)
    windows = pl.DataFrame(
        [(w.rank, w.kind, w.steps, w.start_ns, w.end_ns) for w in s.window.per_rank],
        orient="row",
        schema={
            "rank": pl.Int32,
            "kind": pl.Utf8,
            "steps": pl.Int32,
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
        },
    )
    markers = timeline.step_markers(analysis.events)
    ops = analysis.frames.get("pipeline_ops")
    progs = programs(
        analysis.events, analysis.timeline, analysis.collectives, markers, windows, calls, ops
    )
    steps = s.window.steps
    measured = {}
    for r in s.ranks:
        n = max(1, r.window_steps or steps or 1)
        measured[r.rank] = {
            "step_time_s": r.step_time_s,
            "comm_s": r.comm_s / n,
            "exposed_comm_s": r.exposed_comm_s / n,
        }
    net = ((analysis.run or {}).get("launch") or {}).get("network") or {}
    return Model(
        path=Path(analysis.path),
        programs=progs,
        calls=calls,
        run_inter_bits=net.get("rate_bits_per_s"),
        measured_ranks=measured,
        steps=steps,
        stages=s.pipeline.stages if s.pipeline and ops is not None and ops.height else 0,
        calibration=_calibration(calls),
        one_node_ranks=None if any(c.nic for c in calls.values()) else len(s.ranks),
        why=getattr(s, "why", None),
        work_s=_work_per_step(s),
        corun_slowdown=s.contention.corun_slowdown_max if s.contention else None,
    )


def _work_per_step(s: Any) -> dict[int, float] | None:
    """Per rank, compute + other + idle per profiled step (why.wait_states: the same numbers
    the why section's what-if uses)."""
    why = getattr(s, "why", None)
    if why is None:
        return None
    steps = {r.rank: max(1, r.window_steps or s.window.steps or 1) for r in s.ranks}
    return {
        w.rank: (w.compute_s + w.other_s + w.idle_s) / steps.get(w.rank, 1)
        for w in why.wait_states.per_rank
    }


def parse_rank_speed(text: str) -> tuple[int, float, float | None]:
    """``RANK:SPEED`` -> (rank, speed, None); ``RANK:LO:HI`` -> (rank, lo, hi), a curve."""
    parts = str(text).split(":")
    try:
        rank, speeds = int(parts[0]), [float(x) for x in parts[1:]]
    except ValueError:
        speeds, rank = [], -1
    bad = f"--rank-speed {text!r} must be RANK:SPEED or RANK:LO:HI, SPEED > 0 (e.g. 1:1.5)"
    if rank < 0 or len(speeds) not in (1, 2) or not all(0 < v < float("inf") for v in speeds):
        raise TracekitError(bad)
    if len(speeds) == 2 and speeds[1] <= speeds[0]:
        raise TracekitError(f"--rank-speed {text!r}: a curve RANK:LO:HI needs LO < HI")
    return rank, speeds[0], speeds[1] if len(speeds) == 2 else None


def straggler_block(
    m: Model, without_straggler: bool, rank_speeds: Sequence[tuple[int, float, float | None]]
) -> dict[str, Any]:
    """prediction.json ``straggler`` (docs/predict.md "Straggler what-if"): the step with one
    rank's work faster, at measured transfers (tracekit.analyses.straggler_replay)."""
    from tracekit.analyses import straggler_replay as sr

    for r, _, _ in rank_speeds:
        if r not in m.programs:
            raise TracekitError(f"--rank-speed: rank {r} is not one of the run's ranks", m.path)
    if sum(hi is not None for _, _, hi in rank_speeds) > 1:
        raise TracekitError("--rank-speed: at most one curve RANK:LO:HI")
    own = model.replay(m.programs, m.calls, model.Network(measured=True), m.run_inter_bits)
    out: dict[str, Any] = {
        "measured_step_time_s": sr.measured_slowest(m.programs),
        "measured_step_times_s": sr.measured_step_times(m.programs),
        "replayed_step_time_s": model.slowest(own),
        "without_straggler": None,
        "rank_speeds": None,
        "curve": None,
        "caveat": corun_caveat(m.corun_slowdown),
    }
    if without_straggler:
        top = getattr(m.why, "top_cause", None)
        got = (
            sr.without(m.programs, m.calls, top, m.work_s or {}, m.run_inter_bits)
            if top is not None
            else None
        )
        out["without_straggler"] = got or {
            "rank": top,
            "note": "no rank holds the others up (why.top_cause is null): nothing to remove"
            if top is None
            else f"rank {top} has no peer to compare with",
        }
    fixed = {r: lo for r, lo, hi in rank_speeds if hi is None}
    if fixed:
        out["rank_speeds"] = sr.what_if(m.programs, m.calls, fixed, m.run_inter_bits)
    for r, lo, hi in rank_speeds:
        if hi is not None:
            points = [
                {"speed": v, **sr.what_if(m.programs, m.calls, {**fixed, r: v}, m.run_inter_bits)}
                for v in sr.curve_speeds(lo, hi)
            ]
            out["curve"] = {"rank": r, "points": points}
    return out


def corun_caveat(slowdown: float | None) -> str | None:
    """What the what-if cannot know where the run's ranks slowed each other's compute (the
    co-run probe, tracekit.capture.corun); None where they did not, or it is unknown."""
    from tracekit.summary.contention import CORUN_SLOW

    if slowdown is None or slowdown <= CORUN_SLOW:
        return None
    return (
        f"the run's ranks computed up to {slowdown:.2g}x slower beside each other than alone "
        "(the co-run probe): the what-if keeps the other ranks' work as slowed beside the rank "
        "it speeds up, so it overstates the step it predicts"
    )


def one_node_warning(ranks: int) -> str:
    """Why a one-node run's prediction cannot move with the inter-node network."""
    return (
        f"all {ranks} ranks on one node: nothing crosses nodes, so the inter-node "
        "bandwidth/latency sweep cannot change the step; use --intra-node-bandwidth or a "
        "two-node run (tracekit run --nodes 2, or tracekit analyze --ranks-per-node N)"
    )


def measured_step(m: Model) -> float | None:
    """The measured step: the median profiled step of the slowest rank (summary.json)."""
    vals = [v["step_time_s"] for v in m.measured_ranks.values() if v["step_time_s"] is not None]
    return max(vals) if vals else None


def _ranks(m: Model, rep: model.Replay) -> list[dict[str, Any]]:
    return [
        {
            "rank": r,
            "step_time_s": rep.step_time_s.get(r),
            "comm_s": rep.comm_s.get(r),
            "exposed_comm_s": rep.exposed_comm_s.get(r),
            "measured_step_time_s": m.measured_ranks.get(r, {}).get("step_time_s"),
            "measured_comm_s": m.measured_ranks.get(r, {}).get("comm_s"),
            "measured_exposed_comm_s": m.measured_ranks.get(r, {}).get("exposed_comm_s"),
        }
        for r in sorted(rep.step_time_s)
    ]


def _rel(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else (a - b) / b


def step_at(m: Model, inter_bits: float, intra_bits: float | None, latency_s: float) -> float:
    rep = m.replay(model.Network(inter_bits, intra_bits, latency_s))
    return model.slowest(rep) or 0.0


def _point(m: Model, net: model.Network) -> dict[str, Any]:
    rep = m.replay(net)
    return {
        "inter_node_bits_per_s": net.inter_bits,
        "step_time_s": model.slowest(rep),
        "comm_s": max(rep.comm_s.values(), default=None),
        "exposed_comm_s": max(rep.exposed_comm_s.values(), default=None),
        "bubble_fraction": model.bubble_fraction(rep, m.stages) if m.stages else None,
    }


def prediction(
    m: Model,
    inter: tuple[float, float | None] | None,
    intra_bits: float | None = None,
    latency_us: float = 0.0,
) -> dict[str, Any]:
    """The prediction.json dict for one run (docs/predict.md)."""
    latency_s = latency_us * 1e-6
    own = m.replay(model.Network(measured=True))
    free = m.replay(model.Network(None, None, 0.0))
    measured = measured_step(m)
    cal = m.calibration
    if inter is None:  # the run's own conditions
        rep, inter_bits, source = own, m.run_inter_bits or cal["inter_node_busbw_bits_per_s"], None
        source = "run.json launch.network" if m.run_inter_bits else "calibrated (as measured)"
    else:
        inter_bits, source = inter[0], "given"
        rep = m.replay(model.Network(inter_bits, intra_bits, latency_s))
    out: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "source": str(m.path),
        "step_time_s": model.slowest(rep),
        "measured_step_time_s": measured,
        "free_step_time_s": model.slowest(free),
        "bandwidths": {
            "inter_node_bits_per_s": inter_bits,
            "inter_node_source": source,
            "intra_node_bits_per_s": intra_bits or cal["intra_node_busbw_bits_per_s"],
            "intra_node_source": "given"
            if intra_bits
            else "calibrated (as measured: each call's floor holds it)",
            "latency_us": latency_us,
            "run_network_bits_per_s": m.run_inter_bits,
            **cal,
        },
        "self_check": {
            "step_time_s": model.slowest(own),
            "measured_step_time_s": measured,
            "error": _rel(model.slowest(own), measured),
        },
        "steps": m.steps,
        "ranks": _ranks(m, rep),
        "bubble_fraction": model.bubble_fraction(rep, m.stages) if m.stages else None,
        "sweep": None,
        "warnings": [one_node_warning(m.one_node_ranks)] if m.one_node_ranks else [],
    }
    if inter is not None and inter[1] is not None:
        lo, hi = inter[0], inter[1]  # hi: not None (a tuple unpacked is not narrowed)
        points = model.log_points(lo, hi)
        curve = [_point(m, model.Network(b, intra_bits, latency_s)) for b in points]
        free_step = out["free_step_time_s"] or 0.0
        knee, note = model.knee(lambda b: step_at(m, b, intra_bits, latency_s), free_step, lo, hi)
        out["sweep"] = {
            "points": curve,
            "knee_bits_per_s": knee,
            "knee_note": note,
            "knee_slowdown": model.KNEE_SLOWDOWN,
            # an unshaped run's own conditions are the model's limit of a fast link (every
            # call its measured cost): its point sits at HI; a shaped run's at its rate
            "measured_point": {
                "inter_node_bits_per_s": m.run_inter_bits or hi,
                "step_time_s": measured,
                "label": f"emulated {fmt_rate(m.run_inter_bits)}"
                if m.run_inter_bits
                else "unshaped: loopback, plotted at HI",
            },
        }
    return out


def compare(models: Sequence[Model], lo: float, hi: float, intra: float | None, lat: float):
    """Crossover bandwidths between each pair of runs' predicted steps over [lo, hi]."""
    points = model.log_points(lo, hi)
    out = []
    for i, a in enumerate(models):
        for b in models[i + 1 :]:
            xs = model.crossovers(
                lambda x, a=a: step_at(a, x, intra, lat * 1e-6),
                lambda x, b=b: step_at(b, x, intra, lat * 1e-6),
                points,
            )
            out.append({"a": str(a.path), "b": str(b.path), "crossover_bits_per_s": xs})
    return out


def default_output(path: Path) -> Path:
    from tracekit.analysis_folder import default_out_dir

    return default_out_dir(Path(path)) / "prediction.json"


def _unknown_as_null(x: Any) -> Any:
    """NaN (a number not known) as null, everywhere in X."""
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: _unknown_as_null(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_unknown_as_null(v) for v in x]
    return x


def write_prediction(pred: dict[str, Any], target: Path, source: Path | None = None) -> Path:
    """Write atomically into TARGET's folder, listed in the analysis folder's marker when it is
    one (analysis_folder.add_file); refuse a non-regular TARGET, one on or inside an input of
    SOURCE (the run predicted), and a prediction holding an infinite number (strict JSON only:
    unknown is null)."""
    from tracekit import outputs
    from tracekit.analysis_folder import add_file

    target = Path(target)
    if source is not None:
        run_inputs.refuse_input_overlap(target, run_inputs.inputs_of(source), "--out")
    outputs.check_file_target(target, "--out")
    try:
        text = json.dumps(_unknown_as_null(pred), indent=2, default=_json_default, allow_nan=False)
    except ValueError:
        raise TracekitError(
            "the prediction holds an infinite number (the options are out of range); "
            "nothing written",
            target,
        ) from None
    return add_file(target.parent, target.name, text + "\n")


def _json_default(x: Any) -> Any:
    return None if isinstance(x, float) and x != x else str(x)


def predict_of(
    analysis: Any,
    inter_node_bandwidth: str | float | None = None,
    intra_node_bandwidth: str | float | None = None,
    latency_us: float = 0.0,
    out: str | Path | None = None,
    write: bool = True,
) -> dict[str, Any]:
    """Predict the analysed run's step at another inter-node bandwidth (docs/predict.md);
    writes prediction.json into ``out`` (a folder; default RUN/analysis) unless ``write`` is
    False."""
    inter = None
    if inter_node_bandwidth is not None:
        inter = (
            (float(inter_node_bandwidth), None)
            if isinstance(inter_node_bandwidth, (int, float))
            else parse_bandwidth(inter_node_bandwidth)
        )
    intra = None
    if intra_node_bandwidth is not None:
        intra = (
            float(intra_node_bandwidth)
            if isinstance(intra_node_bandwidth, (int, float))
            else parse_rate(intra_node_bandwidth, "--intra-node-bandwidth")
        )
    latency = check_latency(latency_us)
    m = build(analysis)
    pred = prediction(m, inter, intra, latency)
    if write:
        target = Path(out) / "prediction.json" if out is not None else default_output(m.path)
        write_prediction(pred, target, source=m.path)
    return pred
