"""The harness's contention hook (issue #27): each rank samples its own CPU contention around
every step (tracekit.capture.contention) and writes contention/rank<R>.json when it finishes.

Pinning: when the machine has at least as many usable cores as local ranks, each rank is pinned
to its own share of them (os.sched_setaffinity), so ranks stop taking each other's CPU; set
TRACEKIT_PIN=0 to leave the scheduler free. What was done is recorded in the rank's file, with
the co-run probe's figures (tracekit.capture.corun: how much the rank's compute slows while the
others compute, measured on its cores before the first step)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from tracekit.capture import contention, corun


class _Meter:
    """A harness StepMeter: samples around each step, adds nothing to memory/rank<R>.json."""

    def __init__(self) -> None:
        self.inner = contention.ContentionMeter()

    @contextmanager
    def step(self, k: int) -> Iterator[None]:
        with self.inner.step(k):
            yield

    def memory(self, warmup: int) -> dict[str, Any]:
        return {}


def attach(ctx: Any) -> None:
    """Pin (unless TRACEKIT_PIN=0), then meter every step of ``ctx`` (a harness Context)."""
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    before = contention.machine()  # before pinning: the cores the machine offers
    pinned = None
    if os.environ.get("TRACEKIT_PIN", "1") != "0":
        pinned = contention.pin_cores(ctx.local_rank, local_ranks)
    corun_figures = corun.measure(ctx.meta_group, ctx.device)  # on the cores just pinned
    meter = _Meter()
    ctx.meter_steps(meter)

    def write() -> None:
        data = meter.inner.record(ctx.args.warmup)
        data.update(
            threads=torch.get_num_threads(),
            local_ranks=local_ranks,
            pinned=pinned,
            machine=before,
            corun=corun_figures,
            loadavg_after=contention.machine()["loadavg"],
        )
        contention.write_contention(ctx.run, ctx.rank, data)

    ctx.at_finish(write)
