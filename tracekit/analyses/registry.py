"""The sections of summary.json: key -> the pure function that computes it, one line each.

Every section gets the same SectionInput (tracekit.analyses.section) and returns its value, its
frames (written as analysis/<frame>.parquet) and its warnings; none sees another's result. They
run in this order, which is the order of their warnings in summary.json. Adding an analysis:
its module, and its line here.
"""

from __future__ import annotations

from tracekit.analyses import (
    breakdown,
    collectives,
    memory,
    overlap,
    pipeline,
    traffic_section,
    volume,
)
from tracekit.analyses.section import Section

SECTIONS: dict[str, Section] = {
    "ranks": breakdown.ranks_section,
    "collectives": collectives.collectives_section,
    "pipeline": pipeline.pipeline,
    "traffic": traffic_section.traffic,
    "nccl": traffic_section.nccl,
    "matching": traffic_section.matching_section,
    "memory": memory.memory,
    "overlap": overlap.overlap,
    "volume": volume.volume,
}
