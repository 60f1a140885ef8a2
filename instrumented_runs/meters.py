"""Measurement the harness hooks around each step, from outside the strategy's algorithm.

A :class:`StepMeter` is entered around every training step (``harness.train``) and gives, when
the run finishes, its keys of memory/rank<R>.json (``harness.finish``). A strategy hooks one
with ``ctx.meter_steps(meter)``; its own step never mentions it (as the model states are
counted by a step pre-hook on the optimizer: ``ctx.count_memory_at``).

    ActivationPeak   an ActivationMeter (tracekit.capture) around each step:
                     ``activation_peak_bytes``, over the run or of the memory step alone
    StageMeter       a pipeline stage (instrumented_runs.pipeline): per step, the activation
                     peak and the most microbatches in flight; the bytes one microbatch keeps
                     for backward; and any gauge the schedule adds (PipeDream: weight versions)

Both count with :class:`tracekit.capture.ActivationMeter`: the bytes autograd saves for backward
(parameters excluded), docs/metrics.md "Memory".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

import torch

from tracekit import capture


class StepMeter(Protocol):
    """What the harness hooks around each step."""

    def step(self, k: int) -> AbstractContextManager[None]:
        """Entered around step ``k`` (warm-up steps included)."""
        ...

    def memory(self, warmup: int) -> dict[str, Any]:
        """Its keys of memory/rank<R>.json, once training is done (steps >= ``warmup`` were
        profiled)."""
        ...


class ActivationPeak:
    """``activation_peak_bytes``: ``meter``'s peak over the whole run, or (``memory_step`` given)
    the peak of that step alone (the step at which the model states are counted)."""

    def __init__(self, meter: capture.ActivationMeter, memory_step: int | None = None) -> None:
        self.meter, self.memory_step = meter, memory_step
        self.peak: int | None = None

    @contextmanager
    def step(self, k: int) -> Iterator[None]:
        if self.memory_step is not None:
            self.meter.reset_peak()
        with self.meter:
            yield
        if k == self.memory_step:
            self.peak = self.meter.peak_bytes

    def memory(self, warmup: int) -> dict[str, Any]:
        peak = self.meter.peak_bytes if self.memory_step is None else self.peak
        return {} if peak is None else {"activation_peak_bytes": peak}


class Stage(Protocol):
    """What :class:`StageMeter` reads of a pipeline stage's runner (pipeline.StageRunner)."""

    @property
    def s(self) -> int: ...  # the stage
    @property
    def p(self) -> int: ...  # stages
    @property
    def m(self) -> int: ...  # microbatches per step
    @property
    def stage(self) -> torch.nn.Module: ...
    @property
    def saved(self) -> dict[int, Any]: ...  # the microbatches in flight
    @property
    def after_op(self) -> list[Callable[[str, int], None]]: ...


class StageMeter:
    """A pipeline stage's activations and in-flight microbatches, per step.

    Hooked after each forward and backward of the runner (``after_op``) and at the start and end
    of each step (gauges are sampled there too): the microbatches in
    flight are those forwarded and not yet backwarded (``len(runner.saved)``), and a forward's
    bytes are what the ActivationMeter counts more after it than before it (the smallest over
    the run: the steady per-microbatch size). The peak is (max in flight) x (bytes per
    microbatch): m for GPipe, p - s for 1F1B on stage s (docs/metrics.md "Pipeline")."""

    def __init__(self, runner: Stage) -> None:
        self.runner = runner
        self.activations = capture.ActivationMeter(exclude=runner.stage.parameters())
        self.gauges: dict[str, Callable[[], int]] = {}
        self.steps: list[dict[str, int]] = []  # per step: max in flight, activation peak, gauges
        self.bytes_per_microbatch = 0
        self._top: dict[str, int] = {}
        self._before = 0
        runner.after_op.append(self._after_op)

    def track_max(self, name: str, gauge: Callable[[], int]) -> None:
        """Keep the largest value of ``gauge()`` per step (sampled after every op) as ``name``."""
        self.gauges[name] = gauge

    def _sample(self) -> None:
        now = {"max_inflight_microbatches": len(self.runner.saved)}
        now.update((name, gauge()) for name, gauge in self.gauges.items())
        for name, value in now.items():
            self._top[name] = max(self._top.get(name, value), value)

    def _after_op(self, kind: str, mb: int) -> None:
        now = self.activations.current_bytes
        if kind == "F":
            added = now - self._before
            self.bytes_per_microbatch = min(self.bytes_per_microbatch or added, added)
        self._before = now
        self._sample()

    @contextmanager
    def step(self, k: int) -> Iterator[None]:
        self.activations.reset_peak()
        self._top, self._before = {}, self.activations.current_bytes
        self._sample()
        with self.activations:
            yield
        self._sample()  # what the step's last op left (PipeDream's last update)
        top = self._top
        self.steps.append(
            {
                "step": k,
                "max_inflight_microbatches": top["max_inflight_microbatches"],
                "activation_peak_bytes": self.activations.peak_bytes,
                **{name: top[name] for name in self.gauges},
            }
        )

    def profiled_max(self, key: str, warmup: int) -> int:
        """The largest ``key`` over the profiled steps (every step if none was profiled)."""
        profiled = [s for s in self.steps if s["step"] >= warmup] or self.steps
        return max(s[key] for s in profiled)

    def memory(self, warmup: int) -> dict[str, Any]:
        r = self.runner
        return {
            "stage": r.s,
            "stages": r.p,
            "microbatches": r.m,
            "activation_peak_bytes": self.profiled_max("activation_peak_bytes", warmup),
            "activation_bytes_per_microbatch": self.bytes_per_microbatch,
            "max_inflight_microbatches": self.profiled_max("max_inflight_microbatches", warmup),
            "per_step": self.steps,
            **{name: self.profiled_max(name, warmup) for name in self.gauges},
        }
