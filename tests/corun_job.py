"""The co-run probe (tracekit.capture.corun) in a real gloo job, its placement planted.

    PYTHONPATH=. torchrun --standalone --nproc-per-node N tests/corun_job.py OUT PLACEMENT

PLACEMENT ``shared``: every rank pinned to the first usable CPU, so ranks computing at once take
turns on it (the cause we plant); ``own``: each rank on its own CPU. Each rank writes
OUT/corun<rank>.json: the probe's figures (null where it does not apply).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tracekit.capture import corun


def main() -> None:
    out, placement = Path(sys.argv[1]), sys.argv[2]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[0] if placement == "shared" else cpus[rank % len(cpus)]})
    got = corun.measure(dist.group.WORLD, torch.device("cpu"))
    (out / f"corun{rank}.json").write_text(json.dumps(got))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
