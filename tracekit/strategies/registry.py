"""The reference strategies, each declared once (torch-free: the CLI and the analyses read it).

    from instrumented_runs import registry
    registry.get("zero3").uses        frozenset({'prefetch'})
    registry.get("pp-1f1b").schedule  '1f1b'

Read by the CLI (``tracekit run``'s strategies, ``tracekit demo``'s runs), the launcher (module,
options, layout check), the harness (options, precisions, global batch, the layout check again
inside the job), tracekit.runname (through ``options``) and the analyses (pipeline schedule,
theory family). A new strategy is its module and one entry in :data:`STRATEGIES`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any

from instrumented_runs import options

BOTH = options.PRECISIONS
DEFAULT_GLOBAL_BATCH = 8


@dataclass(frozen=True)
class Strategy:
    """One strategy: how to start it, what it takes, and what the analyses compare it with."""

    name: str
    """Its name on the command line and in run.json ``strategy``."""
    module: str
    """The module every rank runs (``python -m``); its ``main(argv)`` calls the harness."""
    uses: frozenset[str] = frozenset()
    """The optional options it takes (RunOptions fields marked ``optional``): microbatches,
    prefetch. Every other strategy refuses them."""
    precisions: tuple[str, ...] = ("fp32",)
    """The ``--precision`` values it implements."""
    layout: str | None = None
    """``"module:function"``, ``(world_size, nodes) -> why that layout cannot run, or None``:
    checked by the launcher before it starts anything (one line, exit 2) and by the harness
    before joining the process group. A name, not the function: strategy modules import torch."""
    splits_batch: bool = True
    """The global batch is divided among the ranks (data parallel); pipelines divide it into
    microbatches instead and check that themselves."""
    global_batch: int = DEFAULT_GLOBAL_BATCH
    """Sequences per step over all ranks, unless ``--global-batch`` is given."""
    schedule: str | None = None
    """Pipelines: the schedule, one of tracekit.analyses.replay's (tests/test_registry.py)."""
    theory: str | None = None
    """Whose model-state formula it follows in tracekit.theory (dp, zero1, zero2, zero3): fsdp
    and hsdp (ZeRO-3 inside each node) follow zero3; None where the papers give none."""
    demo: tuple[MappingProxyType[str, Any], ...] = ()
    """RunOptions of its runs in ``tracekit demo``: world size 2 where the idea shows at 2
    ranks (a 2-core laptop stays responsive), 4 where it needs two nodes or four stages."""

    def __post_init__(self) -> None:
        """Validated once, on import: a wrong entry fails every use, with its reason."""
        known = {f.name for f in fields(options.RunOptions)} - {"strategy"}
        problems = [
            f"uses {u!r}, not an optional option" for u in self.uses - options.optional_names()
        ]
        problems += [
            f"precision {p!r} unknown" for p in self.precisions if p not in options.PRECISIONS
        ]
        problems += [
            f"demo option {k!r} unknown" for run in self.demo for k in run if k not in known
        ]
        if not self.module.startswith("instrumented_runs."):
            problems.append(f"module {self.module!r} is not in instrumented_runs")
        if self.layout is not None and self.layout.count(":") != 1:
            problems.append(f"layout {self.layout!r} is not module:function")
        if problems:
            raise ValueError(f"strategy {self.name}: {'; '.join(problems)}")

    def layout_problem(self, world_size: int, nodes: int) -> str | None:
        """Why ``world_size`` ranks on ``nodes`` nodes cannot run this strategy, or None."""
        if self.layout is None:
            return None
        module, function = self.layout.split(":")
        problem: str | None = getattr(importlib.import_module(module), function)(world_size, nodes)
        return problem


def _demo(*runs: dict[str, Any]) -> tuple[MappingProxyType[str, Any], ...]:
    return tuple(MappingProxyType(r) for r in runs)


def _pipeline(name: str, module: str, schedule: str) -> Strategy:
    return Strategy(
        name,
        module,
        uses=frozenset({"microbatches"}),
        layout="instrumented_runs.pipeline:check_layout",
        splits_batch=False,
        # 8 sequences per microbatch at m = 8: with 1-sequence microbatches a forward is mostly
        # Python overhead and gloo's per-message latency rivals it (measured, p=4, m=8, 2 cores
        # shared, receives not yet posted ahead: measured - replay bubble 0.16 at 32 sequences,
        # 0.11 at 64)
        global_batch=64,
        schedule=schedule,
        demo=_demo({"nproc": 4, "microbatches": 8, "steps": 3}),
    )


_TWO = _demo({"nproc": 2, "steps": 3})


def _by_name(*strategies: Strategy) -> MappingProxyType[str, Strategy]:
    names = [s.name for s in strategies]
    if len(set(names)) != len(names):
        raise ValueError(f"strategy names declared twice: {sorted(names)}")
    return MappingProxyType({s.name: s for s in strategies})


#: Every strategy, in the order of ``tracekit demo``.
STRATEGIES = _by_name(
    Strategy("dp", "instrumented_runs.dp", precisions=BOTH, theory="dp", demo=_TWO),
    Strategy("zero1", "instrumented_runs.zero1", precisions=BOTH, theory="zero1", demo=_TWO),
    Strategy("zero2", "instrumented_runs.zero2", precisions=BOTH, theory="zero2", demo=_TWO),
    Strategy(
        "zero3",
        "instrumented_runs.zero3",
        uses=frozenset({"prefetch"}),
        precisions=BOTH,
        theory="zero3",
        demo=_demo(
            {"nproc": 2, "steps": 3, "prefetch": 0}, {"nproc": 2, "steps": 3, "prefetch": 1}
        ),
    ),
    Strategy(
        "fsdp",
        "instrumented_runs.fsdp",
        uses=frozenset({"prefetch"}),
        precisions=BOTH,
        theory="zero3",
        demo=_TWO,
    ),
    Strategy(
        "hsdp",
        "instrumented_runs.hsdp",
        uses=frozenset({"prefetch"}),
        precisions=BOTH,
        layout="instrumented_runs.hsdp:check_layout",
        theory="zero3",
        demo=_demo({"nproc": 4, "nodes": 2, "steps": 3}),
    ),
    Strategy("tp", "instrumented_runs.tp", precisions=BOTH, demo=_TWO),
    Strategy(
        "tp-dp",
        "instrumented_runs.tp_dp",
        precisions=BOTH,
        demo=_demo({"nproc": 4, "nodes": 2, "steps": 3}),
    ),
    _pipeline("pp-gpipe", "instrumented_runs.pp_gpipe", "gpipe"),
    _pipeline("pp-1f1b", "instrumented_runs.pp_1f1b", "1f1b"),
    _pipeline("pp-pipedream", "instrumented_runs.pp_pipedream", "pipedream"),
)


def get(name: str) -> Strategy | None:
    """The strategy of this name, or None."""
    return STRATEGIES.get(name)


def schedule_of(name: str | None) -> str | None:
    """The pipeline schedule of a strategy name (None: not one of ours, or not a pipeline)."""
    found = STRATEGIES.get(name) if isinstance(name, str) else None
    return found.schedule if found else None


def theory_of(name: str | None) -> str | None:
    """The model-state formula a strategy follows (tracekit.theory), or None."""
    found = STRATEGIES.get(name) if isinstance(name, str) else None
    return found.theory if found else None


def demo_runs() -> list[tuple[str, dict[str, Any]]]:
    """(strategy, RunOptions) of every ``tracekit demo`` run, in order."""
    return [(s.name, dict(run)) for s in STRATEGIES.values() for run in s.demo]
