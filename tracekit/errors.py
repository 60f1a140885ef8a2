"""The one error type users see: a one-line message naming the file and the problem.

The CLI turns it into `tracekit: <message>` on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

from pathlib import Path


class TracekitError(Exception):
    """Bad input or nothing analysable. ``str(err)`` is the one line shown to the user."""

    def __init__(self, message: str, path: str | Path | None = None) -> None:
        self.path = None if path is None else str(path)
        text = " ".join(str(message).split())  # always one line
        self.problem = text
        super().__init__(f"{self.path}: {text}" if self.path else text)
