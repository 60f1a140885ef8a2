"""run.json and memory/rank<R>.json as the analysis reads them: typed once, when loaded.

tracekit.runfolder checks the keys the analysis relies on when it reads run.json (world_size,
status, errors, config, topology: a damaged one is an error); here they get their types, so
that no analysis digs through nested dicts. Values the analysis reads but run.json may lack or
hold in an odd shape (``config.params``, ``strategy_options.microbatches``) become None: an odd
value only loses the number that depends on it. The raw dict is kept for what summary.json
echoes as written (``run``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tracekit.guarded_read import in_range, rank_list

#: a byte count past this is not one (no machine holds 2^62 bytes); it would overflow Int64 sums
BYTES_LIMIT = 2**62


def _int(value: Any) -> int | None:
    """int(value) for a truthy value that converts, else None."""
    if not value:
        return None
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _positive_int(*values: Any) -> int | None:
    """The first of VALUES that is an int above 0 (as written: no conversion)."""
    return next((v for v in values if isinstance(v, int) and v > 0), None)


@dataclass(frozen=True)
class RunConfig:
    """run.json ``config``: the parts the analyses read."""

    params: int
    """Psi, the model's parameter count: ``params``, else ``param_count``; 0 when unknown."""
    precision: str | None
    """``precision`` of the config (run.json's top-level ``precision`` comes first)."""
    microbatches: int | None
    """Microbatches per step: ``strategy_options.microbatches``, else ``microbatches``."""
    stages: int | None
    """Pipeline stages: ``strategy_options.stages``."""
    shard_degree: int | None
    """Ranks the model states are sharded over, as the strategy wrote it: the first positive
    integer of ``strategy_options.shard_size``, ``strategy_options.dp_degree``, ``dp_degree``."""
    process_groups: tuple[dict[str, Any], ...] = ()
    """``strategy_options.process_groups``: {name, dim, ranks[, desc]}, those with a ranks list."""
    options: dict[str, Any] = field(default_factory=dict)
    """``strategy_options`` as written."""

    @classmethod
    def from_json(cls, cfg: Mapping[str, Any]) -> RunConfig:
        opts = _dict(cfg.get("strategy_options"))
        groups = opts.get("process_groups") or []
        return cls(
            params=_int(cfg.get("params") or cfg.get("param_count")) or 0,
            precision=_text(cfg.get("precision") or None),
            microbatches=_int(opts.get("microbatches") or cfg.get("microbatches")),
            stages=_int(opts.get("stages")),
            shard_degree=_positive_int(
                opts.get("shard_size"), opts.get("dp_degree"), cfg.get("dp_degree")
            ),
            process_groups=tuple(
                g
                for g in (groups if isinstance(groups, list) else [])
                if isinstance(g, dict) and rank_list(g.get("ranks")) is not None
            ),
            options=opts,
        )


@dataclass(frozen=True)
class RunRecord:
    """run.json of a run folder (docs/run-folder.md), typed."""

    strategy: str | None
    """The strategy's name (``dp``, ``zero3``, ``pp-gpipe``, ...)."""
    world_size: int | None
    """Ranks in the job (a positive integer; tracekit.runfolder refuses anything else)."""
    backend: str | None
    """``gloo`` or ``nccl``."""
    device: str | None
    """``cpu`` or ``cuda``."""
    precision: str | None
    """``fp32`` or ``bf16-mixed``."""
    status: str | None
    """How the run ended: ``ok``, ``failed``, ``timeout``, ``running`` (never finished), ..."""
    errors: tuple[dict[str, Any], ...]
    """What went wrong, one {rank, kind, message} per error."""
    nodes: dict[int, int]
    """rank -> node, from ``topology`` (where the launcher placed each rank); empty without."""
    config: RunConfig
    """The ``config`` object, typed where the analyses read it."""
    raw: dict[str, Any]
    """run.json as written: summary.json ``run`` echoes it."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        """From run.json as tracekit.runfolder.load_run_json returns it (checked there)."""
        topology = data.get("topology") or []
        return cls(
            strategy=_text(data.get("strategy")),
            world_size=data.get("world_size"),
            backend=_text(data.get("backend")),
            device=_text(data.get("device")),
            precision=_text(data.get("precision") or None),
            status=data.get("status"),
            errors=tuple(e for e in data.get("errors") or [] if isinstance(e, dict)),
            nodes={int(t["rank"]): int(t.get("node", 0)) for t in topology if "rank" in t},
            config=RunConfig.from_json(_dict(data.get("config"))),
            raw=data,
        )

    def echo(self) -> dict[str, Any]:
        """summary.json ``run``: these keys of run.json, as written."""
        keys = ("strategy", "world_size", "backend", "device", "precision", "status")
        return {k: self.raw.get(k) for k in keys}

    def status_line(self) -> str:
        """One line on how the run ended: status and each error's rank, kind and message."""
        if self.status == "running":
            return (
                "the run's status is 'running': it never finished (killed before it could say, "
                "or still running)"
            )
        parts = []
        for e in self.errors[:4]:
            who = "the job" if e.get("rank") is None else f"rank {e.get('rank')}"
            message = " ".join(str(e.get("message", "")).split())[:200]
            parts.append(f"{who} {e.get('kind', 'error')}: {message}")
        more = f"; and {len(self.errors) - 4} more" if len(self.errors) > 4 else ""
        return f"the run's status is {self.status!r}" + (
            ": " + "; ".join(parts) + more if parts else ""
        )


#: the counts of memory/rank<R>.json the analyses read
MEMORY_KEYS = (
    "params_bytes",
    "grads_bytes",
    "optimizer_bytes",
    "model_states_bytes",
    "activation_peak_bytes",
    "activation_bytes_per_microbatch",
)


@dataclass(frozen=True)
class MemoryCounts:
    """memory/rank<R>.json: bytes one rank counted from the tensors it holds (tracekit.capture),
    never from a formula. A count the file lacks, or holds as anything but an integer, is None."""

    params_bytes: int | None = None
    """Parameters the rank holds."""
    grads_bytes: int | None = None
    """Gradients the rank holds."""
    optimizer_bytes: int | None = None
    """Optimizer state: Adam's moments, plus the fp32 master copy under bf16-mixed."""
    model_states_bytes: int | None = None
    """params + grads + optimizer, counted just before ``optimizer.step()`` of a later step."""
    activation_peak_bytes: int | None = None
    """Peak bytes autograd saved for backward (parameters excluded), when the run measured it."""
    activation_bytes_per_microbatch: int | None = None
    """Pipelines: activation bytes one microbatch keeps alive on the stage."""

    @staticmethod
    def problems(data: Mapping[str, Any]) -> list[str]:
        """The counts that are numbers but not byte counts (negative, 2^63, 1e400 read as
        float): each named with its figure; :meth:`from_json` leaves them unknown."""
        return [
            f"{k} {str(v)[:40]} is not a byte count; ignored"
            for k in MEMORY_KEYS
            if isinstance(v := data.get(k), (int, float))
            and not isinstance(v, bool)
            and in_range(v, 0, BYTES_LIMIT) is None
        ]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MemoryCounts:
        return cls(
            **{k: v for k in MEMORY_KEYS if in_range(v := data.get(k), 0, BYTES_LIMIT) is not None}
        )
