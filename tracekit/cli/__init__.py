"""The `tracekit` command line (docs/cli.md): the group, ``dash``, and the entry point.

Bad input never shows a traceback: TracekitError becomes one line on stderr and exit status 2.
Progress and logs go to stderr; results (tables, the run folder's path) to stdout.

    runs        run, demo                       (start jobs; options from tracekit.strategies.options)
    analysis    analyze, report, compare, predict
    predict     predict's tables and curves
    tables      the consoles, and tables that fit them
"""

from __future__ import annotations

import errno
import importlib
import os
import sys
from pathlib import Path

import click

from tracekit._version import __version__
from tracekit.errors import TracekitError

#: command -> (module, attribute): a command's module is imported when it runs or is listed, so
#: `tracekit analyze` does not load the run side (the strategy modules) nor `run` the analysis side
_COMMANDS = {
    "run": ("tracekit.cli.runs", "run_cmd"),
    "analyze": ("tracekit.cli.analysis", "analyze_cmd"),
    "demo": ("tracekit.cli.runs", "demo_cmd"),
    "report": ("tracekit.cli.analysis", "report_cmd"),
    "compare": ("tracekit.cli.analysis", "compare_cmd"),
    "predict": ("tracekit.cli.analysis", "predict_cmd"),
    "why": ("tracekit.cli.why", "why_cmd"),
}


class _Commands(click.Group):
    """A group whose commands of :data:`_COMMANDS` are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in _COMMANDS and cmd_name not in self.commands:
            module, name = _COMMANDS[cmd_name]
            self.add_command(getattr(importlib.import_module(module), name), cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="tracekit")  # not the distribution's metadata
def cli() -> None:
    """Make the cost of distributed-training strategies visible."""


@cli.command("dash")
@click.argument("root", required=False, type=click.Path(path_type=Path), default=Path("runs"))
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=8050, show_default=True)
@click.option(
    "--analysis-timeout",
    type=click.FloatRange(1, 86400),
    default=300,
    show_default=True,
    help="Seconds a run's analysis may take; a run that takes longer is shown as failed.",
)
def dash_cmd(root: Path, host: str, port: int, analysis_timeout: float) -> None:
    """Serve the Dash app over the run folders and trace folders under ROOT (default ./runs)."""
    if not root.is_dir():
        raise TracekitError("no such folder (give the folder holding your run folders)", root)
    from dashboards.app import serve

    serve(root, host=host, port=port, analysis_timeout=analysis_timeout)


def click_problem(exc: click.ClickException) -> str:
    """A click error as ``<what>: <problem>``, one line: click's own form is a 4-line usage
    block (usage, a hint, a blank line, the error) where tracekit promises one line."""
    what = None
    if isinstance(exc, click.BadParameter):
        if exc.param_hint is not None:
            hint = exc.param_hint
            what = " / ".join(hint) if isinstance(hint, (list, tuple)) else str(hint)
        elif exc.param is not None:
            what = exc.param.get_error_hint(exc.ctx) if exc.ctx else exc.param.name
    elif isinstance(exc, click.NoSuchOption):
        what = exc.option_name
    elif isinstance(exc, click.UsageError) and exc.ctx is not None:
        what = exc.ctx.command_path
    text = " ".join(exc.format_message().split())
    if what:
        what = " ".join(what.replace("'", "").split())
        text = text.replace(f"Invalid value for '{what}': ", "").replace("'", "")
    return f"{what}: {text}" if what else text


def _inputs(argv: list[str]) -> str | None:
    """The paths the command line names (its arguments that exist), for a one-line error that
    comes from no particular file (out of memory)."""
    paths = [a for a in argv[1:] if not a.startswith("-") and os.path.lexists(a)]
    return ", ".join(paths) or None


def _at_inputs(argv: list[str], line: str) -> str:
    where = _inputs(argv)
    return f"{where}: {line}" if where else line


def _out_of_memory(argv: list[str], what: str) -> str:
    return _at_inputs(
        argv,
        f"out of memory ({what}); analyse fewer ranks at once (--ranks, --sample) "
        "or give the process more memory",
    )


def _memory_failure(exc: BaseException) -> str | None:
    """What says EXC (or an exception it was raised from) is memory running out, or None: under a
    memory limit a library's import fails to map its code ("failed to map segment from shared
    object", an ImportError), mmap fails with ENOMEM, a thread gets no stack."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = str(e)
        if isinstance(e, MemoryError):
            return "MemoryError"
        if isinstance(e, ImportError) and "failed to map segment" in text:
            return "a library's code could not be mapped"
        if isinstance(e, OSError) and e.errno == errno.ENOMEM:
            return "ENOMEM"
        if isinstance(e, RuntimeError) and "can't start new thread" in text:
            return "no memory for another thread"
        e = e.__cause__ or e.__context__
    return None


def _problem(text: str) -> None:
    """``tracekit: TEXT`` on stderr, one line, control characters shown escaped (a path named
    with a terminal escape is shown, never sent: tracekit.cli.tables.safe)."""
    from tracekit.cli.tables import safe

    print(f"tracekit: {safe(text)}", file=sys.stderr)


def _line_on_abort(argv: list[str]) -> None:
    """A library that aborts (Rust, when an allocation fails under a memory limit) ends the
    process with our line and status 2, after the library's own line (tracekit/ingest/_kscan.c)."""
    from tracekit.cli.tables import safe

    try:
        from tracekit.ingest import _kscan
    except ImportError:  # not built: the msgspec path reads traces, and an abort stays one
        return
    why = "a library aborted with SIGABRT, as Rust does when an allocation fails"
    line = f"tracekit: {safe(_out_of_memory(argv, why))}\n"
    _kscan.abort_line(line.encode("utf-8", "backslashreplace"))


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: one-line errors, exit status 2 on bad input."""
    args = sys.argv[1:] if argv is None else argv
    if argv is None:  # the program itself, not a caller embedding it
        _line_on_abort(args)
    try:
        cli.main(args=argv, prog_name="tracekit", standalone_mode=False)
    except TracekitError as exc:
        _problem(str(exc))
        sys.exit(2)
    except click.exceptions.Abort:
        _problem("interrupted")
        sys.exit(130)
    except click.ClickException as exc:
        _problem(click_problem(exc))
        sys.exit(2)
    except KeyboardInterrupt:
        _problem("interrupted")
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except MemoryError:
        _problem(_out_of_memory(args, "MemoryError"))
        sys.exit(2)
    except BaseException as exc:
        why = _memory_failure(exc)
        if why is not None:
            _problem(_out_of_memory(args, why))
            sys.exit(2)
        # polars panics as pyo3_runtime.PanicException, a BaseException (so that no `except
        # Exception` swallows it) of a module that cannot be imported: known by its name
        if type(exc).__name__ != "PanicException":
            raise
        first = " ".join(str(exc).split("\n", 1)[0].split())[:200]
        if any(w in first.lower() for w in ("alloc", "memory", "capacity overflow", "spawn")):
            _problem(_out_of_memory(args, f"polars: {first}"))
        else:
            _problem(_at_inputs(args, f"polars failed ({first})"))
        sys.exit(2)
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
