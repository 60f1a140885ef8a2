"""The one error type users see: a one-line message naming the file and the problem.

The CLI turns it into `tracekit: <message>` on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import re
from pathlib import Path

#: C0 and C1 control characters, DEL: a terminal obeys them (ESC starts its escape sequences)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """TEXT with every control character written as ``\\x1b`` and the like: names and values
    from input files are shown on a terminal, never obeyed by it."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class TracekitError(Exception):
    """Bad input or nothing analysable. ``str(err)`` is the one line shown to the user."""

    def __init__(self, message: str, path: str | Path | None = None) -> None:
        self.path = None if path is None else str(path)
        text = printable(" ".join(str(message).split()))  # always one line, nothing obeyed
        self.problem = text
        shown = printable(self.path) if self.path else None
        super().__init__(f"{shown}: {text}" if shown else text)
