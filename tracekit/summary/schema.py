"""The whole summary.json: one Struct per object, the top level here."""

from __future__ import annotations

from typing import Annotated

from tracekit.summary.base import M, Record
from tracekit.summary.collectives import Collectives, Matching, Volume
from tracekit.summary.contention import Contention, Steps
from tracekit.summary.memory import Memory, Overlap
from tracekit.summary.nccl import Nccl
from tracekit.summary.pipeline import Pipeline
from tracekit.summary.ranks import Rank, Run, Sampling, Window
from tracekit.summary.traffic import Clock, Topology, Traffic
from tracekit.summary.why import Why


class Engine(Record):
    """Where the per-rank work ran (tracekit.engines opens it); the key is present only
    when an engine was asked for (`--scheduler`, `$TRACEKIT_SCHEDULER`)."""

    kind: Annotated[str, M("`threads`, `processes` or `dask`")]
    address: Annotated[str | None, M("the Dask scheduler's address; null for a local engine")]
    workers: Annotated[
        int, M("the local pool's size; for Dask, the workers connected when the analysis began")
    ]


class Summary(Record, omit_defaults=True):
    """The top level. A section that does not apply to the input (no pipeline labels, no
    all-gathers, no memory files) is null; `engine` is absent unless an engine was asked for."""

    schema_version: Annotated[
        int, M("1; changes only when a key changes meaning (keys are added freely)")
    ]
    source: Annotated[str, M("the path analysed")]
    warnings: Annotated[list[str], M("each also printed on stderr as `warning: ...`")]
    window: Annotated[Window, M("the analysis window every time covers")]
    topology: Annotated[Topology, M("rank -> node, and where that came from")]
    clock: Annotated[Clock | None, M("clock alignment; null with fewer than two ranks")]
    sampling: Annotated[Sampling | None, M("what `--sample N` chose; null without it")]
    run: Annotated[Run | None, M("from run.json; null for a folder of foreign traces")]
    ranks: Annotated[list[Rank], M("one row per rank: where its time went")]
    collectives: Annotated[Collectives, M("collective calls, sizes and bandwidth")]
    pipeline: Annotated[Pipeline | None, M("pipeline bubbles; null without pipeline labels")]
    overlap: Annotated[
        Overlap | None, M("all-gather / reduce-scatter hidden under compute; null without them")
    ]
    traffic: Annotated[Traffic | None, M("bytes on rank -> rank links; null without matched calls")]
    nccl: Annotated[Nccl | None, M("what NCCL logs and kernels say; null without either")]
    matching: Annotated[Matching | None, M("how calls were matched; null without calls")]
    memory: Annotated[
        Memory | None,
        M("bytes per rank beside ZeRO's formulas; null without memory files or events"),
    ]
    volume: Annotated[Volume | None, M("bytes sent per rank per step; null without calls or steps")]
    engine: Annotated[
        Engine | None, M("where the per-rank work ran; absent unless an engine was asked for")
    ] = None
    why: Annotated[
        Why | None,
        M(
            "wait states, their root causes and the critical path (Scalasca; Böhme et al. 2010, "
            "2012); null without a window"
        ),
    ] = None
    contention: Annotated[
        Contention | None,
        M(
            "how long each rank waited for a CPU during its profiled steps (tracekit runs); "
            "absent for traces tracekit did not record (no contention files)"
        ),
    ] = None
    steps: Annotated[
        Steps | None,
        M("the job's step time over its complete steps and its spread; absent under two steps"),
    ] = None
