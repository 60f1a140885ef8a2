"""A small real gloo job for the matching tests: 4 ranks, two 2x2 families of process groups.

    PYTHONPATH=. torchrun --standalone --nproc-per-node 4 tests/groups_job.py RUN_DIR

"row" groups {0,1}, {2,3} (a new_group with a description) and "col" groups {0,2}, {1,3} (no
description): per step an all_reduce on each, an all_gather_into_tensor and a reduce_scatter
(gloo: an all_reduce of the whole input) on the rows, a broadcast on the columns, a send/recv
pair 0 -> 1 and 3 -> 2 on the world group, and a world barrier. Rank 1 sleeps before the row
all_reduce so that rank 0 waits for it (a known synchronisation wait). Writes the traces,
flight-recorder dumps and a run.json with ``strategy_options.process_groups``, as the harness does.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tracekit import capture, runfolder

STEPS = 3
ELEMS = 4096
SLEEP_S = 0.03


def main() -> None:
    run = Path(sys.argv[1])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = [dist.new_group([0, 1], group_desc="row0"), dist.new_group([2, 3], group_desc="row1")]
    cols = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    row, col = rows[rank // 2], cols[rank % 2]
    x = torch.ones(ELEMS)
    gathered = torch.empty(2 * ELEMS)
    shard = torch.empty(ELEMS // 2)
    for k in range(1 + STEPS):  # one unprofiled warm-up step, then the profiled ones
        if k == 1:
            prof_cm = capture.profile_steps(run, rank, STEPS)
            prof = prof_cm.__enter__()
        if rank == 1:
            time.sleep(SLEEP_S)
        dist.all_reduce(x, group=row)
        dist.all_reduce(x, group=col)
        dist.all_gather_into_tensor(gathered, x, group=row)
        dist.reduce_scatter_tensor(shard, x, group=row)
        dist.broadcast(x, src=col_src(rank), group=col)
        if rank in (0, 3):
            dist.send(x, dst=1 if rank == 0 else 2)
        elif rank in (1, 2):
            dist.recv(x, src=0 if rank == 1 else 3)
        dist.barrier()
        x.div_(4.0)
        if k >= 1:
            prof.step()
    prof_cm.__exit__(None, None, None)
    capture.dump_flight_recorder(run, rank)
    groups = [
        {"name": dist._get_process_group_name(g), "desc": d, "dim": dim, "ranks": r}
        for g, d, dim, r in (
            (rows[0], "row0", "row", [0, 1]),
            (rows[1], "row1", "row", [2, 3]),
            (cols[0], None, "col", [0, 2]),
            (cols[1], None, "col", [1, 3]),
        )
        if g is not None and g != dist.GroupMember.NON_GROUP_MEMBER
    ]
    everyone: list = [None] * world
    dist.all_gather_object(everyone, groups)
    if rank == 0:
        merged = {g["name"]: g for gs in everyone for g in gs}
        runfolder.write_json_atomic(
            runfolder.run_json_path(run),
            {
                "schema_version": runfolder.RUN_SCHEMA_VERSION,
                "strategy": "groups-test",
                "world_size": world,
                "backend": "gloo",
                "device": "cpu",
                "status": "ok",
                "errors": [],
                "config": {
                    "strategy_options": {
                        "process_groups": sorted(merged.values(), key=lambda g: g["name"])
                    }
                },
                "topology": [
                    {"rank": r, "node": r // 2, "host": "vm", "local_rank": r % 2}
                    for r in range(world)
                ],
            },
        )
    dist.barrier()
    dist.destroy_process_group()


def col_src(rank: int) -> int:
    return rank % 2  # the column's first rank: 0 in {0,2}, 1 in {1,3}


if __name__ == "__main__":
    main()
