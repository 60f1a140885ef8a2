"""The reference strategies, each declared once (torch-free: the CLI and the analyses read it).

    from tracekit.strategies import registry
    registry.get("zero3").uses        frozenset({'prefetch'})
    registry.get("pp-1f1b").schedule  '1f1b'

Read by the CLI (``tracekit run``'s strategies, ``tracekit demo``'s runs), the launcher (module,
options, layout check), the harness (options, precisions, global batch, the layout check again
inside the job), tracekit.runname (through ``options``) and the analyses (pipeline schedule,
theory family). A new strategy is its module and one entry in :data:`STRATEGIES`.

The strategy modules import torch and live in the run side's package, outside tracekit, which
declares itself under the entry point group :data:`RUN_SIDE` (pyproject.toml): an entry names
its module there, as text (``python -m`` runs it; tracekit never imports it). Layout checks are
torch-free, in :mod:`tracekit.strategies.layouts`.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any

from tracekit.strategies import layouts, options, schedules

BOTH = options.PRECISIONS
DEFAULT_GLOBAL_BATCH = 8
#: the entry point group under which the run side names the package of its strategy modules
RUN_SIDE = "tracekit.run_side"


def strategy_package() -> str:
    """The package of the strategy modules (each rank runs ``python -m <package>.<module>``)."""
    # a set: an old and a new install of the same checkout may both still be on the path
    found = sorted({ep.value for ep in importlib.metadata.entry_points(group=RUN_SIDE)})
    if len(found) != 1:
        raise LookupError(
            f"no single run side installed (entry point group {RUN_SIDE!r} lists {found}): "
            "install tracekit from its checkout (pip install -e .)"
        )
    return found[0]


@dataclass(frozen=True)
class Strategy:
    """One strategy: how to start it, what it takes, and what the analyses compare it with."""

    name: str
    """Its name on the command line and in run.json ``strategy``."""
    module: str
    """Its module in the run side's package (:func:`strategy_package`), which every rank runs (``python -m``, :attr:`entry`); its
    ``main(argv)`` calls the harness."""
    uses: frozenset[str] = frozenset()
    """The optional options it takes (RunOptions fields marked ``optional``): microbatches,
    prefetch. Every other strategy refuses them."""
    precisions: tuple[str, ...] = ("fp32",)
    """The ``--precision`` values it implements."""
    layout: Callable[[int, int], str | None] | None = None
    """``(world_size, nodes) -> why that layout cannot run, or None``
    (:mod:`tracekit.strategies.layouts`): checked by the launcher before it starts anything
    (one line, exit 2) and by the harness before joining the process group."""
    splits_batch: bool = True
    """The global batch is divided among the ranks (data parallel); pipelines divide it into
    microbatches instead and check that themselves."""
    global_batch: int = DEFAULT_GLOBAL_BATCH
    """Sequences per step over all ranks, unless ``--global-batch`` is given."""
    schedule: str | None = None
    """Pipelines: the schedule, one of tracekit.strategies.schedules.SCHEDULES."""
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
        if not self.module.isidentifier():
            problems.append(f"module {self.module!r} is not a module name")
        if self.schedule is not None and self.schedule not in schedules.SCHEDULES:
            problems.append(f"schedule {self.schedule!r} unknown")
        if problems:
            raise ValueError(f"strategy {self.name}: {'; '.join(problems)}")

    @property
    def entry(self) -> str:
        """The module every rank runs: ``python -m <entry>``."""
        return f"{strategy_package()}.{self.module}"

    def layout_problem(self, world_size: int, nodes: int) -> str | None:
        """Why ``world_size`` ranks on ``nodes`` nodes cannot run this strategy, or None."""
        return None if self.layout is None else self.layout(world_size, nodes)


def _demo(*runs: dict[str, Any]) -> tuple[MappingProxyType[str, Any], ...]:
    return tuple(MappingProxyType(r) for r in runs)


def _pipeline(name: str, module: str, schedule: str) -> Strategy:
    return Strategy(
        name,
        module,
        uses=frozenset({"microbatches"}),
        layout=layouts.pipeline_stages,
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
_ZERO3_WIRE = {
    "nproc": 2,
    "nodes": 2,
    "steps": 6,
    "emulate_network": True,
    "inter_node_bandwidth": "400mbit",
}


def _by_name(*strategies: Strategy) -> MappingProxyType[str, Strategy]:
    names = [s.name for s in strategies]
    if len(set(names)) != len(names):
        raise ValueError(f"strategy names declared twice: {sorted(names)}")
    return MappingProxyType({s.name: s for s in strategies})


#: Every strategy, in the order of ``tracekit demo``.
STRATEGIES = _by_name(
    Strategy("dp", "dp", precisions=BOTH, theory="dp", demo=_TWO),
    Strategy("zero1", "zero1", precisions=BOTH, theory="zero1", demo=_TWO),
    Strategy("zero2", "zero2", precisions=BOTH, theory="zero2", demo=_TWO),
    Strategy(
        "zero3",
        "zero3",
        uses=frozenset({"prefetch"}),
        precisions=BOTH,
        theory="zero3",
        # on two emulated nodes where the machine allows (tracekit demo says when it does not):
        # on loopback gloo's transfers are CPU work, so prefetch cannot shorten a step; behind a
        # 400 mbit link they wait on a wire, as on a cluster (#27; measured: 0.170 / 0.168 s
        # with prefetch 1 vs 0.182 / 0.210 s without, 5 profiled steps)
        demo=_demo(*({**_ZERO3_WIRE, "prefetch": p} for p in (0, 1))),
    ),
    Strategy(
        "fsdp",
        "fsdp",
        uses=frozenset({"prefetch"}),
        precisions=BOTH,
        theory="zero3",
        # two nodes, like hsdp's: docs/predict.md's fsdp-vs-hsdp example needs traffic that
        # crosses nodes in both (on one node the inter-node sweep cannot change the step)
        demo=_demo({"nproc": 4, "nodes": 2, "steps": 3}),
    ),
    Strategy(
        "hsdp",
        "hsdp",
        uses=frozenset({"prefetch"}),
        precisions=BOTH,
        layout=layouts.hsdp_mesh,
        theory="zero3",
        demo=_demo({"nproc": 4, "nodes": 2, "steps": 3}),
    ),
    Strategy("tp", "tp", precisions=BOTH, demo=_TWO),
    Strategy(
        "tp-dp",
        "tp_dp",
        precisions=BOTH,
        demo=_demo({"nproc": 4, "nodes": 2, "steps": 3}),
    ),
    _pipeline("pp-gpipe", "pp_gpipe", "gpipe"),
    _pipeline("pp-1f1b", "pp_1f1b", "1f1b"),
    _pipeline("pp-pipedream", "pp_pipedream", "pipedream"),
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
