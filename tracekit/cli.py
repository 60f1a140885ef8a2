"""The `tracekit` command line (docs/cli.md).

Bad input never shows a traceback: TracekitError becomes one line on stderr and exit status 2.
Progress and logs go to stderr; results (tables, the run folder's path) to stdout.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click
from rich.cells import cell_len
from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tracekit.errors import TracekitError

# stderr: when it is not a terminal (a log, a pipe, CI) lines are never wrapped, so that one
# warning is one line whatever its length
_err = Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, soft_wrap=True)


def _out() -> Console:
    """stdout console: the terminal's width, or COLUMNS; wide (160) when piped without COLUMNS.
    Tables are stacked to fit whatever width this is (fit_tables), so numbers are never cut."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit():
        return Console()
    return Console(width=160)


def _ranks_option(value: str | None):  # -> RankSet | None
    """--ranks as intervals (tracekit.ingest.selection.RankSet): tested, never listed."""
    if not value:
        return None
    from tracekit.ingest.selection import RankSet

    try:
        return RankSet.parse(value)
    except ValueError as exc:
        raise TracekitError(str(exc), f"--ranks {value}") from None


def rank_table(summary: dict, width: int | None = None) -> Group:
    """The per-rank breakdown (seconds, and percent of span), stacked to fit ``width``."""
    win = summary["window"]
    head = ["rank", "node", "span s", "step s", "compute", "comm", "overlap", "exposed"]
    head += ["other", "idle"]
    rows = []
    for r in summary["ranks"]:
        span = r["span_s"] or 0.0

        def cell(key: str) -> str:
            v = r[key] or 0.0
            return f"{v:.4f} ({100 * v / span:.0f}%)" if span else f"{v:.4f}"

        step = r.get("step_time_s")
        rows.append(
            [
                str(r["rank"]),
                str(r["node"]),
                f"{span:.4f}",
                "–" if step is None else f"{step:.4f}",
                *(cell(k) for k in ("compute_s", "comm_s", "overlap_s", "exposed_comm_s")),
                cell("other_s"),
                cell("idle_s"),
            ]
        )
    title = f"per-rank breakdown ({win['kind']}, {win['steps']} steps)"
    return fit_tables(title, head, rows, keys=2, width=width)


def pipeline_table(summary: dict) -> Group | None:
    """The pipeline section (bubbles per stage against theory and replay), if the run has one."""
    if not summary.get("pipeline"):
        return None
    from tracekit.analyses.pipeline import table

    title, head, rows = table(summary["pipeline"])
    return fit_tables(title, head, [[str(c) for c in row] for row in rows], keys=2)


def comparison_table(names: list[str], results: list, width: int | None = None) -> Group:
    """Several runs side by side (tracekit.report.compare_table), stacked to fit ``width``.

    The names are display names (tracekit.runname), which start with the strategy, so the
    strategy column is left out; bubble and all-gather hidden come next to the time columns."""
    from tracekit.report import compare_table

    title, head, rows = compare_table([(n, r.typed_summary) for n, r in zip(names, results)])
    order = [i for i, h in enumerate(head) if h != "strategy"]
    for moved in ("bubble", "all-gather hidden"):
        if moved in head:
            order.remove(head.index(moved))
            order.insert(order.index(head.index("idle %")) + 1, head.index(moved))
    head = [head[i] for i in order]
    rows = [[row[i] for i in order] for row in rows]
    return fit_tables(title, head, rows, keys=1, width=width, left=1)


def fit_tables(
    title: str,
    head: list[str],
    rows: list[list[str]],
    keys: int = 1,
    width: int | None = None,
    left: int = 0,
) -> Group:
    """Rich tables of these columns, as many as it takes to fit ``width`` (default: the stdout
    console's): the first ``keys`` columns (what names a row) in every one, the others packed in
    order. A cell is never cut or wrapped (each column is at least as wide as its widest cell);
    headers wrap between words."""
    width = width or _out().width

    def content(i: int) -> int:  # the widest cell, or the header's longest word
        words = max((cell_len(w) for w in head[i].split()), default=0)
        return max([words, *(cell_len(row[i]) for row in rows)])

    def need(i: int) -> int:  # the column's width in the box: content, padding, one rule
        return content(i) + 3

    base = 1 + sum(need(i) for i in range(keys))
    groups: list[list[int]] = [[]]
    used = base
    for i in range(keys, len(head)):
        if groups[-1] and used + need(i) > width:
            groups.append([])
            used = base
        groups[-1].append(i)
        used += need(i)
    tables: list[Text | Table] = [Text(title)]  # once, wrapped at the console, not each table
    for group in groups:
        cols = [*range(keys), *group]
        widths = {i: content(i) for i in cols}
        slack = width - 1 - sum(w + 3 for w in widths.values())
        # room left: headers on one line, the shortest first (the most headers unwrapped)
        for i in sorted(cols, key=lambda i: cell_len(head[i]) - widths[i]):
            grow = min(max(cell_len(head[i]) - widths[i], 0), slack)
            widths[i] += grow
            slack -= grow
        t = Table()
        for i in cols:
            # a fixed width: rich would otherwise shrink the widest column first, cells included
            t.add_column(
                head[i], justify="left" if i < left else "right", width=widths[i], overflow="fold"
            )
        for row in rows:
            t.add_row(*(Text(row[i]) for i in cols))  # text, never markup
        tables.append(t)
    return Group(*tables)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tracekit")
def cli() -> None:
    """Make the cost of distributed-training strategies visible."""


@cli.command("run")
@click.argument("strategy")
@click.option("--nproc", type=click.IntRange(1), default=None, help="ranks (default 2)")
@click.option(
    "--nodes", type=click.IntRange(1), default=None, help="logical nodes; ranks placed contiguously"
)
@click.option("--steps", type=click.IntRange(1), default=None, help="profiled steps (default 3)")
@click.option(
    "--warmup", type=click.IntRange(0), default=None, help="unprofiled warm-up steps (default 1)"
)
@click.option("--microbatches", type=click.IntRange(1), default=None)
@click.option("--precision", type=click.Choice(["fp32", "bf16-mixed"]), default=None)
@click.option("--prefetch", type=click.IntRange(0, 2), default=None)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None)
@click.option("--backend", type=click.Choice(["gloo", "nccl"]), default=None)
@click.option(
    "--timeout", type=click.FloatRange(min=0, min_open=True), default=None, help="seconds"
)
@click.option("--emulate-network", is_flag=True, default=False)
@click.option("--inter-node-bandwidth", default=None, help="tc rate, e.g. 400mbit (default 1gbit)")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="parent of the run folder (default ./runs)",
)
def run_cmd(strategy: str, **opts) -> None:
    """Run STRATEGY under the profiler; the last line of stdout is the run folder."""
    from tracekit.launch import RunOptions, run_job

    given = {k: v for k, v in opts.items() if v is not None and v is not False}
    from tracekit.runfolder import load_run_json

    run_dir = run_job(RunOptions(strategy=strategy, **given))
    status = (load_run_json(run_dir) or {}).get("status")
    click.echo(str(run_dir))
    if status != "ok":
        # the run folder keeps what survived; its path stays the last line of stdout
        print(f"tracekit: {run_dir}: run {status}; see run.json errors and logs/", file=sys.stderr)
        sys.exit(1)


@cli.command("analyze")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--ranks-per-node", type=click.IntRange(1), default=None)
@click.option("--ranks", default=None, help="subset of ranks, e.g. 0,1,4-7")
@click.option(
    "--sample",
    type=click.IntRange(1),
    default=None,
    help="a sampled overview: analyse N ranks spread over the job (first, last, evenly between)",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="output folder (default PATH/analysis)",
)
@click.option(
    "--cache/--no-cache",
    default=True,
    show_default=True,
    help="keep each trace's parsed events as parquet in the cache folder and reuse them",
)
@click.option(
    "--cache-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="cache folder (default $TRACEKIT_CACHE_DIR, else $XDG_CACHE_HOME/tracekit or "
    "~/.cache/tracekit)",
)
@click.option(
    "--align-clocks/--no-align-clocks",
    default=None,
    help="put ranks on one clock from collective ends (default: when traces come from several hosts)",
)
@click.option(
    "--scheduler",
    default=None,
    metavar="ADDRESS",
    help="parse the ranks on a Dask cluster, e.g. tcp://HOST:8786 (default $TRACEKIT_SCHEDULER; "
    "also threads or processes); needs pip install 'tracekit[cluster]'",
)
def analyze_cmd(
    path: Path,
    ranks_per_node: int | None,
    ranks: str | None,
    sample: int | None,
    out: Path | None,
    cache: bool,
    cache_dir: Path | None,
    align_clocks: bool | None,
    scheduler: str | None,
) -> None:
    """Analyse a run folder, a folder of Kineto traces, or one trace."""
    from tracekit.analysis_folder import check_out, default_out_dir, write_analysis
    from tracekit.analyze import analyze

    t0 = time.perf_counter()
    target = out or default_out_dir(path)
    rank_set = _ranks_option(ranks)
    check_out(target, path)  # before the work: an --out that must not be replaced is refused
    with _err.status(f"analysing {path}"):
        result = analyze(
            path,
            ranks_per_node=ranks_per_node,
            ranks=rank_set,
            sample=sample,
            cache=cache or False,
            cache_dir=cache_dir,
            align_clocks=align_clocks,
            scheduler=scheduler,
        )
        target = write_analysis(result, target)
    for w in result.summary["warnings"]:
        _err.print(
            f"[yellow]warning:[/] {escape(w)}", highlight=False, markup=True
        )  # text, never markup
    _out().print(rank_table(result.summary))
    if (pipe := pipeline_table(result.summary)) is not None:
        _out().print(pipe)
    _err.print(f"wrote {escape(str(target))} in {time.perf_counter() - t0:.2f} s", highlight=False)


# strategy -> options of its demo run (world size 2 keeps a 2-core laptop responsive)
# strategy -> options of its demo run: world size 2 where the idea shows at 2 ranks (a 2-core
# laptop stays responsive), 4 where it needs two nodes or four pipeline stages
DEMO_RUNS: list[tuple[str, dict]] = [
    ("dp", {"nproc": 2, "steps": 3}),
    ("zero1", {"nproc": 2, "steps": 3}),
    ("zero2", {"nproc": 2, "steps": 3}),
    ("zero3", {"nproc": 2, "steps": 3, "prefetch": 0}),
    ("zero3", {"nproc": 2, "steps": 3, "prefetch": 1}),
    ("fsdp", {"nproc": 2, "steps": 3}),
    ("hsdp", {"nproc": 4, "nodes": 2, "steps": 3}),
    ("tp", {"nproc": 2, "steps": 3}),
    ("tp-dp", {"nproc": 4, "nodes": 2, "steps": 3}),
    ("pp-gpipe", {"nproc": 4, "microbatches": 8, "steps": 3}),
    ("pp-1f1b", {"nproc": 4, "microbatches": 8, "steps": 3}),
    ("pp-pipedream", {"nproc": 4, "microbatches": 8, "steps": 3}),
]


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


@cli.command("demo")
@click.option(
    "--out", type=click.Path(path_type=Path), default=Path("runs"), help="parent of the run folders"
)
@click.option("--only", default=None, help="comma-separated strategies to run (default: all)")
def demo_cmd(out: Path, only: str | None) -> None:
    """The main job: every strategy on CPU, analysed, a comparison report written.

    The terminal shows one progress line per run; the ranks' output goes to each run's logs/."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from tracekit.analysis_folder import default_out_dir, write_analysis
    from tracekit.analyze import analyze
    from tracekit.launch import RunOptions, run_job
    from tracekit.report import write_report
    from tracekit.runfolder import load_run_json
    from tracekit.runname import display_name, display_names

    wanted = None if only is None else {s.strip() for s in only.split(",") if s.strip()}
    runs = [(s, o) for s, o in DEMO_RUNS if wanted is None or s in wanted]
    if not runs:
        raise click.UsageError(f"--only {only!r} names no demo strategy")
    console = _out()
    done, results, failed = [], [], []
    t_demo = time.perf_counter()
    _err.print(
        f"tracekit demo: {len(runs)} runs into {escape(str(out))}/ (rank output: <run>/logs/)",
        highlight=False,
    )
    for i, (strategy, options) in enumerate(runs, 1):
        name = display_name({"strategy": strategy, "config": options})
        label = f"run {i}/{len(runs)} {name}"
        t0 = time.perf_counter()
        # a live line on a terminal only (elsewhere rich would leave an empty line per run)
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=_err,
            transient=True,
            disable=not _err.is_terminal,
        ) as progress:
            task = progress.add_task(escape(f"{label} starting"))

            def show(what: str, task=task, progress=progress, label=label) -> None:
                progress.update(task, description=escape(f"{label} {what}"))

            run_dir = run_job(
                RunOptions(strategy=strategy, out=out, **options), log=_JobOutput(show)
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
            _err.print(f"{escape(label)} ... {took}", highlight=False)
        else:
            failed.append(name)
            _err.print(
                f"{escape(label)} ... [red]{escape(str(status))}[/] after {took}: "
                f"see {escape(str(run_dir))}/logs/",
                highlight=False,
            )
    _err.print(f"{len(runs)} runs in {time.perf_counter() - t_demo:.1f} s", highlight=False)
    if results:
        names = display_names(done)
        console.print(comparison_table(names, results, width=console.width))
        report = Path(out) / "demo-report.html"
        write_report(done, report, "html", analyses=results, names=names)
        console.print(
            f"next: `tracekit dash {escape(str(out))}` / open {escape(str(report))}",
            highlight=False,
            soft_wrap=True,  # one line, however long the paths: the terminal wraps it, not rich
        )
    if failed:
        print(f"tracekit: demo: {', '.join(failed)} failed", file=sys.stderr)
        sys.exit(1)


_REPORT_FORMATS = ["html", "pdf", "png", "md", "json", "csv", "parquet", "perfetto"]


def _format_from_suffix(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".perfetto.json") or name.endswith(".trace.json"):
        return "perfetto"
    suffix = path.suffix.lower().lstrip(".")
    return (
        {"htm": "html", "markdown": "md"}.get(suffix, suffix)
        if suffix in _REPORT_FORMATS + ["htm", "markdown"]
        else "html"
    )


def _write_report(paths: tuple[Path, ...], out: Path | None, fmt: str | None) -> None:
    from tracekit.report import default_output, write_report

    fmt = fmt or (_format_from_suffix(out) if out else "html")
    target = out or default_output(fmt)
    t0 = time.perf_counter()
    with _err.status(f"{fmt} report of {len(paths)} path(s)") as status:
        write_report(list(paths), target, fmt, progress=lambda msg: status.update(msg))
    _err.print(f"wrote {escape(str(target))} in {time.perf_counter() - t0:.2f} s", highlight=False)


@cli.command("report")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="output file (default report.<ext>)",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(_REPORT_FORMATS),
    default=None,
    help="html (default), pdf, png, md, json, csv, parquet, perfetto",
)
def report_cmd(paths: tuple[Path, ...], out: Path | None, fmt: str | None) -> None:
    """Write a report of PATH (several PATHs: a comparison report)."""
    _write_report(paths, out, fmt or ("html" if out is None else None))


@cli.command("compare")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="also write a report to this file",
)
@click.option("--format", "fmt", type=click.Choice(_REPORT_FORMATS), default=None)
def compare_cmd(paths: tuple[Path, ...], out: Path | None, fmt: str | None) -> None:
    """Compare runs side by side: a table on stdout (and a report with -o)."""
    from tracekit.analyze import analyze
    from tracekit.report import write_report
    from tracekit.runname import display_names

    if len(paths) < 2:
        raise click.UsageError("compare needs at least two paths")
    names = display_names(list(paths))
    results = []
    with _err.status("comparing") as status:
        for i, p in enumerate(paths, 1):
            status.update(f"analysing {p} ({i}/{len(paths)})")
            results.append(analyze(p))
        if out is not None:
            status.update(f"writing {out}")
            write_report(
                list(paths), out, fmt or _format_from_suffix(out), analyses=results, names=names
            )
    _out().print(comparison_table(names, results))
    if out is not None:
        _err.print(f"wrote {out}", highlight=False)


@cli.command("predict")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--inter-node-bandwidth",
    required=True,
    help="rate (400mbit, 1gbit, bits/s) or a sweep LO:HI, e.g. 100mbit:100gbit",
)
@click.option("--intra-node-bandwidth", default=None, help="rate (default: as measured)")
@click.option("--latency", "latency_us", type=float, default=0.0, help="per message step, us")
@click.option(
    "--out", type=click.Path(path_type=Path), default=None, help="folder (default RUN/analysis)"
)
def predict_cmd(
    paths: tuple[Path, ...],
    inter_node_bandwidth: str,
    intra_node_bandwidth: str | None,
    latency_us: float,
    out: Path | None,
) -> None:
    """Predict each run's step on another network from its trace (docs/predict.md)."""
    from tracekit.predict_cli import run_predict

    run_predict(list(paths), inter_node_bandwidth, intra_node_bandwidth, latency_us, out, _out())


@cli.command("dash")
@click.argument("root", required=False, type=click.Path(path_type=Path), default=Path("runs"))
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=8050, show_default=True)
def dash_cmd(root: Path, host: str, port: int) -> None:
    """Serve the Dash app over the run folders and trace folders under ROOT (default ./runs)."""
    if not root.is_dir():
        raise TracekitError("no such folder (give the folder holding your run folders)", root)
    from dashboards.app import serve

    serve(root, host=host, port=port)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: one-line errors, exit status 2 on bad input."""
    try:
        cli.main(args=argv, prog_name="tracekit", standalone_mode=False)
    except TracekitError as exc:
        print(f"tracekit: {exc}", file=sys.stderr)
        sys.exit(2)
    except click.exceptions.Abort:
        print("tracekit: interrupted", file=sys.stderr)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2)
    except KeyboardInterrupt:
        print("tracekit: interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    sys.exit(0)


#: Commands that hold nothing but files they have closed when they return: their process may
#: skip the interpreter's teardown (freeing every object and module: about 0.1 s, a tenth of
#: a warm ``analyze``). The others may own threads, browsers or servers with exit hooks.
_QUICK_EXIT = {"analyze"}


def run() -> None:
    """The program (console script and ``python -m tracekit.cli``): :func:`main`, then exit."""
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    else:
        code = 0
    if sys.argv[1:2] and sys.argv[1] in _QUICK_EXIT and isinstance(code, int):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
