"""How much a rank's compute slows while the other ranks compute: the co-run probe (#28).

A rank can run slower beside its peers without ever waiting for a CPU: CPUs that share a core's
execution units (SMT siblings, or a hypervisor's vCPUs backed by one core) split its throughput.
Linux schedstat sees nothing (the thread is on a CPU all along), so the contention meter reports
an idle machine, yet every compute time that ran beside another rank's compute is inflated.
Ranks that take turns on too few CPUs slow each other the same way, and the meter sees that
one as waiting too. Measured on this project's 2-vCPU machine: 4 ranks on the 2 CPUs 1.7-2.2x;
2 ranks pinned one to each CPU 0.94-1.06x in six runs, though a 40 s series of 150 ms probes
(benchmarks/corun_series.py) shows the two vCPUs slowing each other for moments now and then
(1.48, 1.61 and 1.85x among 110 pairs, the rest 0.76-1.26x): hence five rounds and the median.

The probe runs on every rank of the job, on the cores the rank was given, before the first step:

    alone_s[r]    seconds per matmul of the probe on rank r while every other rank waits at a
                  barrier (matmuls counted over a WINDOW_S window: longer than a scheduler's
                  slice, so ranks that take turns on too few CPUs show as such)
    together_s[r] seconds per matmul while every rank runs the probe at once
    slowdown[r]   median over rounds of together_s[r] / alone_s[r]

1 means ranks do not slow each other's compute; 2 means two ranks computing at once each run at
half speed. Where it is well above 1, a rank's compute time depends on what the others did
meanwhile: a what-if that removes one rank's work (``predict --without-straggler``) keeps the
others' work as it was measured, beside that rank, so it overstates the step it predicts.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

#: the probe: float32 matmuls of N x N by N x 2N (about 1 ms each on one thread here), as many
#: as fit in WINDOW_S, on the rank's own threads
N = 256
WINDOW_S = 0.04
ROUNDS = 5


def _probe(a: torch.Tensor, b: torch.Tensor) -> float:
    """Seconds per matmul over a WINDOW_S window (wall time: waiting for a CPU counts)."""
    n, t0 = 0, time.perf_counter()
    while (t := time.perf_counter()) - t0 < WINDOW_S:
        torch.mm(a, b)
        n += 1
    return (t - t0) / n


def measure(group: dist.ProcessGroup, device: torch.device) -> dict[str, Any] | None:
    """This rank's co-run figures (module docstring), or None with one rank or off CPU (GPU
    ranks compute on their devices; the probe measures CPUs). Every rank of ``group`` calls it."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if world < 2 or device.type != "cpu":
        return None
    g = torch.Generator().manual_seed(rank)
    a, b = torch.randn(N, N, generator=g), torch.randn(N, 2 * N, generator=g)
    torch.mm(a, b)  # warm: the allocator and the kernel's first call
    alone: list[float] = []
    together: list[float] = []
    for _ in range(ROUNDS):
        for turn in range(world):  # one rank at a time; the others block in the barrier
            dist.barrier(group=group)
            if turn == rank:
                alone.append(_probe(a, b))
        dist.barrier(group=group)
        together.append(_probe(a, b))
    dist.barrier(group=group)
    ratios = [t / s for t, s in zip(together, alone, strict=True) if s > 0]
    return {
        "alone_s": statistics.median(alone),
        "together_s": statistics.median(together),
        "slowdown": statistics.median(ratios) if ratios else None,
        "ranks": world,
        "rounds": ROUNDS,
        "probe": f"mm({N}x{N}, {N}x{2 * N}) float32 for {WINDOW_S:g} s, "
        f"{torch.get_num_threads()} thread(s)",
    }
