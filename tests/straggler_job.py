"""A real 2-rank gloo job with a straggler we plant, for the why-analysis's ground truth.

    PYTHONPATH=. torchrun --standalone --nproc-per-node 2 tests/straggler_job.py RUN_DIR FACTOR

Per step each rank does UNITS matmuls in a ``forward`` label (rank 1: FACTOR x UNITS, its extra in
a ``backward`` label) and then an all_reduce, under
the torch profiler. Each rank times its own matmuls; rank 0 writes them, per rank and step, to
RUN_DIR/straggler.json ("compute_s": [[rank 0's steps], [rank 1's steps]]): the extra compute
of rank 1 is what the analysis must charge to it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tracekit import capture, labels, runfolder

STEPS = 5
UNITS = 8
N = 448


def main() -> None:
    run, factor = Path(sys.argv[1]), float(sys.argv[2])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    a = torch.randn(N, N)
    grad = torch.ones(4096)
    units = round(UNITS * (factor if rank == 1 else 1.0))
    times: list[float] = []
    for k in range(1 + STEPS):  # one unprofiled warm-up step, then the profiled ones
        if k == 1:
            prof_cm = capture.profile_steps(run, rank, STEPS)
            prof = prof_cm.__enter__()
            dist.barrier()  # the ranks' profilers start at different times: line them up
        t0 = time.perf_counter()
        x = a
        # real compute (aten::mm in the trace): the same in "forward" on both ranks, rank 1's
        # extra in "backward" (tracekit's phase labels), so the extra is charged to backward
        with torch.profiler.record_function(labels.FORWARD):
            for _ in range(min(units, UNITS)):
                x = torch.tanh(x @ a)
        with torch.profiler.record_function(labels.BACKWARD):
            for _ in range(units - min(units, UNITS)):
                x = torch.tanh(x @ a)
        t1 = time.perf_counter()
        dist.all_reduce(grad)
        grad.div_(2.0)
        if k >= 1:
            times.append(t1 - t0)
            prof.step()
    prof_cm.__exit__(None, None, None)
    everyone: list = [None] * world
    dist.all_gather_object(everyone, times)
    if rank == 0:
        (run / "straggler.json").write_text(json.dumps({"factor": factor, "compute_s": everyone}))
        runfolder.write_json_atomic(
            runfolder.run_json_path(run),
            {
                "schema_version": runfolder.RUN_SCHEMA_VERSION,
                "strategy": "straggler-test",
                "world_size": world,
                "backend": "gloo",
                "device": "cpu",
                "status": "ok",
                "errors": [],
                "config": {},
            },
        )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
