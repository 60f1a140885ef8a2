"""Cost of tracekit.profile on one CPU process, and how fast an oversized trace is refused.

    python benchmarks/profile_api.py

Step time: a 4-layer MLP (width 1024, batch 64) forward+backward+SGD, median over the active
steps, profiled (record_shapes, profile_memory, no stacks) vs the same steps unprofiled,
alternating rounds so that load from other processes hits both alike. Start/stop: wall time of
entering the block (run folder, run.json) and of leaving it (trace export, flight recorder).
Refusal: read_trace on a sparse file 8x this machine's available memory (nothing read).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

import tracekit
from tracekit.errors import TracekitError
from tracekit.ingest import read_trace
from tracekit.ingest.kineto_files import _available_memory


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 1024)

    def step() -> float:
        t0 = time.perf_counter()
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return time.perf_counter() - t0

    for _ in range(5):
        step()
    plain, profiled, enter, leave = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(5):
            plain += [step() for _ in range(10)]
            t0 = time.perf_counter()
            prof = tracekit.profile(tmp, wait=0, warmup=1, active=10).__enter__()
            enter.append(time.perf_counter() - t0)
            step()
            prof.step()
            for _ in range(10):
                profiled.append(step())
                prof.step()
            t0 = time.perf_counter()
            prof.__exit__(None, None, None)
            leave.append(time.perf_counter() - t0)
        size = os.path.getsize(next(Path(tmp).glob("user-*/traces/rank0.json.gz")))
        p, q = statistics.median(plain), statistics.median(profiled)
        print(
            f"step: plain {p * 1e3:.2f} ms, profiled {q * 1e3:.2f} ms, overhead {100 * (q / p - 1):+.1f} %"
        )
        print(
            f"enter {statistics.median(enter) * 1e3:.0f} ms, leave (export 10 steps, {size / 1e6:.2f} MB gz) "
            f"{statistics.median(leave) * 1e3:.0f} ms"
        )
        big = Path(tmp) / "rank0.json"
        with open(big, "wb") as f:
            f.truncate(8 * (_available_memory() or 2**34))
        t0 = time.perf_counter()
        try:
            read_trace(big)
        except TracekitError as err:
            print(
                f"refused a {big.stat().st_size / 1e9:.0f} GB sparse trace in {(time.perf_counter() - t0) * 1e3:.2f} ms: {err}"
            )


if __name__ == "__main__":
    main()
