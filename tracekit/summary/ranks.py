"""summary.json ``window``, ``ranks[]``, ``run`` and ``sampling``: where the time of each rank went."""

from __future__ import annotations

from typing import Annotated

from tracekit.summary.base import M, Record


class WindowRank(Record):
    """One rank's analysis window."""

    rank: Annotated[int, M("the rank")]
    kind: Annotated[str, M("`complete_steps` or `whole_trace`, as `window.kind`, for this rank")]
    steps: Annotated[
        int, M("the rank's complete steps (`whole_trace`: its step markers, 0 or 1 on GPU)")
    ]
    start_ns: Annotated[int, M("window start, ns on the shared clock")]
    end_ns: Annotated[int, M("window end, ns on the shared clock")]


class Window(Record):
    """The analysis window: every time in the summary covers it (see the rules above)."""

    kind: Annotated[
        str,
        M(
            "`complete_steps`: the `ProfilerStep#N` markers (on GPU only kernels launched before "
            "the last marker); `whole_trace`: no step markers, the whole trace and no step times "
            "(a warning says so)"
        ),
    ]
    steps: Annotated[
        int, M("complete steps in the window: the fewest of any rank; 0 without markers")
    ]
    start_ns: Annotated[int, M("earliest window start of any rank, ns on the shared clock")]
    end_ns: Annotated[int, M("latest window end of any rank, ns on the shared clock")]
    per_rank: Annotated[list[WindowRank], M("each rank's window")]


class Rank(Record):
    """One rank's time breakdown over its window (frame `ranks.parquet`; the state segments are
    `timeline/rank<R>.parquet`: rank, start_ns, end_ns, state)."""

    rank: Annotated[int, M("the rank")]
    node: Annotated[int, M('its node (docs/traffic.md "Topology")')]
    span_s: Annotated[float, M("the rank's window: end - start, seconds")]
    step_time_s: Annotated[
        float | None, M("median duration of the complete steps, seconds; null without step markers")
    ]
    compute_s: Annotated[
        float,
        M(
            "seconds. GPU: union of non-communication, non-memory kernels on all streams (GPU "
            "events only, as HTA does; any accelerator's device events and every Kineto schema's "
            "categories, see docs/corpus.md). CPU: union of `cpu_op` events on the compute threads "
            "(not gloo runloop threads), minus time inside communication calls and minus blocking "
            "waits: time inside a communication label (`comm:*`, FSDP2's `FSDP::all_gather`, "
            "`FSDP::pre_forward`, `FSDP::pre_backward`, `FSDP::post_backward_reduce`, "
            "`FSDP::post_backward_rs_wait`) or inside a `gloo:send`/`gloo:recv` span whose peer is "
            "not in the traces, on the calling thread, that no op nested in it covers (on gloo a "
            "wait leaves no event, and in backward it sits inside an autograd op; ops inside an "
            "isend span run while the message is in flight and are compute)"
        ),
    ]
    comm_s: Annotated[
        float,
        M(
            "seconds. GPU: union of nccl/rccl kernels (`ncclKernel_*`, `ncclDevKernel_*`), and of "
            "the rank's `gloo:*` spans (gloo on CUDA tensors runs no kernel: it moves the bytes "
            "from host threads). CPU: union of `gloo:*` collective spans, `c10d::*` calls and, of "
            "each `gloo:send`/`gloo:recv` span on the calling thread, only its transfer and its "
            'blocked wait ("Point-to-point time" below). On both GPU ranks on gloo and CPU ranks '
            "the same p2p rule applies to the host's gloo spans; NCCL p2p kernels count whole, as "
            "HTA does"
        ),
    ]
    overlap_s: Annotated[float, M("compute ∩ communication, seconds")]
    exposed_comm_s: Annotated[float, M("communication not under compute, seconds")]
    other_s: Annotated[
        float, M("memcpy / memset / sync under neither compute nor communication, seconds")
    ]
    idle_s: Annotated[float, M("none of the above, seconds")]
    window_kind: Annotated[str, M("the rank's window kind, as `window.per_rank[].kind`")]
    window_steps: Annotated[int, M("the rank's complete steps, as `window.per_rank[].steps`")]
    window_start_ns: Annotated[int, M("the rank's window start, as `window.per_rank[].start_ns`")]
    window_end_ns: Annotated[int, M("the rank's window end, as `window.per_rank[].end_ns`")]


class Run(Record):
    """What run.json says about the run (null for a folder of foreign traces); each key null
    when run.json does not give it."""

    strategy: Annotated[str | None, M("the strategy run (`dp`, `zero3`, `pp-1f1b`, ...)")]
    world_size: Annotated[int | None, M("ranks in the job")]
    backend: Annotated[str | None, M("`gloo` or `nccl`")]
    device: Annotated[str | None, M("`cpu` or `cuda`")]
    precision: Annotated[str | None, M("`fp32` or `bf16-mixed`")]
    status: Annotated[
        str | None,
        M("`ok`, or how the run ended (`failed`, `interrupted`, ...; a warning says so)"),
    ]


class Sampling(Record):
    """What `--sample N` chose (null without it): a sampled overview of a large job."""

    ranks_present: Annotated[int, M("distinct ranks with a trace, known before parsing")]
    ranks_analysed: Annotated[int, M("ranks analysed (N, or all when fewer)")]
    ranks: Annotated[list[int], M("the ranks analysed")]
    method: Annotated[str, M("how they were chosen, in words")]
