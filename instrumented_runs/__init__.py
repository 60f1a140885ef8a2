"""Instrumented reference runs: one readable file per distributed-training strategy.

Each strategy module runs unchanged as ``torchrun --nproc-per-node N -m instrumented_runs.<name>``
(or through ``tracekit run <name>``) and writes a run folder (see ``tracekit.runfolder``).
Shared pieces: ``model`` (a small GPT), ``data`` (a seeded synthetic stream), ``harness`` (options,
process group, run folder, profiled loop), ``single`` (the one-process reference for tests).
"""
