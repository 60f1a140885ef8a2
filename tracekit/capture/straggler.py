"""A straggler we plant: one rank's compute made FACTOR times slower, as compute (ground truth).

``tracekit run STRATEGY --straggler RANK:FACTOR`` (tracekit.strategies.options) installs a
:class:`Straggler` on rank RANK (the run side's harness). Every strategy runs its forward and
backward inside :func:`tracekit.capture.region` (labels ``forward``/``backward``, and a
pipeline's ``F``/``B``/``W`` per microbatch), so that is the one place the extra goes: when such
a phase ends on the straggler, and before each communication region (``comm:...`` label) opens
inside one, it runs real extra work (matmuls on a private tensor: ``aten::mm`` and ``aten::tanh``
CPU ops, or kernels on a GPU) for (FACTOR - 1) x the compute time since the last such point,
still inside the phase's label, so the why analysis sees compute (not sleep) and charges the
waits it causes to that phase. Compute time is wall time less the communication regions
nested in the phase: waiting on a peer is not compute.

Paying before each communication region, not only at the phase's end, is what a slower device
does: a bucket's all-reduce launched inside backward (dp), or an all-gather inside forward
(fsdp), starts FACTOR x later. Paid at the end alone, dp's backward extra ran after its last
bucket was launched, beside the all-reduces in flight, and half of it hid behind them: the waits
charged were 46 % below the injected time (benchmarks/straggler_validation.py, 2026-12-07).

What was injected is timed on the rank, per step, and goes into run.json ``straggler``
(the run side's harness, when it finishes): the ground truth the analysis is checked against.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from tracekit import labels

# the extra work's unit: one small matmul (~0.1-1 ms on one CPU thread), so the overshoot of the
# target is at most one unit
_N = 128


def is_compute(name: str) -> bool:
    """A forward/backward phase: ``forward``, ``backward``, or a pipeline's F/B/W label."""
    if name in (labels.FORWARD, labels.BACKWARD):
        return True
    label = labels.parse(name)
    return label is not None and label.family == "pipeline"


def _is_comm(name: str) -> bool:
    return name.startswith(labels.COMM_PREFIX + ":")


@dataclass
class Straggler:
    """Rank ``rank``'s compute slowed by ``factor``; ``injected[step]`` the extra seconds run."""

    rank: int
    factor: float
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    step: int = -1
    injected: dict[int, float] = field(default_factory=dict)
    _depth: int = 0  # compute phases open (only the outermost one injects)
    _comm_depth: int = 0  # comm regions open inside it (only the outermost one is timed)
    _mark: float = 0.0  # when the compute now owed its extra began
    _excluded: float = 0.0  # seconds of comm regions since _mark
    _work: torch.Tensor | None = None

    def _sync(self) -> None:
        if self.device.type == "cuda":  # the phase's time is its kernels', not their launch
            torch.cuda.synchronize(self.device)

    def extra(self, seconds: float) -> float:
        """Run real compute for at least ``seconds``; the seconds it took."""
        if self._work is None:
            g = torch.Generator().manual_seed(self.rank)
            self._work = (torch.randn(_N, _N, generator=g) / _N**0.5).to(self.device)
        t0 = time.perf_counter()
        x = self._work
        while time.perf_counter() - t0 < seconds:
            x = torch.tanh(x @ self._work)  # tanh keeps it bounded
            self._sync()
        return time.perf_counter() - t0

    def _pay(self) -> None:
        """The extra for the compute since the last payment (its comm regions left out)."""
        self._sync()
        compute = max(0.0, time.perf_counter() - self._mark - self._excluded)
        took = self.extra((self.factor - 1.0) * compute)
        self.injected[self.step] = self.injected.get(self.step, 0.0) + took
        self._mark, self._excluded = time.perf_counter(), 0.0

    def before(self, name: str) -> None:
        """Before a region's label opens: a comm region inside a compute phase first pays the
        compute it waits for (so the extra lies before its label, in the phase's)."""
        if _is_comm(name) and self._depth and self._comm_depth == 0:
            self._pay()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Inside a region's label: a compute phase pays its extra at its end (and, through
        :meth:`before`, before each comm region inside it); the comm region itself is left out
        of the compute time."""
        if _is_comm(name) and self._depth:
            outer_comm = self._comm_depth == 0
            t0 = time.perf_counter()
            self._comm_depth += 1
            try:
                yield
            finally:
                self._comm_depth -= 1
                if outer_comm:
                    self._excluded += time.perf_counter() - t0
            return
        if not is_compute(name):
            yield
            return
        outer = self._depth == 0
        if outer:
            self._sync()
            self._mark, self._excluded = time.perf_counter(), 0.0
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if outer:  # not on an exception: a failing phase is left as it failed
            self._pay()


_ACTIVE: Straggler | None = None


def install_straggler(rank: int, factor: float, device: torch.device) -> Straggler:
    """Make this process the straggler (:func:`tracekit.capture.region` consults it)."""
    global _ACTIVE
    _ACTIVE = Straggler(rank, factor, device)
    return _ACTIVE


def active() -> Straggler | None:
    return _ACTIVE
