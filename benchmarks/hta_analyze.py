"""What the benchmark times for HolisticTraceAnalysis: load + temporal breakdown + overlap.

Run with the benchmark's own venv (benchmarks/setup_hta_venv.sh): ``.venv/bin/python
hta_analyze.py TRACE_DIR``. Prints one JSON line: per-rank idle/compute/non-compute percent
and comm/compute overlap percent, so the runner can check both tools saw the same job.
"""

import json
import logging
import sys

logging.disable(logging.WARNING)  # HTA logs every parse step on stderr

from hta.trace_analysis import TraceAnalysis  # noqa: E402


def main(trace_dir: str) -> None:
    analyzer = TraceAnalysis(trace_dir=trace_dir)
    breakdown = analyzer.get_temporal_breakdown(visualize=False)
    overlap = analyzer.get_comm_comp_overlap(visualize=False)
    out = {
        "ranks": sorted(int(r) for r in breakdown["rank"]),
        "idle_pctg": [float(x) for x in breakdown.sort_values("rank")["idle_time_pctg"]],
        "overlap_pctg": [float(x) for x in overlap.sort_values("rank")["comp_comm_overlap_pctg"]],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
