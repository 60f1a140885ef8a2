"""tracekit predict against the real emulated network: predicted vs measured step times.

Makes 8 runs of 4 ranks on 2 nodes (plain dp, fsdp, hsdp, pp-1f1b; dp at 400 mbit and 1 gbit,
fsdp and hsdp at 400 mbit under ``--emulate-network``: Linux namespaces and tc tbf, root and
iproute2 needed), predicts each shaped run from its plain run (calibrated from the plain run
only), and prints the table: run, bandwidth, predicted, measured, error. Then the replay's own
error on every run (own conditions), the fsdp/hsdp order and crossover, and the pp-1f1b bubble
against bandwidth. tests/test_predict_network.py runs the same validation with its bounds.

    python benchmarks/predict_validation.py [--out DIR] [--steps 5] [--reuse DIR]

``--reuse DIR`` takes the runs a previous call made there (DIR/index.json) instead of new ones.
Measured step = median of the profiled steps of the slowest rank, as predicted. Runs compared
with each other are made back to back (GROUPS); a group in which a shaped run's compute per step
differs from its plain run's by more than 25 % (another job on the machine) is made again, at
most twice, keeping the attempt that agrees best (COMPARABLE, RETRIES).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from tracekit import prediction as P

# name -> (strategy, inter-node rate under --emulate-network, or None for a plain run)
RUNS: dict[str, tuple[str, str | None]] = {
    "dp": ("dp", None),
    "dp@400mbit": ("dp", "400mbit"),
    "dp@1gbit": ("dp", "1gbit"),
    "fsdp": ("fsdp", None),
    "hsdp": ("hsdp", None),
    "fsdp@400mbit": ("fsdp", "400mbit"),
    "hsdp@400mbit": ("hsdp", "400mbit"),
    "pp-1f1b": ("pp-1f1b", None),
}
# (shaped run, the plain run it is predicted from, rate)
PREDICTED = [
    ("dp@400mbit", "dp", "400mbit"),
    ("dp@1gbit", "dp", "1gbit"),
    ("fsdp@400mbit", "fsdp", "400mbit"),
    ("hsdp@400mbit", "hsdp", "400mbit"),
]
SWEEP = "100mbit:100gbit"
PP_RATES = ("100gbit", "1gbit", "400mbit", "100mbit", "10mbit")


# A shaped run validates the prediction only if its compute ran as fast as the plain run's (the
# replay keeps the plain run's compute): on a shared machine another job can slow one run by
# 50 % or more. Runs compared with each other are made back to back (GROUPS); a group with a
# pair whose compute per step differs by more than COMPARABLE is made again, at most RETRIES
# times, and the attempt whose pairs agree best is kept. The table shows both computes.
GROUPS = [
    ["dp", "dp@400mbit", "dp@1gbit"],
    ["fsdp", "hsdp", "fsdp@400mbit", "hsdp@400mbit"],
    ["pp-1f1b"],
]
COMPARABLE = 0.25
# profiled steps per run: a run's time is mostly start-up (torch, the rendezvous), so 5 steps
# cost a few seconds more than 3 and make the median step far less sensitive to one bad step
STEPS = 5
RETRIES = 2


def _run(out: Path, name: str, steps: int) -> Path:
    from tracekit.capture.launch import RunOptions, run_job
    from tracekit.runfolder import load_run_json

    strategy, rate = RUNS[name]
    print(f"run {name} ...", file=sys.stderr, flush=True)
    opts: dict[str, Any] = dict(nproc=4, nodes=2, steps=steps, out=out / name)
    if rate:
        opts.update(emulate_network=True, inter_node_bandwidth=rate)
    run = run_job(RunOptions(strategy, **opts))
    status = (load_run_json(run) or {}).get("status")
    if status != "ok":
        raise RuntimeError(f"{name}: run {status} ({run})")
    return Path(run)


def compute_per_step(run: Path) -> float:
    """The busiest rank's compute per profiled step (summary.json ranks[].compute_s / steps)."""
    from tracekit.analysis import analyze

    s = analyze(run).summary
    return max(r.compute_s for r in s.ranks) / max(1, s.window.steps)


def _disagreement(group: list[str], compute: dict[str, float]) -> float:
    """The largest relative compute difference of the group's (shaped, plain) pairs."""
    pairs = [(t, src) for t, src, _ in PREDICTED if t in group and src in group]
    return max((abs(compute[t] / compute[src] - 1) for t, src in pairs), default=0.0)


def make_runs(
    out: Path, steps: int = STEPS, retries: int = RETRIES, existing: dict[str, Path] | None = None
) -> dict[str, Path]:
    """Every RUNS entry (4 ranks, 2 nodes) into OUT, group by group (``existing``: runs made
    before, kept while their group agrees); OUT/index.json names the runs kept."""
    out.mkdir(parents=True, exist_ok=True)
    dirs: dict[str, Path] = {}
    for group in GROUPS:
        best: tuple[float, dict[str, Path]] | None = None
        for attempt in range(retries + 1):
            if attempt == 0 and existing and all(n in existing for n in group):
                made = {n: Path(existing[n]) for n in group}
            else:
                made = {n: _run(out, n, steps) for n in group}
            compute = {n: compute_per_step(d) for n, d in made.items()}
            worst = _disagreement(group, compute)
            if best is None or worst < best[0]:
                best = (worst, made)
            if worst <= COMPARABLE:
                break
            last = attempt == retries
            print(
                f"{', '.join(group)}: compute per step {compute} differs by {100 * worst:.0f} %;"
                + (" keeping the attempt that agrees best" if last else " made again"),
                file=sys.stderr,
                flush=True,
            )
        dirs.update(best[1])
    (out / "index.json").write_text(json.dumps({k: str(v) for k, v in dirs.items()}, indent=1))
    return dirs


def _compute_per_step(m: Any) -> float | None:
    vals = [r.get("compute_s") for r in m.summary_ranks if r.get("compute_s") is not None]
    return max(vals) / max(1, m.steps) if vals else None


def validate(dirs: dict[str, Path]) -> dict[str, Any]:
    """Every number the table prints (and the test checks)."""
    from tracekit.analysis import analyze

    models = {}
    for name, d in dirs.items():
        a = analyze(d)
        m = P.build(a)
        m.summary_ranks = a.summary_dict()["ranks"]  # for the compute column only
        models[name] = m
    rows = []
    for target, source, rate in PREDICTED:
        pred = P.prediction(models[source], P.parse_bandwidth(rate))
        measured = P.measured_step(models[target])
        rows.append(
            {
                "run": target,
                "from": source,
                "bandwidth": rate,
                "predicted_s": pred["step_time_s"],
                "measured_s": measured,
                "error": (pred["step_time_s"] - measured) / measured,
                "compute_from_s": _compute_per_step(models[source]),
                "compute_measured_s": _compute_per_step(models[target]),
            }
        )
    own = {}
    for name, m in models.items():
        sc = P.prediction(m, None)["self_check"]
        own[name] = sc
    pred = {r["run"]: r for r in rows}
    order = {
        "plain_measured": "fsdp<hsdp"
        if own["fsdp"]["measured_step_time_s"] < own["hsdp"]["measured_step_time_s"]
        else "fsdp>hsdp",
        "plain_predicted": "fsdp<hsdp"
        if own["fsdp"]["step_time_s"] < own["hsdp"]["step_time_s"]
        else "fsdp>hsdp",
        "400mbit_measured": "fsdp<hsdp"
        if pred["fsdp@400mbit"]["measured_s"] < pred["hsdp@400mbit"]["measured_s"]
        else "fsdp>hsdp",
        "400mbit_predicted": "fsdp<hsdp"
        if pred["fsdp@400mbit"]["predicted_s"] < pred["hsdp@400mbit"]["predicted_s"]
        else "fsdp>hsdp",
    }
    lo, hi = P.parse_bandwidth(SWEEP)
    cross = P.compare([models["fsdp"], models["hsdp"]], lo, hi, None, 0.0)[0]
    pp = []
    for rate in PP_RATES:
        p = P.prediction(models["pp-1f1b"], P.parse_bandwidth(rate))
        pp.append({"bandwidth": rate, "step_s": p["step_time_s"], "bubble": p["bubble_fraction"]})
    return {
        "rows": rows,
        "own": own,
        "order": order,
        "crossover_bits_per_s": cross["crossover_bits_per_s"],
        "pp": pp,
    }


def report(v: dict[str, Any]) -> str:
    out = [
        "| run | predicted from | bandwidth | predicted s | measured s | error | "
        "compute/step from -> measured |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in v["rows"]:
        out.append(
            f"| {r['run']} | {r['from']} | {r['bandwidth']} | {r['predicted_s']:.3f} | "
            f"{r['measured_s']:.3f} | {100 * r['error']:+.1f}% | "
            f"{r['compute_from_s']:.3f} -> {r['compute_measured_s']:.3f} |"
        )
    out += ["", "| run (own conditions) | replay s | measured s | error |", "|---|---|---|---|"]
    for name, sc in v["own"].items():
        out.append(
            f"| {name} | {sc['step_time_s']:.3f} | {sc['measured_step_time_s']:.3f} | "
            f"{100 * sc['error']:+.1f}% |"
        )
    o = v["order"]
    out += [
        "",
        f"fsdp/hsdp order, plain: measured {o['plain_measured']}, predicted {o['plain_predicted']}; "
        f"400 mbit: measured {o['400mbit_measured']}, predicted {o['400mbit_predicted']}",
        "fsdp/hsdp crossover (predicted from the plain runs, "
        + SWEEP
        + "): "
        + (", ".join(P.fmt_rate(x) for x in v["crossover_bits_per_s"]) or "none"),
        "",
        "| pp-1f1b at | predicted step s | bubble |",
        "|---|---|---|",
    ]
    for r in v["pp"]:
        out.append(f"| {r['bandwidth']} | {r['step_s']:.3f} | {r['bubble']:.3f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", type=Path, default=None, help="where the runs go (default: a temp dir)"
    )
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--reuse", type=Path, default=None, help="DIR/index.json of earlier runs")
    args = ap.parse_args()
    if args.reuse:  # as they are: no run is made again
        dirs = {k: Path(v) for k, v in json.loads((args.reuse / "index.json").read_text()).items()}
    else:
        from tracekit.capture import netns

        why = netns.unavailable()
        if why:
            sys.exit(f"predict_validation: {why}")
        dirs = make_runs(
            args.out or Path(tempfile.mkdtemp(prefix="predict-validation-")), args.steps
        )
    v = validate(dirs)
    print(report(v))


if __name__ == "__main__":
    main()
