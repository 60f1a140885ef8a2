"""The `tracekit` command line (docs/cli.md): the group, ``dash``, and the entry point.

Bad input never shows a traceback: TracekitError becomes one line on stderr and exit status 2.
Progress and logs go to stderr; results (tables, the run folder's path) to stdout.

    runs        run, demo                       (start jobs; options from instrumented_runs.options)
    analysis    analyze, report, compare, predict
    predict     predict's tables and curves
    tables      the consoles, and tables that fit them
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from tracekit.cli import analysis, runs
from tracekit.errors import TracekitError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tracekit")
def cli() -> None:
    """Make the cost of distributed-training strategies visible."""


for _command in (
    runs.run_cmd,
    analysis.analyze_cmd,
    runs.demo_cmd,
    analysis.report_cmd,
    analysis.compare_cmd,
    analysis.predict_cmd,
):
    cli.add_command(_command)


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
