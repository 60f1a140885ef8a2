"""The commands that start jobs: run (one strategy) and demo (every strategy, then a report).

``tracekit run``'s options are generated from tracekit.strategies.options.RunOptions: one
declaration for this command, the launcher and the strategy modules' own parsers.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from tracekit.cli import tables
from tracekit.cli.tables import comparison_table
from tracekit.report import claims
from tracekit.strategies import options, registry

#: distribution name on PyPI (pyproject.toml [project] name); the import name is tracekit
DISTRIBUTION = "tracekit-dist"


def need_torch(command: str) -> None:
    """The runs need torch, the `runs` extra; without it one line saying how to get it."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        from tracekit.errors import TracekitError

        raise TracekitError(
            f"{command} needs torch, which is not installed: pip install '{DISTRIBUTION}[runs]'"
            " (from a clone: pip install -c constraints-cpu.txt -e '.[runs]')"
        )


def click_options(command: Callable[..., None]) -> Callable[..., None]:
    """Decorate ``command`` with one click option per RunOptions field of ``tracekit run``:
    every default None (unset: RunOptions' default applies; the help says which), flags
    False; the type and its range or choices from the field's declaration."""
    for f, how, kind in reversed(list(options.declared("run"))):
        name = options.flag(f.name)
        if kind is bool:
            command = click.option(name, is_flag=True, default=False, help=how.help)(command)
            continue
        ctype: click.ParamType | None = None
        if how.choices is not None:
            ctype = click.Choice(list(how.choices))
        elif kind is int:
            lo, hi = how.min, how.max
            ctype = click.IntRange(None if lo is None else int(lo), None if hi is None else int(hi))
        elif kind is float:
            ctype = click.FloatRange(min=how.min, max=how.max, min_open=how.min_open)
        elif kind is Path:
            ctype = click.Path(path_type=Path)
        command = click.option(name, type=ctype, default=None, help=how.help)(command)
    return command


@click.command(
    "run",
    epilog="Strategies: " + ", ".join(registry.STRATEGIES) + " (docs/strategies.md).",
)
@click.argument("strategy", metavar="STRATEGY")
@click_options
def run_cmd(strategy: str, **opts: object) -> None:
    """Run STRATEGY under the profiler; the last line of stdout is the run folder."""
    need_torch("tracekit run")
    from tracekit.capture.launch import run_job
    from tracekit.runfolder import check_runs_parent, load_run_json

    given = {k: v for k, v in opts.items() if v is not None and v is not False}
    check_runs_parent(Path(str(given.get("out", "runs"))))  # before any rank starts
    quiet = _WithoutProfilerNoise(sys.stderr)
    try:
        run_dir = run_job(options.RunOptions(strategy, **given), log=quiet)  # type: ignore[arg-type]
    finally:
        quiet.flush()
    status = (load_run_json(run_dir) or {}).get("status")
    click.echo(tables.safe(str(run_dir)))
    if status != "ok":
        # the run folder keeps what survived; its path stays the last line of stdout
        line = f"tracekit: {run_dir}: run {status}; see run.json errors and logs/"
        print(tables.safe(line), file=sys.stderr)
        sys.exit(1)


class _WithoutProfilerNoise:
    """What ``tracekit run`` copies to the terminal: the job's output less the profiler's own
    chatter (kineto's ``USDT: ... profiler_start`` / ``STAGE: ...`` lines), which every rank
    prints twice a run and which says nothing about the job; logs/ keeps every line."""

    NOISE = re.compile(r"^(?:\[\w+\]:)?(?:USDT:|STAGE:)")

    def __init__(self, sink: Any) -> None:
        self.sink, self._partial = sink, ""

    def write(self, text: str) -> int:
        *lines, self._partial = (self._partial + text).split("\n")
        kept = [line for line in lines if not self.NOISE.match(line)]
        if kept:
            self.sink.write("\n".join(kept) + "\n")
        return len(text)

    def flush(self) -> None:
        if self._partial and not self.NOISE.match(self._partial):
            self.sink.write(self._partial)
        self._partial = ""
        self.sink.flush()


class _JobOutput:
    """Where the demo's launcher copies the job's output: not to the terminal (every line is
    kept in <run>/logs/launcher.log and each rank's in logs/rank<R>.stdout.log / .stderr.log);
    only rank 0's latest step line reaches the progress line, through ``show``."""

    _STEP = re.compile(r"^(?:\[\w+\]:)?\[[\w.-]+\] (step \d+ \([\w-]+\))")

    def __init__(self, show: Callable[[str], None]) -> None:
        self.show, self._partial = show, ""

    def write(self, text: str) -> int:
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            if m := self._STEP.match(line):
                self.show(m[1])
        return len(text)

    def flush(self) -> None:
        pass


def _wanted(only: str | None) -> set[str]:
    """The demo strategies ``--only`` names (all without it); an unknown name is one line and
    exit 2 listing them, never silently dropped."""
    known = list(dict.fromkeys(s for s, _ in registry.demo_runs()))
    if only is None:
        return set(known)
    wanted = [s.strip() for s in only.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in known]
    if unknown or not wanted:
        from tracekit.errors import TracekitError

        what = ", ".join(unknown) if unknown else repr(only)
        raise TracekitError(f"--only: no demo strategy {what}; the strategies: {', '.join(known)}")
    return set(wanted)


def _without_wire(runs: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """The demo runs, those on an emulated network moved to logical nodes where this machine
    cannot make one (one line says why)."""
    from tracekit.capture import netns

    wired = [name for name, o in runs if o.get("emulate_network")]
    why = netns.unavailable() if wired else None
    if why is None:
        return runs
    tables.err.print(
        escape(f"tracekit demo: {', '.join(sorted(set(wired)))} on logical nodes, not an emulated "
               f"network ({why}): their transfers are CPU work, so prefetch cannot shorten a step"),
        highlight=False,
    )  # fmt: skip
    drop = ("emulate_network", "inter_node_bandwidth")
    return [(name, {k: v for k, v in o.items() if k not in drop}) for name, o in runs]


def _trust(summary: Any) -> str:
    """How far the run's timings hold, for its demo line: CPU waiting and step spread (#27)."""
    parts = []
    c = summary.contention
    if c is not None and c.cpu_wait_share_max is not None:
        parts.append(claims.cpu_wait_words(c))
    if summary.steps is not None:
        parts.append(f"step {summary.steps.median_s:.3g} s, spread {summary.steps.spread:.0%}")
    return f" ({'; '.join(parts)})" if parts else ""


@click.command("demo")
@click.option(
    "--out", type=click.Path(path_type=Path), default=Path("runs"), help="parent of the run folders"
)
@click.option("--only", default=None, help="comma-separated strategies to run (default: all)")
def demo_cmd(out: Path, only: str | None) -> None:
    """The main job: every strategy on CPU, analysed, a comparison report written.

    The terminal shows one progress line per run; the ranks' output goes to each run's logs/."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from tracekit.analysis import analyze
    from tracekit.analysis_folder import default_out_dir, write_analysis
    from tracekit.capture.launch import run_job
    from tracekit.report import write_report
    from tracekit.runfolder import check_runs_parent, load_run_json
    from tracekit.runname import display_name, display_names

    check_runs_parent(out)  # before any run starts
    runs = _without_wire([(s, o) for s, o in registry.demo_runs() if s in _wanted(only)])
    need_torch("tracekit demo")
    console = tables.out()
    done, results, failed = [], [], []
    t_demo = time.perf_counter()
    tables.err.print(
        f"tracekit demo: {len(runs)} runs into {escape(str(out))}/ (rank output: <run>/logs/)",
        highlight=False,
    )
    for i, (strategy, run_options) in enumerate(runs, 1):
        name = display_name({"strategy": strategy, "config": run_options})
        label = f"run {i}/{len(runs)} {name}"
        t0 = time.perf_counter()
        # a live line on a terminal only (elsewhere rich would leave an empty line per run)
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=tables.err,
            transient=True,
            disable=not tables.err.is_terminal,
        ) as progress:
            task = progress.add_task(escape(f"{label} starting"))

            def show(what: str, task=task, progress=progress, label=label) -> None:
                progress.update(task, description=escape(f"{label} {what}"))

            run_dir = run_job(
                options.RunOptions(strategy, out=out, **run_options), log=_JobOutput(show)
            )
            status = (load_run_json(run_dir) or {}).get("status")
            if status == "ok":
                show("analysing")
                result = analyze(run_dir)
                write_analysis(result, default_out_dir(run_dir))
                done.append(run_dir)
                results.append(result)
        took = f"{time.perf_counter() - t0:.1f} s"
        if status == "ok":
            trust = _trust(results[-1].summary)
            tables.err.print(f"{escape(label)} ... {took}{escape(trust)}", highlight=False)
        else:
            failed.append(name)
            tables.err.print(
                f"{escape(label)} ... [red]{escape(str(status))}[/] after {took}: "
                f"see {escape(str(run_dir))}/logs/",
                highlight=False,
            )
    tables.err.print(f"{len(runs)} runs in {time.perf_counter() - t_demo:.1f} s", highlight=False)
    if results:
        names = display_names(done)
        console.print(comparison_table(names, results, width=console.width))
        tables.print_claims(results)
        report = Path(out) / "demo-report.html"
        write_report(results, report, "html", names=names)
        console.print(
            f"next: `tracekit dash {escape(str(out))}` / open {escape(str(report))}",
            highlight=False,
            soft_wrap=True,  # one line, however long the paths: the terminal wraps it, not rich
        )
    if failed:
        print(tables.safe(f"tracekit: demo: {', '.join(failed)} failed"), file=sys.stderr)
        sys.exit(1)
