"""Kineto categories across schema versions and accelerators: what is device work, and what a
trace's device part lacks.

Categories are matched case-insensitively and mapped to today's names before anything reads
them (the events table's ``cat`` holds the canonical name):

- Kineto before 2022 (PyTorch 1.8-1.11) wrote ``Kernel``, ``Memcpy``, ``Memset``, ``Runtime``
  (CUDA runtime calls), ``Operator`` (cpu_op), ``User`` (user_annotation), ``Python``
  (python_function); some versions wrote ``gpu_user_Annotation``. These become ``kernel``,
  ``gpu_memcpy``, ``gpu_memset``, ``cuda_runtime``, ``cpu_op``, ``user_annotation``,
  ``python_function``, ``gpu_user_annotation``.
- Any other spelling of a name Kineto defines (libkineto ActivityType) is lower-cased.
- Names Kineto does not define (``Trace``, custom categories) are kept as written.

Device work (``device == "gpu"``: the accelerator's timeline, whatever the accelerator):

- CUDA and ROCm: ``kernel``, ``gpu_memcpy``, ``gpu_memset``, ``cuda_sync``,
  ``gpu_user_annotation`` (ROCm traces use the same names).
- MTIA: ``mtia_ccp_events`` (the device's command processor: its streams are the tids under the
  device's pid, named "MTIA <id>"). ``dma*`` events are memory transfers, ``event_wait`` /
  ``event_record`` are stream synchronisation, everything else (``pe_exe``, ``merge``,
  ``remote``, the named operator kernels) is compute.
- Host-side runtime calls of any accelerator are kind "runtime": ``cuda_runtime``,
  ``cuda_driver``, ``mtia_runtime``, ``xpu_runtime``, ``xpu_driver``, ``privateuse1_runtime``,
  ``privateuse1_driver``, ``glow_runtime``.

:func:`device_warnings` says when a trace's device part is missing or not understood (launches
without device events, deviceProperties without device events, categories Kineto does not
define): the numbers are then CPU-side only, and the warning says so.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

#: categories of device (accelerator) work, canonical names
DEVICE_CATS = (
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "gpu_user_annotation",
    "cuda_sync",
    "mtia_ccp_events",
)
#: device categories whose events occupy the device (kernels, copies, MTIA commands)
WORK_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "mtia_ccp_events")
RUNTIME_CATS = (
    "cuda_runtime",
    "cuda_driver",
    "mtia_runtime",
    "xpu_runtime",
    "xpu_driver",
    "privateuse1_runtime",
    "privateuse1_driver",
    "glow_runtime",
)
#: every category libkineto defines (ActivityType names), plus the profiler's own
KNOWN_CATS = frozenset(
    (
        *DEVICE_CATS,
        *RUNTIME_CATS,
        "cpu_op",
        "user_annotation",
        "external_correlation",
        "cpu_instant_event",
        "python_function",
        "overhead",
        "mtia_insight",
        "cuda_event",
        "mtia_counters",
        "cuda_profiler_range",
        "hpu_op",
        "collective_comm",
        "xpu_scope_profiler",
        "xpu_sync",
        "hardware_counters",
        "trace",  # the "PyTorch Profiler (0)" span
    )
)
#: Kineto's pre-2022 names (lower-cased) -> today's
OLD_NAMES = {
    "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
    "runtime": "cuda_runtime",
    "driver": "cuda_driver",
    "operator": "cpu_op",
    "user": "user_annotation",
    "python": "python_function",
}
MTIA_MEMORY = r"^dma"
MTIA_SYNC = r"^event_(wait|record)$"
#: host calls that put work on a device; seeing them without device events means the device
#: timeline was not recorded
LAUNCH_CALL = (
    r"(?i)launchkernel|^cudaMemcpy|^cudaMemset|^hipMemcpy|^hipMemset|^runFunction|"
    r"^hipExtModuleLaunchKernel|^cudaGraphLaunch|^hipGraphLaunch"
)


def canonical_cat(cat: str | None) -> str | None:
    """Today's name of a category, whatever version of Kineto wrote it (see module docstring)."""
    if cat is None:
        return None
    low = cat.lower()
    if low in OLD_NAMES:
        return OLD_NAMES[low]
    if low in KNOWN_CATS and low != "trace":
        return low
    return cat


def canonical_cats(frame: pl.DataFrame) -> pl.DataFrame:
    """``cat`` in canonical spelling; the mapping runs once per distinct category."""
    mapping = {
        c: canonical_cat(c) for c in frame["cat"].unique().to_list() if c != canonical_cat(c)
    }
    if not mapping:
        return frame
    return frame.with_columns(pl.col("cat").replace(mapping))


def mtia_kind() -> pl.Expr:
    name = pl.col("name")
    return (
        pl.when(name.str.contains(MTIA_MEMORY))
        .then(pl.lit("memory"))
        .when(name.str.contains(MTIA_SYNC))
        .then(pl.lit("sync"))
        .otherwise(pl.lit("compute"))
    )


def _top(counts: pl.DataFrame, most: int = 3) -> str:
    """'cudaLaunchKernel x1204, cudaMemcpyAsync x40': the most frequent names."""
    rows = counts.sort(["n", "name"], descending=[True, False]).head(most).rows()
    return ", ".join(f"{name} x{n}" for name, n in rows)


def _device_names(device_properties: Sequence[dict]) -> str:
    names = sorted({str(d.get("name")) for d in device_properties if d.get("name")})
    n = len(device_properties)
    return f"{n} device{'s' if n != 1 else ''}" + (f" ({', '.join(names[:2])})" if names else "")


def device_warnings(frame: pl.DataFrame, device_properties: Sequence[dict]) -> list[str]:
    """What the trace's device part lacks or holds that tracekit does not understand, one line
    each (the file name is added by the caller). Empty for complete GPU traces and for plain
    CPU traces (no runtime calls, no deviceProperties)."""
    out: list[str] = []
    cats = frame.group_by("cat").agg(pl.len().alias("n"))
    unknown = cats.filter(~pl.col("cat").is_in(list(KNOWN_CATS)) & (pl.col("cat") != "Trace"))
    if unknown.height:
        listed = _top(unknown.rename({"cat": "name"}), most=5)
        out.append(
            f"event categories this tracekit does not know: {listed}; counted in no number "
            "(if they are device work, the device timeline is incomplete)"
        )
    has_work = bool(frame["cat"].is_in(list(WORK_CATS)).any())
    if has_work:
        return out
    runtime = frame.filter(pl.col("cat").is_in(list(RUNTIME_CATS)))
    launches = runtime.filter(pl.col("name").str.contains(LAUNCH_CALL))
    if launches.height:
        kinds = sorted(set(launches["cat"].unique().to_list()))
        what = "/".join(k.replace("_", " ") for k in kinds)
        ranges = frame.filter(pl.col("cat") == "cuda_profiler_range").height
        extra = (
            f" (it holds {ranges} cuda_profiler_range events instead: CUPTI range profiling, "
            "which does not record kernels)"
            if ranges
            else ""
        )
        counts = launches.group_by("name").agg(pl.len().alias("n"))
        out.append(
            f"{what} calls that launch device work ({_top(counts)}) but no kernel, memcpy or "
            f"memset events: the device timeline is missing{extra}; numbers are CPU-side only"
        )
    elif device_properties:
        out.append(
            f"deviceProperties lists {_device_names(device_properties)} but the trace holds no "
            "device events or launches: the device was not profiled; numbers are CPU-side only"
        )
    return out
