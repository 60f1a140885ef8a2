"""tracekit against HolisticTraceAnalysis on the same traces, in the same run: ``python benchmarks/run.py``.

For each case (benchmarks/inputs.py: ``replicated`` = 8 renumbered copies of a real 9.8 MB
A100/NCCL trace, 78 MB of JSON; ``large`` = 8 ranks x 30 MB; ``huge`` = 2 ranks x 405 MB, ``huge1`` =
1 rank x 2 GB, issue #29) and each round, in this order:

  A  tracekit, cold: ``python -m tracekit.cli analyze DIR --out TMP``, its cache entries
     deleted first (so it parses every file, and writes the cache as users' first run does)
  B  HTA: load (TraceAnalysis) + get_temporal_breakdown + get_comm_comp_overlap, in the
     benchmark's own venv (benchmarks/setup_hta_venv.sh; HTA is never a tracekit dependency)
  A' tracekit, warm: the same command again, its cache now filled
  F  the parse floor: read + gunzip + decode the same files and nothing else (floor.py),
     msgspec into tracekit's typed structs, orjson, and tracekit's own C scanner (kscan),
     with the worker processes tracekit uses

tracekit's modules are byte-compiled first (``compileall``), as a pip install does: a
machine with PYTHONDONTWRITEBYTECODE set would otherwise compile them from source on every run.

Each is one subprocess measured over its whole process tree (measure.py): wall time, CPU
(user+sys), peak RSS summed over the tree, sampled every 20 ms. The table reports medians over
the rounds and the ratios HTA / tracekit; run on a shared machine, the rounds interleave the
tools so that load hits both alike (the load average is printed with every row).

Options: ``--rounds N`` (default 3), ``--cases replicated,large``, ``--no-hta`` (skip HTA),
``--results DIR`` (default benchmarks/results: a JSON of every sample and a Markdown table).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import inputs  # noqa: E402
import measure  # noqa: E402

VENV_PY = HERE / ".venv" / "bin" / "python"
#: the parse floors measured (floor.py --parser); orjson only where it is installed
FLOORS = [p for p in ("msgspec", "orjson", "kscan") if p != "orjson" or find_spec("orjson")]


def ensure_hta() -> None:
    if not VENV_PY.exists():
        print("setting up the HTA venv (benchmarks/setup_hta_venv.sh) ...", file=sys.stderr)
        subprocess.run(["bash", str(HERE / "setup_hta_venv.sh")], check=True)


def tracekit_workers(files: list[Path]) -> int:
    """How many worker processes tracekit's ingest uses for these files (1 = in-process)."""
    sys.path.insert(0, str(ROOT))
    from tracekit.ingest.kineto import _default_workers

    return _default_workers(files)


def clear_cache(folder: Path, out: Path) -> None:
    """A cold start: no cache entry, and no earlier analysis in OUT whose tables it could reuse
    (tracekit.analysis_folder links the tables of an unchanged job instead of writing them)."""
    from tracekit.ingest import cache

    for f in folder.glob("*.json.gz"):
        cache.remove(f, out / "cache")
    shutil.rmtree(out, ignore_errors=True)


def run_tool(name: str, cmd: list[str], env: dict | None = None) -> dict:
    load = os.getloadavg()[0]
    s = measure.run(cmd, cwd=ROOT, env=env)
    if s.returncode != 0:
        raise SystemExit(
            f"{name} failed (exit {s.returncode}): {' '.join(cmd)}\n{s.stderr[-3000:]}"
        )
    return {
        "tool": name,
        "wall_s": s.wall_s,
        "cpu_s": max(s.cpu_s, s.sampled_cpu_s),
        "peak_rss": s.peak_rss,
        "peak_pss": s.peak_pss,
        "procs": s.max_procs,
        "load": load,
        "stdout": s.stdout[-4000:],
    }


def check_agreement(tk_out: Path, hta_stdout: str) -> dict:
    """Both tools saw the same job: per-rank idle % and comm/compute overlap % (HTA's
    definitions) within 1 point."""
    summary = json.loads((tk_out / "summary.json").read_text())
    hta = json.loads(hta_stdout.strip().splitlines()[-1])
    worst_idle = worst_overlap = 0.0
    for r, idle, ov in zip(hta["ranks"], hta["idle_pctg"], hta["overlap_pctg"]):
        row = next(x for x in summary["ranks"] if x["rank"] == r)
        worst_idle = max(worst_idle, abs(100 * row["idle_s"] / row["span_s"] - idle))
        worst_overlap = max(worst_overlap, abs(100 * row["overlap_s"] / row["comm_s"] - ov))
    return {
        "ranks": len(hta["ranks"]),
        "max_idle_diff_points": round(worst_idle, 3),
        "max_overlap_diff_points": round(worst_overlap, 3),
        "agree": worst_idle <= 1.0 and worst_overlap <= 1.0,
    }


def compile_tracekit() -> None:
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(ROOT / "tracekit")],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def bench_case(case: str, rounds: int, hta: bool) -> dict:
    folder = inputs.build(case)
    files = sorted(folder.glob("*.json.gz"))
    size = inputs.describe(folder)
    workers = tracekit_workers(files)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    samples: list[dict] = []
    agreement = None
    with tempfile.TemporaryDirectory(prefix="tkbench-") as tmp:
        out = Path(tmp) / "analysis"
        tk = [sys.executable, "-m", "tracekit.cli", "analyze", str(folder), "--out", str(out)]
        floor = [sys.executable, str(HERE / "floor.py"), "--workers", str(workers)]
        for rnd in range(rounds):
            print(f"[{case}] round {rnd + 1}/{rounds}", file=sys.stderr)
            clear_cache(folder, out)
            samples.append({"round": rnd, **run_tool("tracekit (cold)", tk, env)})
            if hta:
                samples.append(
                    {
                        "round": rnd,
                        **run_tool(
                            "HTA", [str(VENV_PY), str(HERE / "hta_analyze.py"), str(folder)], env
                        ),
                    }
                )
                if agreement is None:
                    agreement = check_agreement(out, samples[-1]["stdout"])
            samples.append({"round": rnd, **run_tool("tracekit (warm cache)", tk, env)})
            for parser in FLOORS:
                samples.append(
                    {
                        "round": rnd,
                        **run_tool(
                            f"floor ({parser})",
                            floor + ["--parser", parser] + [str(f) for f in files],
                            env,
                        ),
                    }
                )
        clear_cache(folder, out)
    return {
        "case": case,
        "files": size["files"],
        "json_bytes": size["json_bytes"],
        "gz_bytes": size["gz_bytes"],
        "workers": workers,
        "samples": samples,
        "agreement": agreement,
    }


def medians(samples: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for tool in dict.fromkeys(s["tool"] for s in samples):
        rows = [s for s in samples if s["tool"] == tool]
        out[tool] = {
            k: statistics.median(r[k] for r in rows)
            for k in ("wall_s", "cpu_s", "peak_rss", "peak_pss", "load")
        }
        out[tool]["n"] = len(rows)
        out[tool]["wall_range"] = (min(r["wall_s"] for r in rows), max(r["wall_s"] for r in rows))
    return out


def table(results: list[dict]) -> str:
    lines = [
        "| case | tool | wall s (median, min-max) | CPU s | peak RSS MB | peak PSS MB | HTA/tool wall | HTA/tool RSS "
        "| tool/floor wall (msgspec) | tool/floor wall (kscan) | MB/s per core | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        m = medians(res["samples"])
        hta = m.get("HTA")
        floor, scan_floor = m.get("floor (msgspec)"), m.get("floor (kscan)")
        label = (
            f"{res['case']} ({res['files']} x {res['json_bytes'] / res['files'] / 1e6:.1f} MB JSON)"
        )
        for tool, v in m.items():
            ratio = f"{hta['wall_s'] / v['wall_s']:.1f}x" if hta and tool != "HTA" else ""
            mem = f"{hta['peak_rss'] / v['peak_rss']:.1f}x" if hta and tool != "HTA" else ""
            vs_floor, vs_scan = (
                f"{v['wall_s'] / f['wall_s']:.2f}" if f and not tool.startswith("floor") else ""
                for f in (floor, scan_floor)
            )
            lo, hi = v["wall_range"]
            rate = res["json_bytes"] / 1e6 / v["cpu_s"] if v["cpu_s"] else 0.0  # JSON per CPU-s
            lines.append(
                f"| {label} | {tool} | {v['wall_s']:.2f} ({lo:.2f}-{hi:.2f}) | {v['cpu_s']:.2f} | "
                f"{v['peak_rss'] / 2**20:.0f} | {v['peak_pss'] / 2**20:.0f} | {ratio} | {mem} | {vs_floor} | {vs_scan} | {rate:.0f} | {v['load']:.1f} |"
            )
            label = ""
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default="replicated,large")
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--results", type=Path, default=HERE / "results")
    a = ap.parse_args()
    if not a.no_hta:
        ensure_hta()
    compile_tracekit()
    started = time.strftime("%Y%m%d-%H%M%S")
    results = [bench_case(c, a.rounds, not a.no_hta) for c in a.cases.split(",")]
    text = table(results)
    notes = [
        f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, {a.rounds} rounds (A B A B: "
        "tracekit cold, HTA, tracekit warm, floors), medians; load = 1-min load average at the start of each run",
        "MB/s per core: MB of JSON per CPU-second of the whole process tree; Perfetto's trace "
        "processor imports JSON at about 177 MB/s on one core (its PR 1641: 454 MB in 2.56 s)",
    ]
    for r in results:
        ag = r["agreement"]
        if ag:
            notes.append(
                f"{r['case']}: tracekit and HTA agree on all {ag['ranks']} ranks: idle within "
                f"{ag['max_idle_diff_points']} points, comm/compute overlap within {ag['max_overlap_diff_points']} points"
            )
        notes.append(
            f"{r['case']}: tracekit parsed with {r['workers']} worker process(es)"
            + (
                f" (in-process, in up to {os.cpu_count()} threads: one per idle CPU)"
                if r["workers"] == 1
                else ""
            )
            + "; the floors used the same number of processes"
        )
    report = text + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    print(report)
    a.results.mkdir(parents=True, exist_ok=True)
    (a.results / f"{started}.md").write_text(report)
    (a.results / f"{started}.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"wrote {a.results / started}.md and .json", file=sys.stderr)


if __name__ == "__main__":
    main()
