"""Every ``tracekit <command> [--option]`` the README and docs/ name exists in the click CLI
(issue #25 item 8), and the command line's first-hour edges: ``python -m tracekit``, ``run
--help`` listing the strategies and defaults, ``demo --only`` refusing an unknown name."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from conftest import ROOT

from tracekit.cli import cli
from tracekit.strategies import registry

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"```(?:bash|sh|console|shell)?\n(.*?)```", re.S)
_INLINE = re.compile(r"`([^`\n]+)`")
#: a command line starting with tracekit: at the start of a line, or after `$ `, `&&`, `;`, `|`
_INVOCATION = re.compile(r"(?:^|\$ |&& |; |\| )\s*tracekit ([a-z][a-z-]*)((?: [^;&|#]*)?)")


def named_commands() -> list[tuple[str, str, list[str]]]:
    """(file, command, options) of every `tracekit ...` in code: fenced blocks and inline spans."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        code = [line for block in _FENCE.findall(text) for line in block.splitlines()]
        code += _INLINE.findall(_FENCE.sub("", text))
        for line in code:
            for m in _INVOCATION.finditer(line):
                found.append(
                    (doc.name, m.group(1), re.findall(r"(?<![\w-])--[a-z][a-z-]*", m.group(2)))
                )
    return found


def test_the_docs_name_tracekit_commands():
    assert len(named_commands()) > 20  # the scan finds them (a scan that found none would pass)


@pytest.mark.parametrize("doc,command,opts", named_commands())
def test_every_command_and_option_the_docs_name_exists(doc: str, command: str, opts: list[str]):
    ctx = click.Context(cli)
    cmd = cli.get_command(ctx, command)
    assert cmd is not None, f"{doc} names `tracekit {command}`: no such command"
    known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
    for opt in opts:
        assert opt in known, f"{doc} names `tracekit {command} {opt}`: no such option"


def _tracekit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tracekit", *args], capture_output=True, text=True, cwd=ROOT
    )


def test_python_m_tracekit_is_the_cli():
    done = _tracekit("--help")
    assert done.returncode == 0, done.stderr
    assert "analyze" in done.stdout and "demo" in done.stdout


def test_run_help_lists_the_strategies_and_defaults():
    out = _tracekit("run", "--help").stdout
    flat = " ".join(out.split())
    for name in registry.STRATEGIES:
        assert name in flat, name
    for default in ("(default 2)", "(default 3)", "(default fp32)", "(default cpu)"):
        assert default in flat, default


@pytest.mark.parametrize("only", ["dp,nope", "nope", ","])
def test_demo_only_refuses_an_unknown_strategy_in_one_line(only: str, tmp_path: Path):
    done = _tracekit("demo", "--only", only, "--out", str(tmp_path / "runs"))
    lines = [l for l in done.stderr.splitlines() if l.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("tracekit: --only: ") and "Traceback" not in done.stderr
    assert "dp, zero1" in lines[0]  # the strategies it knows
    assert not (tmp_path / "runs").exists()  # nothing started, nothing written
