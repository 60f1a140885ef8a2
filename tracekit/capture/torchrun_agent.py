"""torchrun as `tracekit run` starts it: ``python -m tracekit.capture.torchrun_agent
torch.distributed.run <torchrun's arguments>``, torchrun's own main in this process, plus a bound
on how long it outlives the launcher.

When the launcher is killed outright (SIGKILL: nobody left to stop the job), the kernel sends
torchrun SIGTERM (PR_SET_PDEATHSIG, set by the launcher) and torchrun stops its ranks, which
write their traces. But torchrun does not always exit then: measured with torch 2.13, its main
thread ended and the interpreter's shutdown waited forever on the threads that copy each rank's
log (TailLog), their stop never called, with the ranks long gone as zombies. So a watchdog
thread here gives the job :data:`supervise.KILL_GRACE_S` after the launcher is gone (the grace
the launcher itself gives on Ctrl-C), then kills what is left of the job and this process: every
process of the job is gone a bounded time after the launcher, whatever torchrun does.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import time

from tracekit.capture import supervise

POLL_S = 0.2  # how soon the launcher's death is noticed


def _outlive_launcher_at_most(launcher: int, grace_s: float) -> None:
    while os.getppid() == launcher:  # a dead parent's children are given to init (or a reaper)
        time.sleep(POLL_S)
    time.sleep(grace_s)  # torchrun's own stop: the ranks write their traces
    supervise.kill_descendants(os.getpid())
    os._exit(128 + signal.SIGTERM)  # skips the interpreter shutdown that can wait forever


def main(argv: list[str]) -> None:
    """``argv``: the module to run (torch.distributed.run), then its arguments. The launcher is
    this process's parent when it starts (a launcher already gone: PR_SET_PDEATHSIG has
    stopped this process before it gets here)."""
    module, *args = argv
    watchdog = threading.Thread(
        target=_outlive_launcher_at_most,
        args=(os.getppid(), supervise.KILL_GRACE_S),
        name="tracekit-launcher-watchdog",
        daemon=True,
    )
    watchdog.start()
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
