"""The why analysis against a straggler we planted: issue #28's ground-truth table.

For dp, fsdp and pp-1f1b at 2 ranks, one run as is and one with ``--straggler 1:FACTOR`` (rank
1's forward and backward FACTOR times as long, as real compute: tracekit.capture.straggler),
back to back. Per pair it checks the issue's four claims on the straggler run:

    top cause      summary.json why.top_cause is the injected rank
    charged        the waits charged to it (why.root_causes.per_rank) beyond those charged to
                   it in the clean run are within 25 % of the extra compute it ran (run.json
                   straggler.injected_s, summed over the profiled steps). The clean run's own
                   charges are the schedule's: a pipeline's last stage holds the first up by
                   its backward in every run (pp-1f1b: 0.155 s of 0.786 s); the raw charge is
                   in the table beside it
    path           the critical path's largest share per rank is the injected rank's, and
                   compute is its largest state
    without        ``tracekit predict --without-straggler`` on the straggler run predicts the
                   clean run's measured step (slowest rank's median) within 15 %

and prints the table, with the machine's load while it ran, and how much slower the peers'
own work ran beside the straggler than in the clean run ("peer slowed": the what-if keeps the
peers' work as measured, so its error follows this column; on this 2-CPU machine it moved from
-21 % to +15 % between runs made one after the other, with the co-run probe at 0.94-1.06x).
tests/test_straggler_validation.py makes the same runs and holds the timed claims to looser,
noise-proof bounds (its docstring).

    python benchmarks/straggler_validation.py [--out DIR] [--steps 6] [--factor 2] [--reuse DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from tracekit import prediction as P

STRATEGIES = ("dp", "fsdp", "pp-1f1b")
RANK = 1
CHARGED_WITHIN = 0.25  # the bounds
WITHOUT_WITHIN = 0.15


def make_runs(out: Path, steps: int, factor: float) -> dict[str, dict[str, str]]:
    """strategy -> {"clean": run folder, "straggler": run folder}; DIR/index.json."""
    from tracekit.capture.launch import RunOptions, run_job

    index: dict[str, dict[str, str]] = {}
    for s in STRATEGIES:
        pair = {}
        for kind, straggler in (("clean", None), ("straggler", f"{RANK}:{factor:g}")):
            opts = RunOptions(s, nproc=2, steps=steps, straggler=straggler, out=out / kind)
            pair[kind] = str(run_job(opts, log=open(os.devnull, "w")))  # noqa: SIM115
        index[s] = pair
    (out / "index.json").write_text(json.dumps(index, indent=1))
    return index


def _rel(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else (a - b) / b


def check(clean: Path, slowed: Path) -> dict[str, Any]:
    """One row of the table (the four claims and their numbers)."""
    from tracekit.analysis import analyze

    run = json.loads((slowed / "run.json").read_text())
    planted = run["straggler"]
    injected = float(sum(planted["injected_s"]))
    a = analyze(slowed)
    try:
        why = a.summary.why
        charged = next(
            (c.cost_s for c in why.root_causes.per_rank if c.rank == planted["rank"]), 0.0
        )
        path = why.critical_path
        top_path = path.per_rank[0] if path and path.per_rank else None
        top_state = max(path.per_state, key=lambda s: s.seconds).state if path else None
        m = P.build(a)
        block = P.straggler_block(m, True, [])
    finally:
        a.close()
    c = analyze(clean)
    try:
        clean_why = c.summary.why
        clean_charged = next(
            (
                x.cost_s
                for x in (clean_why.root_causes.per_rank if clean_why else [])
                if x.rank == planted["rank"]
            ),
            0.0,
        )
        cm = P.build(c)
        clean_step = P.straggler_block(cm, False, [])["measured_step_time_s"]
    finally:
        c.close()
    wo = block["without_straggler"] or {}
    predicted = wo.get("step_time_s")
    # the peers' own work per step in both runs: what another job on the machine did to them
    peer = [r for r in (m.work_s or {}) if r != planted["rank"]]
    peer_clean = max(((cm.work_s or {}).get(r, 0.0) for r in peer), default=None)
    peer_slowed = max(((m.work_s or {}).get(r, 0.0) for r in peer), default=None)
    return {
        "strategy": run["strategy"],
        "rank": planted["rank"],
        "factor": planted["factor"],
        "top_cause": why.top_cause,
        "injected_s": injected,
        "injected_per_step_s": [float(x) for x in planted["injected_s"]],
        "charged_s": charged,
        "clean_charged_s": clean_charged,
        "charged_error": _rel(charged - clean_charged, injected),
        "raw_charged_error": _rel(charged, injected),
        "path_rank": top_path.rank if top_path else None,
        "path_share": top_path.share if top_path else None,
        "path_state": top_state,
        "straggler_step_s": block["measured_step_time_s"],
        "clean_step_s": clean_step,
        "without_s": predicted,
        "without_error": _rel(predicted, clean_step),
        "speed": wo.get("speed"),
        "peer_work_clean_s": peer_clean,
        "peer_work_straggler_s": peer_slowed,
    }


def verdicts(row: dict[str, Any], slack: float = 1.0) -> dict[str, bool]:
    """Each claim met or not; ``slack`` widens the two timed bounds (the test suite's 2x)."""
    ce, we = row["charged_error"], row["without_error"]
    return {
        "top cause": row["top_cause"] == row["rank"],
        "charged": ce is not None and abs(ce) <= CHARGED_WITHIN * slack,
        "path": row["path_rank"] == row["rank"] and row["path_state"] == "compute",
        "without": we is not None and abs(we) <= WITHOUT_WITHIN * slack,
    }


def _f(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "–"
    return f"{100 * x:+.0f}%" if pct else f"{x:.3f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| strategy | top cause | injected s | charged s (raw err) | charged in the clean run s "
        "| charged beyond the clean run (err) | path: rank, share, state "
        "| clean step s | straggler step s | without s (err) | peer work/step clean, straggler run "
        "(peer slowed) | met |"
    )
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        v = verdicts(r)
        lines.append(
            f"| {r['strategy']} {r['rank']}:{r['factor']:g} | rank {r['top_cause']} "
            f"| {_f(r['injected_s'])} | {_f(r['charged_s'])} ({_f(r['raw_charged_error'], True)}) "
            f"| {_f(r['clean_charged_s'])} "
            f"| {_f(r['charged_s'] - r['clean_charged_s'])} ({_f(r['charged_error'], True)}) "
            f"| rank {r['path_rank']}, {_f(r['path_share'])}, {r['path_state']} "
            f"| {_f(r['clean_step_s'])} | {_f(r['straggler_step_s'])} "
            f"| {_f(r['without_s'])} ({_f(r['without_error'], True)}) "
            f"| {_f(r['peer_work_clean_s'])}, {_f(r['peer_work_straggler_s'])} "
            f"({_f(_rel(r['peer_work_straggler_s'], r['peer_work_clean_s']), True)}) "
            f"| {', '.join(k for k, ok in v.items() if ok) or 'none'}"
            f"{'' if all(v.values()) else ' / NOT ' + ', '.join(k for k, ok in v.items() if not ok)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--steps", type=int, default=6)  # 3 steps: one slow step moves a row 20 %
    p.add_argument("--factor", type=float, default=2.0)
    p.add_argument("--reuse", type=Path, default=None, help="DIR/index.json of an earlier call")
    a = p.parse_args(argv)
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    if a.reuse:
        index = json.loads((a.reuse / "index.json").read_text())
    else:
        out = a.out or Path(tempfile.mkdtemp(prefix="straggler-validation-"))
        index = make_runs(out, a.steps, a.factor)
    rows = [check(Path(v["clean"]), Path(v["straggler"])) for v in index.values()]
    load1 = Path("/proc/loadavg").read_text().split()[:3]
    print(table(rows))
    print(
        f"load (1, 5, 15 min) at start {' '.join(load0)}, at end {' '.join(load1)}; "
        f"{os.cpu_count()} CPUs"
    )
    print(json.dumps(rows, indent=1), file=sys.stderr)
    return 0 if all(all(verdicts(r).values()) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
