"""The `tracekit` command line (DESIGN.md "The CLI contract").

Bad input never shows a traceback: TracekitError becomes one line on stderr and exit status 2.
Progress and logs go to stderr; results (tables, the run folder's path) to stdout.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from tracekit.errors import TracekitError

_err = Console(stderr=True)


def _out() -> Console:
    """stdout console; wide when piped so tables are not cut to 80 columns."""
    return Console() if sys.stdout.isatty() else Console(width=160)


def _ranks_option(value: str | None) -> list[int] | None:
    if not value:
        return None
    out: list[int] = []
    try:
        for part in value.split(","):
            if "-" in part:
                a, b = part.split("-", 1)
                out.extend(range(int(a), int(b) + 1))
            elif part.strip():
                out.append(int(part))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a rank list like 0,1,4-7") from None
    return out


def rank_table(summary: dict) -> Table:
    """The per-rank breakdown as a rich table (seconds, and percent of span)."""
    win = summary["window"]
    t = Table(title=f"per-rank breakdown ({win['kind']}, {win['steps']} steps)")
    for col in ("rank", "node", "span s", "step s", "compute", "comm", "overlap", "exposed", "other", "idle"):
        t.add_column(col, justify="right")
    for r in summary["ranks"]:
        span = r["span_s"] or 0.0

        def cell(key: str) -> str:
            v = r[key] or 0.0
            return f"{v:.4f} ({100 * v / span:.0f}%)" if span else f"{v:.4f}"

        step = r.get("step_time_s")
        t.add_row(
            str(r["rank"]), str(r["node"]), f"{span:.4f}", "-" if step is None else f"{step:.4f}",
            cell("compute_s"), cell("comm_s"), cell("overlap_s"), cell("exposed_comm_s"),
            cell("other_s"), cell("idle_s"),
        )
    return t


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tracekit")
def cli() -> None:
    """Make the cost of distributed-training strategies visible."""


@cli.command("run")
@click.argument("strategy")
@click.option("--nproc", type=click.IntRange(1), default=None, help="ranks (default 2)")
@click.option("--nodes", type=click.IntRange(1), default=None, help="logical nodes; ranks placed contiguously")
@click.option("--steps", type=click.IntRange(1), default=None, help="profiled steps (default 3)")
@click.option("--warmup", type=click.IntRange(0), default=None, help="unprofiled warm-up steps (default 1)")
@click.option("--microbatches", type=click.IntRange(1), default=None)
@click.option("--precision", type=click.Choice(["fp32", "bf16-mixed"]), default=None)
@click.option("--prefetch", type=click.IntRange(0, 2), default=None)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None)
@click.option("--backend", type=click.Choice(["gloo", "nccl"]), default=None)
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None, help="seconds")
@click.option("--emulate-network", is_flag=True, default=False)
@click.option("--inter-node-bandwidth", default=None, help="tc rate, e.g. 400mbit (default 1gbit)")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="parent of the run folder (default ./runs)")
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
@click.option("--out", type=click.Path(path_type=Path), default=None, help="output folder (default PATH/analysis)")
def analyze_cmd(path: Path, ranks_per_node: int | None, ranks: str | None, out: Path | None) -> None:
    """Analyse a run folder, a folder of Kineto traces, or one trace."""
    from tracekit.analyze import analyze, default_out_dir, write_analysis

    t0 = time.perf_counter()
    with _err.status(f"analysing {path}"):
        result = analyze(path, ranks_per_node=ranks_per_node, ranks=_ranks_option(ranks))
        target = write_analysis(result, out or default_out_dir(path))
    for w in result.summary["warnings"]:
        _err.print(f"[yellow]warning:[/] {w}", highlight=False, markup=True)
    _out().print(rank_table(result.summary))
    _err.print(f"wrote {target} in {time.perf_counter() - t0:.2f} s", highlight=False)


# strategy -> options of its demo run (world size 2 keeps a 2-core laptop responsive)
DEMO_RUNS: list[tuple[str, dict]] = [("dp", {"nproc": 2, "steps": 3})]


@cli.command("demo")
@click.option("--out", type=click.Path(path_type=Path), default=Path("runs"), help="parent of the run folders")
def demo_cmd(out: Path) -> None:
    """The main job: every strategy on CPU, analysed, a comparison written."""
    from tracekit.analyze import analyze, default_out_dir, write_analysis
    from tracekit.launch import RunOptions, run_job

    console = _out()
    for strategy, options in DEMO_RUNS:
        _err.print(f"[bold]demo:[/] {strategy} {options}", highlight=False)
        run_dir = run_job(RunOptions(strategy=strategy, out=out, **options))
        result = analyze(run_dir)
        write_analysis(result, default_out_dir(run_dir))
        console.print(f"[bold]{strategy}[/]  {run_dir}", highlight=False)
        console.print(rank_table(result.summary))


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


if __name__ == "__main__":
    main()
