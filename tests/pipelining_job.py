"""A user's own pipeline job, written with torch.distributed.pipelining (not tracekit's runs).

    PYTHONPATH=. torchrun --nproc-per-node 2 tests/pipelining_job.py OUT

Trains the shared GPT cut into stages with two of torch's schedules, each under a plain
``torch.profiler.profile`` (2 profiled steps, ProfilerStep markers), and writes the traces a user
would bring: ``OUT/gpipe/rank<R>.json`` (ScheduleGPipe, one stage per rank: labels
``Forward i`` / ``Backward i``) and ``OUT/interleaved/rank<R>.json`` (ScheduleInterleaved1F1B, two
stages per rank: labels ``PP:<stage>F<mb>``, ``PP:<stage>B<mb>``, ``PP:<stage>SEND_F<mb>``, ...).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe, ScheduleInterleaved1F1B

from instrumented_runs.data import global_batch
from instrumented_runs.model import GPTConfig, loss_fn, make_optimizer
from instrumented_runs.pipeline import Stage

MICROBATCHES, BATCH, WARMUP, STEPS = 4, 8, 1, 2


def train(kind: str, out: Path, rank: int, world: int) -> None:
    cfg = GPTConfig()
    per_rank = 2 if kind == "interleaved" else 1
    stages_total = world * per_rank
    ids = [rank + world * i for i in range(per_rank)]  # looped placement: rank r holds r, r+world
    modules = [Stage(cfg, 0, s, stages_total) for s in ids]
    stages = [
        PipelineStage(mod, s, stages_total, torch.device("cpu")) for mod, s in zip(modules, ids)
    ]
    if kind == "gpipe":
        schedule = ScheduleGPipe(stages[0], n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    else:
        schedule = ScheduleInterleaved1F1B(stages, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    optimizer = make_optimizer([p for mod in modules for p in mod.parameters()])
    first, last = 0 in ids, stages_total - 1 in ids

    def step(k: int) -> None:
        tokens, targets = global_batch(k, cfg, BATCH)
        optimizer.zero_grad(set_to_none=True)
        args = [tokens] if first else []
        schedule.step(*args, target=targets if last else None)
        optimizer.step()

    for k in range(WARMUP):
        step(k)
    dist.barrier()
    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        record_shapes=True,
        schedule=torch.profiler.schedule(wait=0, warmup=0, active=STEPS, repeat=1),
    )
    with prof:
        for k in range(WARMUP, WARMUP + STEPS):
            step(k)
            prof.step()
    (out / kind).mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out / kind / f"rank{rank}.json"))
    dist.barrier()


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for kind in ("gpipe", "interleaved"):
        train(kind, out, rank, world)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
