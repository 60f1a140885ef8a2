"""How time and memory grow with a trace's length: one rank repeated 1, 4, 16, 64 times in time.

Inputs (built in a temp dir, never kept):
- ``cpu``: sample_traces/dp/traces/rank0.json.gz (a real gloo CPU rank, 2 steps).
- ``gpu``: tests/data/gpu/dp-cuda-nccl/traces/rank0.json.gz (a real CUDA/NCCL rank).
Each is repeated k times one after another in time by benchmarks/inputs.py's generator
(``ts`` shifted by the trace's span plus 1 ms, ``ProfilerStep#N`` renumbered, correlation /
External id / flow ids offset), written as valid Kineto JSON, and analysed in a fresh
subprocess ``tracekit analyze X --no-cache --out TMP``.

Measured per run: wall seconds (perf_counter around the child) and peak RSS of the child
(``os.wait4``'s ru_maxrss: the largest resident set of the child or any descendant it waited
for). A watchdog kills a child whose resident set passes ``--limit-mb`` (default 6000) so a
quadratic build can never take a shared machine down; such a run is reported as ``killed``.

Printed: one table row per (input, k), and per input the growth exponent of memory and of
time: the least-squares slope of log(value) against log(k) (1.0 = linear in the trace). The
peak is the raw one, interpreter and libraries included (a constant that pulls the slope below
1 at small k), so the slope over the last two factors, where that constant matters least, is
printed too.

    python benchmarks/scaling.py                 # cpu and gpu, k = 1 4 16 64
    python benchmarks/scaling.py --inputs cpu --factors 1 4 16 --limit-mb 6000
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import inputs  # noqa: E402
from measure import _rss  # noqa: E402 - a process's resident set, as measure.py samples it

SOURCES = {
    "cpu": HERE.parent / "sample_traces" / "dp" / "traces" / "rank0.json.gz",
    "gpu": HERE.parent / "tests" / "data" / "gpu" / "dp-cuda-nccl" / "traces" / "rank0.json.gz",
}


def build(source: Path, copies: int, folder: Path) -> Path:
    """``folder``/rank0.json.gz: the source's events repeated ``copies`` times in time."""
    folder.mkdir(parents=True, exist_ok=True)
    trace = json.loads(gzip.decompress(source.read_bytes()))
    trace["traceEvents"] = inputs._events(trace, copies)
    inputs.write_trace(trace, folder / "rank0.json.gz")
    return folder


def build_in_child(source: Path, copies: int, folder: Path) -> int:
    """build() in a child process; returns the input's JSON bytes. A parent grown by building
    would be copied into every analysis child it forks, and counted in that child's ru_maxrss."""
    built = subprocess.run(
        [sys.executable, __file__, "--build", str(source), str(copies), str(folder)],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(built.stdout.split()[-1])


def measure(cmd: list[str], limit_bytes: int, timeout_s: float = 1800) -> dict:
    """Run ``cmd``; wall seconds, peak RSS (bytes), exit code, whether the watchdog killed it."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    killed, done = threading.Event(), threading.Event()

    def watch() -> None:  # never reaps the child (wait4 below does), so its pid stays its own
        while not done.wait(0.02):
            if _rss(proc.pid) > limit_bytes or time.perf_counter() - t0 > timeout_s:
                killed.set()
                proc.kill()
                return

    watchdog = threading.Thread(target=watch, daemon=True)
    watchdog.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    done.set()
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    watchdog.join()
    return {
        "wall_s": wall,
        "peak_rss": usage.ru_maxrss * 1024,  # Linux reports KiB
        "rc": proc.returncode,
        "killed": killed.is_set(),
        "stderr": err[-2000:],
    }


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log(y) on log(x); None with fewer than two points."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else None


def run(names: list[str], factors: list[int], limit_mb: int) -> list[dict]:
    rows = []
    exe = [sys.executable, "-m", "tracekit.cli"]
    with tempfile.TemporaryDirectory(prefix="tracekit-scaling-") as tmp:
        for name in names:
            for k in factors:
                folder = Path(tmp) / f"{name}-x{k}"
                size = build_in_child(SOURCES[name], k, folder)
                out = Path(tmp) / f"{name}-x{k}-out"
                m = measure(
                    [*exe, "analyze", str(folder), "--no-cache", "--out", str(out)],
                    limit_mb * 1_000_000,
                )
                rows.append({"input": name, "k": k, "json_bytes": size, **m})
                print(_row(rows[-1]), flush=True)
                if m["rc"] != 0 and not m["killed"]:
                    print(m["stderr"], file=sys.stderr)
    return rows


def _row(r: dict) -> str:
    state = "killed (over limit)" if r["killed"] else ("ok" if r["rc"] == 0 else f"rc={r['rc']}")
    return (
        f"{r['input']:>4} {r['k']:>4}x {r['json_bytes'] / 1e6:>9.1f} MB JSON "
        f"{r['wall_s']:>8.2f} s {r['peak_rss'] / 1e6:>9.0f} MB peak RSS  {state}"
    )


def report(rows: list[dict]) -> None:
    print()
    print(f"{'input':>5} {'exponent(time)':>15} {'exponent(rss)':>14} {'last-two rss':>13}")
    for name in dict.fromkeys(r["input"] for r in rows):
        ok = [r for r in rows if r["input"] == name and r["rc"] == 0]
        ks = [r["k"] for r in ok]
        t = slope(ks, [r["wall_s"] for r in ok])
        m = slope(ks, [r["peak_rss"] for r in ok])
        m2 = slope(ks[-2:], [r["peak_rss"] for r in ok[-2:]])

        def f(v: float | None) -> str:
            return "–" if v is None else f"{v:.2f}"

        print(f"{name:>5} {f(t):>15} {f(m):>14} {f(m2):>13}")
        by_k = {r["k"]: r for r in ok}
        if 4 in by_k and 16 in by_k:
            ratio = by_k[16]["peak_rss"] / by_k[4]["peak_rss"]
            print(f"{'':>5} peak RSS 16x / 4x = {ratio:.2f}")


def main() -> None:
    if sys.argv[1:2] == ["--build"]:  # internal: build one input, print its JSON bytes
        folder = build(Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
        print(sum(len(gzip.decompress(f.read_bytes())) for f in folder.glob("*.json.gz")))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", nargs="+", default=list(SOURCES), choices=list(SOURCES))
    ap.add_argument("--factors", nargs="+", type=int, default=[1, 4, 16, 64])
    ap.add_argument("--limit-mb", type=int, default=6000, help="kill a child above this RSS")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    rows = run(args.inputs, args.factors, args.limit_mb)
    report(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
