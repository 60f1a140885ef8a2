"""The options of a reference run, declared once: :class:`RunOptions` (torch-free).

Each field of RunOptions is one option; its metadata (:func:`option`) says where it is given,
how it is checked and how a run name shows it. Everything else is generated from it:

    tracekit run's click options          tracekit.cli.run (``click_options``)
    a strategy module's own parser        :func:`rank_parser` (the run side's harness)
    the checks, launcher and ranks alike  :func:`problem`
    what the launcher passes to the ranks :func:`rank_args`
    the phrases of run names              :func:`name_phrases` (tracekit.runname)

A new option is one field here (and, if only some strategies take it, their
``registry.Strategy.uses``). Which options a strategy takes, its precisions and its default
global batch are the strategy's own: ``tracekit.strategies.registry``.
"""

from __future__ import annotations

import argparse
import functools
import os
import typing
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Protocol

PRECISIONS = ("fp32", "bf16-mixed")
Side = Literal["run", "rank", "both"]


@dataclass(frozen=True)
class Option:
    """How one RunOptions field is given, checked and shown."""

    help: str | None = None
    """Its ``--help`` text (both parsers)."""
    side: Side = "both"
    """``"run"``: ``tracekit run`` only (the launcher's); ``"rank"``: the strategy module's own
    parser only; ``"both"``: both."""
    forward: bool = True
    """The launcher passes the value on to the ranks (``"both"`` and ``"rank"`` options)."""
    choices: tuple[str, ...] | None = None
    """The values allowed (a string option)."""
    min: float | None = None
    """The smallest value allowed (a number)."""
    max: float | None = None
    """The largest value allowed (a number)."""
    min_open: bool = False
    """``min`` itself is not allowed."""
    optional: bool = False
    """Taken only by the strategies that list it in ``registry.Strategy.uses``; any other
    strategy refuses it (exit 2)."""
    phrase: str | None = None
    """How a run's name shows a value other than the default (``{}`` is the value); options
    taken by some strategies only come first (tracekit.runname)."""
    env: str | None = None
    """Strategy module: the default is this environment variable when it is set."""
    hidden: bool = False
    """Left out of ``--help`` (test hooks)."""


#: ``--nproc`` at most: every rank is a process of this machine (a rank holds a model and a
#: profiler: about 0.3 GB of memory), and more than this many is a typo, not a reference run.
MAX_NPROC = 64


def option(default: Any, help: str | None = None, **how: Any) -> Any:
    """A RunOptions field: its default and how it is given (:class:`Option`)."""
    return field(default=default, metadata={"option": Option(help=help, **how)})


@dataclass
class RunOptions:
    """One reference run: the strategy and its options, as ``tracekit run`` takes them."""

    strategy: str
    """The strategy's name in ``tracekit.strategies.registry`` (``tracekit run STRATEGY``)."""
    nproc: int = option(2, "ranks, at most 64 (default 2)", side="run", min=1, max=MAX_NPROC)
    """Ranks of the job (processes, all on this machine: at most :data:`MAX_NPROC`)."""
    nodes: int = option(
        1,
        "logical nodes; ranks placed contiguously (default 1)",
        min=1,
        env="GROUP_WORLD_SIZE",
        phrase="{} nodes",
    )
    """Nodes the ranks are placed on, contiguously: node = rank // (nproc / nodes)."""
    steps: int = option(3, "profiled steps (default 3)", min=1)
    """Steps recorded by the profiler, after the warm-up."""
    warmup: int = option(1, "unprofiled warm-up steps (default 1)", min=0)
    """Steps run before the profiler starts (allocators, connections, caches)."""
    microbatches: int | None = option(
        None,
        "pipelines: microbatches per step (default 2 x stages)",
        min=1,
        optional=True,
        phrase="{} microbatches",
    )
    """Pipelines: microbatches per step (default 2 x stages)."""
    precision: str = option("fp32", "(default fp32)", choices=PRECISIONS, phrase="{}")
    """fp32, or bf16-mixed (bf16 compute and communication, fp32 master weights)."""
    prefetch: int | None = option(
        None,
        "zero3/fsdp/hsdp: units gathered ahead (default: the strategy's)",
        min=0,
        max=2,
        optional=True,
        phrase="prefetch {}",
    )
    """ZeRO-3 / FSDP / HSDP: units gathered ahead of their use (the strategy's default if None)."""
    device: str = option("cpu", "(default cpu)", choices=("cpu", "cuda"))
    """Where the ranks compute."""
    backend: str | None = option(
        None, "(default gloo on cpu, nccl on cuda)", choices=("gloo", "nccl")
    )
    """The process group's backend; None: gloo on cpu, nccl on cuda (:func:`backend_of`)."""
    timeout: float | None = option(
        None, "seconds (default: no limit)", side="run", min=0, min_open=True
    )
    """The whole job is killed after this many seconds (status "timeout")."""
    emulate_network: bool = option(False, "each node in a network namespace of its own", side="run")
    """Each node in a network namespace of its own, linked at ``inter_node_bandwidth``."""
    inter_node_bandwidth: str = option("1gbit", "tc rate, e.g. 400mbit (default 1gbit)", side="run")
    """The emulated link of every node (a tc rate)."""
    out: Path = option(Path("runs"), "parent of the run folder (default ./runs)", forward=False)
    """Where the run folder ``<strategy>-<stamp>`` is created."""
    run_dir: Path | None = option(
        None, "the run folder (created by the launcher)", side="rank", forward=False
    )
    """The run folder itself (the launcher creates it and names it to the ranks)."""
    seed: int = option(0, side="rank")
    """Seed of the model's weights and of the data."""
    global_batch: int | None = option(None, "sequences per step, all ranks", side="rank", min=1)
    """Sequences per step over all ranks (None: the strategy's ``global_batch``)."""
    straggler: str | None = option(
        None,
        "RANK:FACTOR: rank RANK computes FACTOR (1 to 10) times slower (ground truth for why)",
        phrase="straggler {}",
    )
    """Rank RANK's forward and backward take FACTOR times as long: after each, that rank runs
    real extra compute (matmuls) for (FACTOR - 1) x the phase's own compute time, inside the
    phase's label (tracekit.capture.straggler); run.json ``straggler`` records it."""
    fail_rank: int | None = option(None, side="rank", hidden=True)
    """Test hook: this rank raises at step ``fail_step`` (or TRACEKIT_FAIL_RANK)."""
    fail_step: int = option(0, side="rank", hidden=True)
    """Test hook: the step at which ``fail_rank`` raises."""


class StrategyLike(Protocol):
    """What the checks need of a strategy (``registry.Strategy``)."""

    @property
    def name(self) -> str: ...
    @property
    def uses(self) -> frozenset[str]: ...
    @property
    def precisions(self) -> tuple[str, ...]: ...
    @property
    def global_batch(self) -> int: ...


@functools.cache
def _hints() -> dict[str, Any]:
    return typing.get_type_hints(RunOptions)


def declared(side: Side | None = None) -> Iterator[tuple[Field[Any], Option, type]]:
    """(field, its Option, its value type without None) of every option, in declaration order;
    only those parsed on ``side`` ("run": tracekit run, "rank": the strategy module) if given."""
    hints = _hints()
    for f in fields(RunOptions):
        how = f.metadata.get("option")
        if how is None or (side is not None and how.side not in (side, "both")):
            continue
        kinds = [t for t in typing.get_args(hints[f.name]) if t is not type(None)]
        yield f, how, kinds[0] if kinds else hints[f.name]


def flag(name: str) -> str:
    """The command-line spelling of a field: ``inter_node_bandwidth`` -> ``--inter-node-bandwidth``."""
    return "--" + name.replace("_", "-")


def optional_names() -> frozenset[str]:
    """Options taken only by the strategies that declare them."""
    return frozenset(f.name for f, how, _ in declared() if how.optional)


def backend_of(values: Any) -> str:
    """The backend a run uses: the one given, else nccl on cuda and gloo on cpu."""
    return values.backend or ("nccl" if values.device == "cuda" else "gloo")


def _allowed(how: Option) -> str:
    if how.choices is not None:
        return " or ".join(how.choices)
    if how.min is not None and how.max is not None and how.max - how.min <= 4:
        values = [f"{v:g}" for v in range(int(how.min), int(how.max) + 1)]
        return f"{', '.join(values[:-1])} or {values[-1]}"
    parts = []
    if how.min is not None:
        parts.append(f"{'more than' if how.min_open else 'at least'} {how.min:g}")
    if how.max is not None:
        parts.append(f"at most {how.max:g}")
    return " and ".join(parts)


def _out_of_range(how: Option, value: float) -> bool:
    low = how.min is not None and (value <= how.min if how.min_open else value < how.min)
    return low or (how.max is not None and value > how.max)


def problem(strategy: StrategyLike, values: Any) -> str | None:
    """Why these option values cannot run ``strategy`` (one line naming the option), or None.

    ``values``: RunOptions, or the strategy module's parsed arguments (options of the other
    side are absent there and not checked)."""
    for f, how, kind in declared():
        value = getattr(values, f.name, None)
        if value is None or kind is bool:
            continue
        name = flag(f.name)
        if how.optional and f.name not in strategy.uses:
            return f"{name} is not used by {strategy.name}"
        if how.choices is not None and value not in how.choices:
            return f"{name} must be {_allowed(how)}, not {value!r}"
        if kind in (int, float) and _out_of_range(how, value):
            return f"{name} must be {_allowed(how)}"
    why = straggler_problem(values.straggler, getattr(values, "nproc", None))
    if why:
        return why
    if values.precision not in strategy.precisions:
        return f"--precision {values.precision} is not supported for {strategy.name} yet"
    if values.backend == "nccl" and values.device != "cuda":
        return "--backend nccl needs --device cuda"
    return None


STRAGGLER_MAX_FACTOR = 10.0


def parse_straggler(text: str) -> tuple[int, float]:
    """``RANK:FACTOR`` -> (rank, factor); ValueError unless it has that form."""
    rank, sep, factor = text.partition(":")
    if not sep:
        raise ValueError(text)
    return int(rank), float(factor)


def straggler_problem(text: str | None, nproc: int | None) -> str | None:
    """Why ``--straggler text`` cannot run on ``nproc`` ranks (None: not checked here), or None."""
    if text is None:
        return None
    try:
        rank, factor = parse_straggler(text)
    except ValueError:
        return f"--straggler must be RANK:FACTOR (e.g. 1:1.5), not {text!r}"
    if not 1.0 < factor <= STRAGGLER_MAX_FACTOR:  # also refuses nan
        return f"--straggler FACTOR must be more than 1 and at most {STRAGGLER_MAX_FACTOR:g}, not {factor:g}"
    if rank < 0 or (nproc is not None and rank >= nproc):
        bound = f"0 to {nproc - 1} (--nproc {nproc})" if nproc is not None else "at least 0"
        return f"--straggler RANK must be {bound}, not {rank}"
    return None


def rank_parser(strategy: StrategyLike, module: str) -> argparse.ArgumentParser:
    """The strategy module's own parser: every "rank" and "both" option, with its defaults (the
    strategy's global batch; ``env`` where set)."""
    p = argparse.ArgumentParser(prog=module, description=f"{strategy.name} reference run")
    for f, how, kind in declared("rank"):
        default = f.default if f.default is not MISSING else None
        if f.name == "global_batch":
            default = strategy.global_batch
        if how.env and os.environ.get(how.env):
            default = kind(os.environ[how.env])
        help_text = argparse.SUPPRESS if how.hidden else how.help
        if kind is bool:
            p.add_argument(flag(f.name), action="store_true", default=default, help=help_text)
            continue
        choices: tuple[Any, ...] | None = how.choices
        if kind is int and how.min is not None and how.max is not None:
            choices = tuple(range(int(how.min), int(how.max) + 1))
        p.add_argument(flag(f.name), type=kind, default=default, choices=choices, help=help_text)
    return p


def rank_args(opts: RunOptions) -> list[str]:
    """The arguments the launcher gives each rank: every option the ranks take that is set
    (the backend resolved), ``--run-dir`` added by the launcher itself."""
    args: list[str] = []
    for f, how, kind in declared("rank"):
        value = backend_of(opts) if f.name == "backend" else getattr(opts, f.name)
        if not how.forward or value is None or value is False:
            continue
        if how.side == "rank" and value == f.default:
            continue  # the ranks' own default: the command line stays as short as it was
        args += [flag(f.name)] if kind is bool else [flag(f.name), str(value)]
    return args


def name_phrases(config: Mapping[str, Any]) -> list[str]:
    """The options that set a run apart, each as a short phrase, from run.json ``config``:
    options some strategies take first, then the others, in declaration order."""
    found = [(f, how.phrase, how.optional) for f, how, _ in declared() if how.phrase is not None]
    found.sort(key=lambda item: not item[2])
    out = []
    for f, phrase, _ in found:
        value = config.get(f.name)
        if value is not None and value != f.default:
            out.append(phrase.format(value))
    return out
