"""Do two CPUs slow each other's compute? A series of probes, alone and beside a busy neighbour.

    python benchmarks/corun_series.py [--pairs 110] [--window 0.15] [--cpus 0,1]

A single-thread matmul (tracekit.capture.corun's probe shape) on the first CPU, timed over
WINDOW seconds alone, then while a second process runs the same matmul pinned to the other CPU;
PAIRS times in a row. Prints each pair's ratio (beside / alone) and their spread: 1 where the
CPUs do not share a core's units. The neighbour is pinned and warmed before the series starts
(a neighbour still importing torch on the measuring CPU made an earlier version read 2.2x).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

N = 256


def _rate(a: torch.Tensor, b: torch.Tensor, window: float) -> float:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < window:
        torch.mm(a, b)
        n += 1
    return (time.perf_counter() - t0) / n


def _neighbour(cpu: int) -> None:
    """Pinned to ``cpu``; runs the probe for each window read from stdin, says when done."""
    os.sched_setaffinity(0, {cpu})
    a, b = torch.randn(N, N), torch.randn(N, 2 * N)
    print("ready", flush=True)
    for line in sys.stdin:
        _rate(a, b, float(line))
        print("done", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=110)
    p.add_argument("--window", type=float, default=0.15)
    p.add_argument("--cpus", default="0,1")
    p.add_argument("--neighbour", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.neighbour is not None:
        return _neighbour(a.neighbour)
    mine, other = (int(c) for c in a.cpus.split(","))
    os.sched_setaffinity(0, {mine})
    x, y = torch.randn(N, N), torch.randn(N, 2 * N)
    cmd = [sys.executable, __file__, "--neighbour", str(other)]
    with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as nb:
        assert nb.stdin is not None and nb.stdout is not None
        nb.stdout.readline()
        ratios = []
        for _ in range(a.pairs):
            alone = _rate(x, y, a.window)
            nb.stdin.write(f"{a.window + 0.05}\n")
            nb.stdin.flush()
            time.sleep(0.02)  # the neighbour is computing
            ratios.append(_rate(x, y, a.window) / alone)
            nb.stdout.readline()
        nb.stdin.close()
    print(" ".join(f"{r:.2f}" for r in ratios))
    q = statistics.quantiles(ratios, n=20)
    print(
        f"pairs {len(ratios)}: median {statistics.median(ratios):.2f}, 5-95 % {q[0]:.2f}-{q[-1]:.2f}, "
        f"max {max(ratios):.2f}, above 1.25: {sum(r > 1.25 for r in ratios)}"
    )


if __name__ == "__main__":
    main()
