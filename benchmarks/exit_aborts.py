"""Count rank aborts at exit (issue #25 item 1) over N repeated real runs.

    python benchmarks/exit_aborts.py [--runs 20] [--nproc 2] [--which run,profile,profile-full]

``run``: ``tracekit run zero3 --nproc N --steps 2 --prefetch 0``; ``profile``: the 2-rank
tracekit.profile user job of tests/test_profile_api.py under torchrun (context manager only);
``profile-full``: the same job whole (decorator, two-cycle callback, its own
``destroy_process_group``), the one that aborted in CI. A
run counts as an abort when it exits non-zero or its output says ``terminate called`` or
``SIGABRT`` / ``Signals.SIGABRT``. Prints one line per run and the counts; exit 1 if any aborted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # tests.*: its builders and data

ABORT_MARKS = ("terminate called", "SIGABRT", "Aborted", "Fatal Python error")


def _run_cmd(nproc: int, out: Path) -> list[str]:
    return [
        sys.executable, "-m", "tracekit", "run", "zero3", "--nproc", str(nproc),
        "--steps", "2", "--prefetch", "0", "--out", str(out),
    ]  # fmt: skip


def _profile_cmd(nproc: int, out: Path) -> list[str]:
    from tests.test_profile_api import USER_JOB  # the job the test runs, not a copy of it

    script = out / "user_job.py"
    script.write_text(USER_JOB)
    return [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
        "--standalone", str(script), str(out / "p"),
    ]  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--which", default="run,profile,profile-full")
    a = p.parse_args()
    aborts: dict[str, int] = {}
    for which in a.which.split(","):
        build = {"run": _run_cmd, "profile": _profile_cmd, "profile-full": _profile_cmd}[which]
        env = dict(os.environ, **({"ONLY_CTX": "1"} if which == "profile" else {}))
        aborts[which] = 0
        for i in range(a.runs):
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                done = subprocess.run(
                    build(a.nproc, Path(tmp)), capture_output=True, text=True, env=env, cwd=ROOT
                )
                text = done.stdout + done.stderr
                bad = done.returncode != 0 or any(m in text for m in ABORT_MARKS)
                aborts[which] += bad
                print(
                    f"{which} {i + 1}/{a.runs}: rc {done.returncode}"
                    f" {'ABORT' if bad else 'ok'} {time.perf_counter() - t0:.1f} s",
                    flush=True,
                )
                if bad:
                    print(text[-3000:], flush=True)
    print(" ".join(f"{w}: {n} aborts in {a.runs} runs" for w, n in aborts.items()), flush=True)
    return 1 if any(aborts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
