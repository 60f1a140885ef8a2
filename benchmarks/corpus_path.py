"""The public trace corpus for the benchmarks: the folder TRACEKIT_CORPUS names, as for the tests
(tests/builders/corpus_root.py; get it with `python scripts/fetch_corpus.py DEST`, docs/corpus.md)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def corpus(*parts: str) -> Path:
    """CORPUS/parts; exits with one line when the corpus is not there."""
    root = os.environ.get("TRACEKIT_CORPUS")
    path = Path(root or ".", *parts)
    if not root or not path.exists():
        sys.exit(
            f"benchmarks: {path if root else 'TRACEKIT_CORPUS'}: "
            f"{'not found' if root else 'not set'}; get the corpus with "
            "python scripts/fetch_corpus.py DEST, then TRACEKIT_CORPUS=DEST"
        )
    return path
