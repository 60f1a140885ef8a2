"""The capture half of tracekit: what runs while a job trains, and fills its run folder.

    in every rank    trace       the in-rank profiler: steps -> traces/rank<R>.json.gz
                     memory      model states and activation bytes, from the tensors
                     records     train/, parameters, versions and environment, flight recorder
                     profiler    tracekit.profile / profiled / StepProfiler for a user's own job
                     placement   host, node, local rank of each rank (run.json topology)
    the launcher     launch      `tracekit run`: options checked, torchrun started, run.json final
                     supervise   the job's processes: signals, stopping, output
                     outcome     how the job ended: rank errors, logs, run.json status
                     netns       the emulated multi-node network (one namespace per node)

Paths inside a run folder are tracekit.runfolder's; what a strategy is and which options it
takes are tracekit.strategies'. The analysis half
(ingest -> timeline -> analyses -> figures -> report/app) never imports this package.

The in-rank API the strategies use is re-exported here (``capture.ActivationMeter``,
``capture.write_train``, ...), loaded on first use: the launcher's modules must not import
torch, which takes seconds on a busy machine.
"""

from __future__ import annotations

from tracekit._lazy import lazy_attributes

_EXPORTS = {
    "memory": ("ActivationMeter", "count_bytes", "model_states", "write_memory"),
    "records": (
        "dump_flight_recorder",
        "environment",
        "flight_recorder_path",
        "load_params",
        "params_path",
        "save_params",
        "versions",
        "write_train",
    ),
    "trace": ("exit_on_first_sigterm", "profile_steps", "region", "write_events_parquet"),
    "teardown": ("leave_process_group", "leave_process_group_at_exit"),
}
_WHERE = {
    name: f"tracekit.capture.{module}" for module, names in _EXPORTS.items() for name in names
}

__all__ = sorted(_WHERE)


__getattr__ = lazy_attributes(__name__, _WHERE, globals())
"""The in-rank API, imported on first use (PEP 562)."""
