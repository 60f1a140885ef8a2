"""Every analysis record of tracekit.analyses.manifest is complete, and each of its parts exists:
the Summary field of its key and Struct, its computation, its frames (with the declared columns,
on real runs), its figures and table (in the layers that draw them), its place in reports and
pages. A forgotten part fails here, not as a silent "no data" somewhere."""

from __future__ import annotations

import types
import typing

import pytest
from conftest import HTA, SAMPLES

from tracekit import figures
from tracekit.analyses import manifest
from tracekit.analysis import analyze
from tracekit.report import tables
from tracekit.summary import Summary

#: Summary fields that are not a section's: the run, the window and how it was read
NOT_SECTIONS = {
    "schema_version",
    "source",
    "warnings",
    "window",
    "topology",
    "clock",
    "sampling",
    "run",
    "engine",
}
SHOWN = {s for s in manifest.REPORT} | {s for p in manifest.PAGES for s in p.sections}


def _ids(sections: typing.Iterable[manifest.Section]) -> list[str]:
    return [s.key or s.title for s in sections]


@pytest.mark.parametrize("section", manifest.SECTIONS, ids=_ids(manifest.SECTIONS))
def test_every_section_of_summary_json_is_complete(section: manifest.Section) -> None:
    """Its key is a Summary field typed as its Struct (null when it has nothing), it computes."""
    assert section.key and section.title and callable(section.compute), section
    hints = typing.get_type_hints(Summary)
    assert section.key in hints, f"Summary has no field {section.key!r}"
    hint = hints[section.key]
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    members = set(typing.get_args(hint)) if union else {hint}
    assert section.struct in members, f"Summary.{section.key} is {hint}"
    assert section.struct is not None


def test_every_summary_section_has_a_record() -> None:
    keys = [s.key for s in manifest.SECTIONS]
    assert len(keys) == len(set(keys))
    assert set(Summary.__struct_fields__) - NOT_SECTIONS == set(keys)


@pytest.mark.parametrize("section", sorted(SHOWN, key=lambda s: s.title), ids=lambda s: s.title)
def test_every_shown_part_resolves(section: manifest.Section) -> None:
    """Its figures are builders of tracekit.figures with a sentence for no data; its table is
    one of tracekit.report.tables; something shown is in the report."""
    assert section in manifest.REPORT, f"{section.title!r} is on a page but in no report"
    assert section.figures or section.table, f"{section.title!r} shows nothing"
    for f in section.figures:
        assert callable(figures.builder(f)), f.build
        assert f.no_data.startswith("this run has no"), f.no_data
        assert figures.FIGURES[f.name] is figures.builder(f)
    if section.table is not None:
        assert callable(tables.table_of(section)), section.table
    if section.no_data is not None:
        assert section.no_data.startswith("this run has no")


def test_figure_names_and_frame_names_are_unique() -> None:
    names = [f.name for s in manifest.REPORT for f in s.figures]
    assert len(names) == len(set(names))
    frames = [n for s in manifest.SECTIONS for n in s.frames]
    assert len(frames) == len(set(frames))


def test_every_section_with_figures_is_shown() -> None:
    for s in manifest.SECTIONS:
        if s.figures or s.table:
            assert s in SHOWN, f"{s.key}: figures or a table, but in no report"


@pytest.mark.parametrize(
    "path",
    [
        SAMPLES / "pp-1f1b",
        SAMPLES / "hsdp",
        pytest.param(HTA / "nccl_parser_config", marks=pytest.mark.corpus),
    ],
    ids=str,
)
def test_sections_return_their_struct_and_declared_frames(path) -> None:
    """On real runs: each section's value is its Struct (or null), each frame it returns is one
    it declares, with exactly the declared columns."""
    a = analyze(path)
    for s in manifest.SECTIONS:
        value = getattr(a.summary, s.key)
        origin = typing.get_origin(s.struct) or s.struct
        assert value is None or isinstance(value, origin), (s.key, type(value))
    declared = manifest.frame_schemas()
    for name, frame in a.frames.items():
        assert name in declared, f"frame {name!r} is declared by no section"
        assert dict(frame.schema) == dict(declared[name]), name
