"""What a report writer is told to say while it works: ``progress("rendering figures")``."""

from __future__ import annotations

from collections.abc import Callable

#: one line for the user (stderr), e.g. "analysing runs/dp (1/2)"; None: say nothing
Progress = Callable[[str], None]
