"""How the driver's time and memory grow with the number of ranks: in-process and on Dask.

Inputs (built in a temp dir by benchmarks/renumber.py, one rank count at a time, deleted after):
- ``hta`` (default): $TRACEKIT_CORPUS/hta/nccl_parser_config/nccl_data.json.gz, a real 2-rank
  A100/NCCL trace (rank 0: 9.8 MB of JSON, 40,573 events) copied to every rank, renumbered;
  the trace issue #17's first scale numbers were measured on.
- ``dp``: sample_traces/dp/traces/rank{0,1}.json.gz (real gloo CPU ranks, 3.7 MB of JSON each),
  alternating, renumbered.

Engines:
- ``in-process``: ``python -m tracekit.cli analyze DIR --no-cache --out TMP`` (threads, or
  tracekit's own worker processes when 3+ CPUs are idle: counted, they are the driver's tree);
- ``dask``: the same with ``--scheduler ADDR``, ADDR a local Dask cluster of 2 worker processes
  (1 thread each) started by this script before the measurements (``distributed.LocalCluster``,
  no dashboard). Its workers are not the driver's children, so they are not counted.

Each measurement is a fresh child measured by measure.py over its process tree: wall seconds,
CPU seconds (user + system of the child and its waited-for descendants: the steadier figure on
a shared machine) and peak RSS (sum of the tree's resident sets, sampled every 20 ms).
Printed: one row per (engine, ranks), then per engine the fitted growth with ranks
(least-squares slope of log(value) on log(ranks); 1.0 = linear) of wall time, CPU time and
peak RSS, and peak(largest) / peak(smallest), which issue #17 bounds by 1.5 for 16 -> 256 ranks.

    python benchmarks/scale.py                                  # 16 64 256 ranks, both engines
    python benchmarks/scale.py --ranks 16 64 --engines in-process --source dp
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import measure  # noqa: E402
import renumber  # noqa: E402
from corpus_path import corpus  # noqa: E402
from scaling import slope  # noqa: E402

SOURCES = {
    "hta": [Path("hta", "nccl_parser_config", "nccl_data.json.gz")],  # in TRACEKIT_CORPUS
    "dp": sorted((ROOT / "sample_traces" / "dp" / "traces").glob("rank*.json.gz")),
}
ENGINES = ("in-process", "dask")


def _sources(source: str) -> list[Path]:
    paths = SOURCES[source]
    return [corpus(*p.parts) for p in paths] if source == "hta" else paths


MIB = 2**20


@contextlib.contextmanager
def local_cluster(workers: int = 2) -> Iterator[str]:
    """The address of a local Dask cluster of ``workers`` processes, 1 thread each."""
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=workers,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        silence_logs=logging.ERROR,  # not the nanny's "still alive after 4 s, killing" at the end
    ) as cluster:
        yield cluster.scheduler_address


def json_bytes(files: list[Path]) -> int:
    total = 0
    for f in files:
        with gzip.open(f, "rb") as g:
            while chunk := g.read(1 << 24):
                total += len(chunk)
    return total


def measure_one(folder: Path, out: Path, scheduler: str | None, rounds: int) -> dict:
    """Median wall time and peak RSS of ``rounds`` fresh analyses of ``folder``."""
    cmd = [sys.executable, "-m", "tracekit.cli", "analyze", str(folder), "--no-cache"]
    cmd += ["--out", str(out)] + (["--scheduler", scheduler] if scheduler else [])
    env = {k: v for k, v in os.environ.items() if k != "TRACEKIT_SCHEDULER"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    samples = [measure.run(cmd, cwd=ROOT, env=env) for _ in range(rounds)]
    bad = next((s for s in samples if s.returncode != 0), None)
    return {
        "wall_s": statistics.median(s.wall_s for s in samples),
        "cpu_s": statistics.median(s.cpu_s for s in samples),
        "peak_rss": statistics.median(s.peak_rss for s in samples),
        "rc": bad.returncode if bad else 0,
        "stderr": bad.stderr[-2000:] if bad else "",
    }


def run(source: str, counts: list[int], engines: list[str], rounds: int) -> list[dict]:
    rows = []
    with contextlib.ExitStack() as stack:
        address = stack.enter_context(local_cluster()) if "dask" in engines else None
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tracekit-scale-")))
        for n in counts:
            folder = tmp / f"ranks{n}"
            files = renumber.build(_sources(source), n, folder)
            size = {
                "gz_bytes": sum(f.stat().st_size for f in files),
                "json_bytes": json_bytes(files),
            }
            for engine in engines:
                m = measure_one(folder, tmp / "out", address if engine == "dask" else None, rounds)
                rows.append({"source": source, "engine": engine, "ranks": n, **size, **m})
                print(_row(rows[-1]), flush=True)
                if m["rc"]:
                    print(m["stderr"], file=sys.stderr)
            shutil.rmtree(folder)
    return rows


def _row(r: dict) -> str:
    state = "ok" if r["rc"] == 0 else f"rc={r['rc']}"
    return (
        f"{r['engine']:>10} {r['ranks']:>6} {r['json_bytes'] / 1e9:>8.2f} {r['gz_bytes'] / 1e6:>8.0f}"
        f" {r['wall_s']:>8.2f} {r['cpu_s']:>7.2f} {r['peak_rss'] / MIB:>9.0f}  {state}"
    )


HEADER = f"{'engine':>10} {'ranks':>6} {'JSON GB':>8} {'gz MB':>8} {'wall s':>8} {'CPU s':>7} {'peak MiB':>9}"


def report(rows: list[dict]) -> None:
    print()
    print(
        f"{'engine':>10} {'slope(time)':>12} {'slope(cpu)':>11} {'slope(rss)':>11} {'peak last/first':>16}"
    )
    for engine in dict.fromkeys(r["engine"] for r in rows):
        ok = [r for r in rows if r["engine"] == engine and r["rc"] == 0]
        ns = [r["ranks"] for r in ok]
        t = slope(ns, [r["wall_s"] for r in ok])
        c = slope(ns, [r["cpu_s"] for r in ok])
        m = slope(ns, [r["peak_rss"] for r in ok])
        ratio = ok[-1]["peak_rss"] / ok[0]["peak_rss"] if len(ok) > 1 else None

        def f(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}"

        print(f"{engine:>10} {f(t):>12} {f(c):>11} {f(m):>11} {f(ratio):>16}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", choices=list(SOURCES), default="hta")
    ap.add_argument("--ranks", nargs="+", type=int, default=[16, 64, 256])
    ap.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    ap.add_argument("--rounds", type=int, default=1, help="measurements per row (median)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    print(HEADER, flush=True)
    rows = run(args.source, sorted(args.ranks), args.engines, args.rounds)
    report(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
