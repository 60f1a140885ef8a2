"""Which gloo collectives take CUDA tensors in this torch build (two ranks sharing one GPU).

Run: python scripts/gpu_gloo_probe.py   (prints one line per collective: ok, or the error)
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _cases(rank: int, world: int, dev: torch.device) -> dict:
    x = torch.full((1024,), float(rank + 1), device=dev)

    def send_recv() -> None:
        buf = torch.empty_like(x)
        if rank == 0:
            dist.send(x, dst=1)
        else:
            dist.recv(buf, src=0)
            assert buf[0].item() == 1.0

    def isend_irecv() -> None:
        buf = torch.empty_like(x)
        (dist.isend(x, dst=1) if rank == 0 else dist.irecv(buf, src=0)).wait()

    return {
        "all_reduce": lambda: dist.all_reduce(x.clone()),
        "all_reduce async": lambda: dist.all_reduce(x.clone(), async_op=True).wait(),
        "broadcast": lambda: dist.broadcast(x.clone(), src=0),
        "all_gather (list)": lambda: dist.all_gather(
            [torch.empty_like(x) for _ in range(world)], x
        ),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(
            torch.empty(world * 1024, device=dev), x
        ),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(
            torch.empty(512, device=dev), x.clone()
        ),
        "barrier": lambda: dist.barrier(),
        "send/recv": send_recv,  # last: a one-sided failure here can only time out
        "isend/irecv": isend_irecv,
    }


def _rank(rank: int, world: int, first: int, log: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    for name, call in list(_cases(rank, world, dev).items())[first:]:
        if rank == 0:
            with open(log, "a") as f:
                f.write(f"{name}\tstarted\n")
        try:
            call()
            torch.cuda.synchronize()
            result = "ok"
        except Exception as exc:  # noqa: BLE001 - the point is to report every failure
            result = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        if rank == 0:
            with open(log, "a") as f:
                f.write(f"{name}\t{result}\n")
    dist.destroy_process_group()


def main() -> None:
    """Each case once; a case that aborts the process (gloo raises in a C++ thread) is reported
    as such and the rest run in fresh processes."""
    log = "/tmp/gloo_probe.log"
    open(log, "w").close()
    n = len(_cases(0, 2, torch.device("cpu")))
    first = 0
    while first < n:
        try:
            mp.spawn(_rank, args=(2, first, log, 29533 + first), nprocs=2, join=True)
        except Exception as exc:  # noqa: BLE001
            print(f"(processes ended: {str(exc).splitlines()[0][:120]})", file=sys.stderr)
        done = [line.rstrip("\n").split("\t", 1) for line in open(log)]
        results = {k: v for k, v in done if v != "started"}
        started = [k for k, v in done if v == "started"]
        for k in started:
            if k not in results:
                results[k] = "process aborted"
                with open(log, "a") as f:
                    f.write(f"{k}\tprocess aborted\n")
        names = list(_cases(0, 2, torch.device("cpu")))
        first = max([names.index(k) for k in results] + [first - 1]) + 1
        if not started:
            break
    for line in open(log):
        k, v = line.rstrip("\n").split("\t", 1)
        if v != "started":
            print(f"gloo on cuda  {k:24s} {v}", flush=True)


if __name__ == "__main__":
    print("torch", torch.__version__, file=sys.stderr)
    main()
