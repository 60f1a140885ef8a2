"""One big rank held or read in parts (issue #29): the same analysis, side by side in one run.

    python benchmarks/rank_memory.py [--cases huge,huge1] [--rounds 1] [--setting 256M]

For each case (benchmarks/inputs.py) and round: ``tracekit analyze DIR --no-cache`` with
``TRACEKIT_RANK_MEMORY=1T`` (every rank held: the read before #29) and with ``--setting`` (ranks
over it read in parts), each a subprocess measured over its whole process tree (measure.py);
their summary.json must be identical. A case's held run is skipped when its JSON per rank is
over a quarter of the available memory (``--held-max``): it would not fit beside the others.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import inputs  # noqa: E402
import measure  # noqa: E402

PERFETTO_MB_S = 177  # its trace processor's JSON import on one core (PR 1641: 454 MB in 2.56 s)


def _run(folder: Path, out: Path, setting: str) -> dict:
    env = dict(os.environ, TRACEKIT_RANK_MEMORY=setting, PYTHONPATH=str(ROOT))
    cmd = [
        sys.executable,
        "-m",
        "tracekit",
        "analyze",
        str(folder),
        "--no-cache",
        "--out",
        str(out),
    ]
    s = measure.run(cmd, cwd=ROOT, env=env)
    if s.returncode != 0:
        raise SystemExit(f"tracekit failed (exit {s.returncode}):\n{s.stderr[-3000:]}")
    return {"wall_s": s.wall_s, "cpu_s": max(s.cpu_s, s.sampled_cpu_s), "peak": s.peak_rss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="huge")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--setting", default="256M")
    ap.add_argument("--held-max", type=float, default=0.25)
    a = ap.parse_args()
    print("| case | read | wall s | CPU s | peak RSS MB (tree) | MB/s per core | load |")
    print("|---|---|---|---|---|---|---|")
    for case in a.cases.split(","):
        folder = inputs.build(case)
        size = inputs.describe(folder)
        per_rank = size["json_bytes"] / size["files"]
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        modes = [("parts", a.setting)]
        if per_rank <= a.held_max * avail:
            modes.insert(0, ("held", "1T"))
        label = f"{case} ({size['files']} x {per_rank / 1e6:.0f} MB JSON)"
        with tempfile.TemporaryDirectory(prefix="tkrank-") as tmp:
            for rnd in range(a.rounds):
                summaries = []
                for name, setting in modes:
                    load = os.getloadavg()[0]
                    out = Path(tmp) / f"{name}-{rnd}"
                    r = _run(folder, out, setting)
                    summaries.append((out / "summary.json").read_bytes())
                    rate = size["json_bytes"] / 1e6 / r["cpu_s"]
                    print(
                        f"| {label} | {name} ({setting}) | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | "
                        f"{r['peak'] / 2**20:.0f} | {rate:.0f} | {load:.1f} |",
                        flush=True,
                    )
                    label = ""
                if len(set(summaries)) != 1:
                    raise SystemExit(f"{case}: summary.json differs between held and parts")
    print(f"\nPerfetto's trace processor: {PERFETTO_MB_S} MB/s per core (its PR 1641)")


if __name__ == "__main__":
    main()
