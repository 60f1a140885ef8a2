"""The events table: the contract between ingest and everything downstream.

One row per complete ('X') event of a Kineto trace, on every rank. Times are integer
nanoseconds on the shared clock: ``baseTimeNanoseconds + ts * 1000`` when the trace has a base
(epoch ns, shared by ranks of one host), else ``ts * 1000`` (older traces store absolute
microseconds already).

kind, decided at ingest from category and name:
- ``compute``        GPU kernels that are not communication; CPU ``cpu_op`` events that are not
                     communication calls
- ``communication``  nccl/rccl kernels (``ncclKernel_*``, ``ncclDevKernel_*``), gloo ``gloo:*``
                     annotations, and the calling-thread ``c10d::*`` ops
- ``memory``         gpu_memcpy / gpu_memset (and MTIA ``dma*`` commands)
- ``sync``           cuda_sync events (GPU-side synchronisation)
- ``annotation``     user_annotation / gpu_user_annotation (labels, ProfilerStep#N, nccl:* cpu marks)
- ``runtime``        host calls of a device runtime: cuda_runtime / cuda_driver (also HIP), mtia_runtime,
                     xpu_* and privateuse1_* runtime/driver (tracekit/ingest/devices.py)
- ``other``          everything else (python_function, Trace spans, ...)

Collective columns (``op``, ``bytes``, ``dtype``, ``group``, ``group_size``, ``group_ranks``,
``peer``) are filled where the event itself carries them and are null otherwise; ``op`` uses the
The op names of docs/labels.md (all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, send, recv,
barrier). ``bytes`` is the nominal size S of nccl-tests: the all-gather output, the
reduce-scatter input, the tensor otherwise.
"""

from __future__ import annotations

import polars as pl

# a polars dtype as schemas here write it: a class (pl.Int64) or an instance (pl.List(pl.Int64))
DType = pl.DataType | type[pl.DataType]

KINDS = ("compute", "communication", "memory", "sync", "annotation", "runtime", "other")
#: the kinds whose time is work on the device or host (annotations and runtime calls are not):
#: drawn as events in the zoomed timeline, counted in the top events
WORK_KINDS = ("compute", "communication", "memory", "sync")

EVENT_SCHEMA: dict[str, type[pl.DataType]] = {
    "rank": pl.Int32,
    "device": pl.Utf8,  # "cpu" | "gpu" (any accelerator's device timeline: CUDA, ROCm, MTIA)
    "pid": pl.Utf8,
    "tid": pl.Utf8,  # thread id on CPU, stream id on GPU, as text
    "thread_name": pl.Utf8,  # from thread_name metadata ("pt_gloo_runloop", ...), may be null
    "stream": pl.Int64,  # GPU stream, null on CPU
    "cat": pl.Utf8,
    "name": pl.Utf8,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "kind": pl.Utf8,
    "op": pl.Utf8,
    "bytes": pl.Int64,
    "dtype": pl.Utf8,
    "group": pl.Utf8,
    "group_size": pl.Int32,
    "group_ranks": pl.Utf8,  # JSON list text, e.g. "[0, 1]"
    "peer": pl.Int32,
    "correlation": pl.Int64,  # links a GPU kernel to its CPU launch (cuda_runtime)
    "external_id": pl.Int64,
}


def empty_events() -> pl.DataFrame:
    """An events table with no rows and the full schema."""
    return pl.DataFrame(schema=EVENT_SCHEMA)
