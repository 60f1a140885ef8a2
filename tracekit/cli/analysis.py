"""The commands on the analysis side: analyze, report, compare, predict.

The consoles and tables (tracekit.cli.tables: rich, the summary schema) are imported inside the
commands: `tracekit analyze` starts reading its traces first (:func:`_read_ahead`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from tracekit import run_inputs
from tracekit.errors import TracekitError, printable
from tracekit.ingest.read_options import ReadOptions


def _ranks_option(value: str | None):  # -> RankSet | None
    """--ranks as intervals (tracekit.ingest.selection.RankSet): tested, never listed."""
    if not value:
        return None
    from tracekit.ingest.selection import RankSet

    try:
        return RankSet.parse(value)
    except ValueError as exc:
        raise TracekitError(str(exc), f"--ranks {value}") from None


def _read_ahead(path: Path, options: ReadOptions) -> None:
    """Start reading the traces this analysis will parse while polars and the analyses are
    imported (tracekit.ingest.read_ahead): when it reads every trace PATH names (no
    rank selection), those without a cache entry."""
    from tracekit import runfolder
    from tracekit.ingest import cache_paths, kineto_files

    cache, cache_dir = options.cache, options.cache_dir
    if options.subset:
        return
    try:
        files = runfolder.find_trace_files(path)
    except (TracekitError, OSError):
        return  # the analysis says what is wrong
    if cache:
        files = [
            f for f in files if not any(e.exists() for e in cache_paths.candidates(f, cache_dir))
        ]
    kineto_files.prefetch(files)


def _check_cache_dir(cache_dir: Path | None, path: Path, out: Path) -> None:
    """Refuse a cache folder that is or is inside an input (a trace, run.json, memory/, ...)
    or the analysis folder (replaced whole by the next analysis). A run folder's traces/ is
    allowed: entries beside the traces are the cache's own place (tracekit.ingest.cache)."""
    from tracekit.ingest import cache_paths

    where = cache_paths.folder(cache_dir)
    option = "--cache-dir" if cache_dir is not None else "--cache-dir (or TRACEKIT_CACHE_DIR)"
    run_inputs.refuse_input_overlap(where, run_inputs.inputs_of(path, traces_folder=False), option)
    if Path(os.path.realpath(where)).is_relative_to(os.path.realpath(out)):
        raise TracekitError(
            f"is inside the analysis folder {out}, which the next analysis replaces whole; "
            f"choose another place with {option}",
            where,
        )


@click.command("analyze")
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
    "also threads or processes); needs pip install 'tracekit-dist[cluster]'. A scheduler address "
    "is code execution (Dask's protocol carries pickles): name only one you trust; tls:// uses "
    "Dask's TLS settings (DASK_DISTRIBUTED__COMM__TLS__*, docs/cluster.md)",
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
    from tracekit.ingest import read_ahead

    t0 = time.perf_counter()
    target = out or default_out_dir(path)
    options = ReadOptions(  # built once: the read-ahead, the loader and the timeline step read it
        ranks_per_node=ranks_per_node,
        ranks=_ranks_option(ranks),
        sample=sample,
        cache=cache,
        cache_dir=cache_dir,
        align_clocks=align_clocks,
        scheduler=scheduler,
    )
    check_out(target, path)  # before the work: an --out that must not be replaced is refused
    if cache:
        _check_cache_dir(cache_dir, path, target)
    _read_ahead(path, options)
    from rich.markup import escape

    from tracekit.cli import tables

    try:
        from tracekit import engines
        from tracekit.analysis import analyze  # polars and the analyses: the read-ahead's time

        read_ahead.stop()
        if engines.resolve(scheduler):  # the ranks are read where the engine runs them
            read_ahead.discard()
        with tables.err.status(f"analysing {path}") as status:
            result = analyze(path, options, progress=tables.read_progress(status.update, str(path)))
            read_ahead.discard()
            try:
                target = write_analysis(result, target)
            finally:
                result.close()  # the command leaves by os._exit: no finalizer would run
    finally:
        read_ahead.discard()
    for w in result.summary.warnings:
        tables.err.print(
            f"[yellow]warning:[/] {escape(printable(w))}", highlight=False, markup=True
        )  # text, never markup, never a raw escape character
    from tracekit.cli.why import diagnosis_lines

    for line in diagnosis_lines(result.summary):  # the diagnosis heads the output
        tables.out().print(printable(line), highlight=False, markup=False)
    tables.out().print(tables.rank_table(result.summary))
    if (pipe := tables.pipeline_table(result.summary)) is not None:
        tables.out().print(pipe)
    tables.err.print(
        f"wrote {escape(str(target))} in {time.perf_counter() - t0:.2f} s", highlight=False
    )


F = TypeVar("F", bound=Callable[..., Any])
_REPORT_FORMATS = ["html", "pdf", "png", "md", "json", "csv", "parquet", "perfetto"]


def _write_report(paths: tuple[Path, ...], out: Path | None, fmt: str | None) -> None:
    from rich.markup import escape

    from tracekit.analysis import analyze
    from tracekit.cli import tables
    from tracekit.report import default_output, format_of, write_report
    from tracekit.report.write import refuse_inputs
    from tracekit.runname import display_names

    fmt = fmt or (format_of(out) if out else "html")
    target = out or default_output(fmt)
    refuse_inputs(target, paths)  # before the work: a report never lands on an input
    t0 = time.perf_counter()
    with tables.err.status(f"{fmt} report of {len(paths)} path(s)") as status:
        analyses = []
        for i, p in enumerate(paths, 1):
            status.update(f"analysing {p} ({i}/{len(paths)})")
            analyses.append(analyze(p))
        names = display_names(list(paths))
        write_report(analyses, target, fmt, names=names, progress=status.update)
    tables.err.print(
        f"wrote {escape(str(target))} in {time.perf_counter() - t0:.2f} s", highlight=False
    )


def _report_options(out_help: str, format_help: str | None = None) -> Callable[[F], F]:
    """PATHS, ``-o/--out`` and ``--format``: what ``report`` and ``compare`` both take."""

    def wrap(command: F) -> F:
        for option in reversed(
            [
                click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path)),
                click.option(
                    "-o", "--out", type=click.Path(path_type=Path), default=None, help=out_help
                ),
                click.option(
                    "--format",
                    "fmt",
                    type=click.Choice(_REPORT_FORMATS),
                    default=None,
                    help=format_help,
                ),
            ]
        ):
            command = option(command)
        return command

    return wrap


@click.command("report")
@_report_options(
    "output file (default report.<ext>)",
    "html (default), pdf, png, md, json, csv, parquet, perfetto",
)
def report_cmd(paths: tuple[Path, ...], out: Path | None, fmt: str | None) -> None:
    """Write a report of PATH (several PATHs: a comparison report)."""
    _write_report(paths, out, fmt or ("html" if out is None else None))


@click.command("compare")
@_report_options("also write a report to this file")
def compare_cmd(paths: tuple[Path, ...], out: Path | None, fmt: str | None) -> None:
    """Compare runs side by side: a table on stdout (and a report with -o)."""
    from tracekit.analysis import analyze
    from tracekit.cli import tables
    from tracekit.report import write_report
    from tracekit.runname import display_names

    if len(paths) < 2:
        raise click.UsageError("compare needs at least two paths")
    if out is not None:
        from tracekit.report.write import refuse_inputs

        refuse_inputs(out, paths)  # before the work: a report never lands on an input
    names = display_names(list(paths))
    results = []
    with tables.err.status("comparing") as status:
        for i, p in enumerate(paths, 1):
            status.update(f"analysing {p} ({i}/{len(paths)})")
            results.append(analyze(p))
        if out is not None:
            status.update(f"writing {out}")
            write_report(results, out, fmt, names=names)
    tables.out().print(tables.comparison_table(names, results))
    tables.print_claims(results)
    if out is not None:
        tables.err.print(f"wrote {out}", highlight=False)


@click.command("predict")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--inter-node-bandwidth",
    default=None,
    help="rate (400mbit, 1gbit, bits/s) or a sweep LO:HI, e.g. 100mbit:100gbit",
)
@click.option(
    "--without-straggler", is_flag=True, help="the step without the top cause's excess work"
)
@click.option(
    "--rank-speed",
    "rank_speeds",
    multiple=True,
    help="RANK:SPEED (1:1.5: rank 1 works 1.5x faster) or a curve RANK:LO:HI; repeatable",
)
@click.option("--intra-node-bandwidth", default=None, help="rate (default: as measured)")
@click.option("--latency", "latency_us", type=float, default=0.0, help="per message step, us")
@click.option(
    "--out", type=click.Path(path_type=Path), default=None, help="folder (default RUN/analysis)"
)
def predict_cmd(
    paths: tuple[Path, ...],
    inter_node_bandwidth: str | None,
    without_straggler: bool,
    rank_speeds: tuple[str, ...],
    intra_node_bandwidth: str | None,
    latency_us: float,
    out: Path | None,
) -> None:
    """Predict each run's step on another network, or without its straggler, from its trace
    (docs/predict.md)."""
    from tracekit.cli import tables
    from tracekit.cli.prediction import run_predict

    run_predict(
        list(paths),
        inter_node_bandwidth,
        intra_node_bandwidth,
        latency_us,
        out,
        tables.out(),
        without_straggler=without_straggler,
        rank_speeds=list(rank_speeds),
    )
