"""The data formats of a report: json (every run's summary), csv / parquet (the per-rank
tables of all runs with a ``run`` column) and perfetto (tracekit.report.perfetto's merged trace)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from tracekit.report import perfetto
from tracekit.report.progress import Progress
from tracekit.summary import to_builtins

REPORT_SCHEMA_VERSION = 1

#: a text cell starting with one of = + - @ TAB CR is a formula to a spreadsheet (OWASP "CSV
#: injection")
_FORMULA_START = r"^[=+\-@\t\r]"


def write_json(
    analyses: Sequence[Any], names: Sequence[str], tmp: Path, progress: Progress | None
) -> None:
    """``{"schema_version", "runs": [{"name", "path", "summary"}]}``; each summary as its
    summary.json says it (tracekit.summary)."""
    doc = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "runs": [
            {"name": n, "path": str(a.path), "summary": to_builtins(a.summary)}
            for n, a in zip(names, analyses)
        ],
    }
    tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")


def rank_frame(analyses: Sequence[Any], names: Sequence[str]) -> pl.DataFrame:
    """The per-rank tables of all runs, each row with its run's name and path."""
    parts = [
        a.ranks.select(pl.lit(n).alias("run"), pl.lit(str(a.path)).alias("path"), pl.all())
        for n, a in zip(names, analyses)
    ]
    return pl.concat(parts, how="diagonal_relaxed")


def neutralise_formulas(frame: pl.DataFrame) -> pl.DataFrame:
    """Text cells that a spreadsheet would run as a formula get a leading single quote (OWASP);
    numbers stay numbers."""
    return frame.with_columns(
        pl.when(pl.col(c).str.contains(_FORMULA_START))
        .then(pl.lit("'") + pl.col(c))
        .otherwise(pl.col(c))
        .alias(c)
        for c, t in frame.schema.items()
        if t == pl.Utf8
    )


def write_csv(
    analyses: Sequence[Any], names: Sequence[str], tmp: Path, progress: Progress | None
) -> None:
    neutralise_formulas(rank_frame(analyses, names)).write_csv(tmp)


def write_parquet(
    analyses: Sequence[Any], names: Sequence[str], tmp: Path, progress: Progress | None
) -> None:
    rank_frame(analyses, names).write_parquet(tmp)


def write_perfetto(
    analyses: Sequence[Any], names: Sequence[str], tmp: Path, progress: Progress | None
) -> None:
    perfetto.write_perfetto(analyses, tmp, labels=names)
