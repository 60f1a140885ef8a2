"""``python -m tracekit.summary --markdown [--check] [DOC]``: (re)write docs/metrics.md's tables."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tracekit.summary.markdown import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tracekit.summary", description=__doc__)
    parser.add_argument("--markdown", action="store_true", required=True, help="write the tables")
    parser.add_argument("--check", action="store_true", help="only say whether DOC is current")
    parser.add_argument("doc", nargs="?", type=Path, default=DOC, help=f"default {DOC}")
    args = parser.parse_args(argv)
    text = args.doc.read_text()
    new = render(text)
    if args.check:
        if new != text:
            print(
                f"{args.doc} is out of date: python -m tracekit.summary --markdown", file=sys.stderr
            )
            return 1
        return 0
    if new != text:
        args.doc.write_text(new)
        print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
