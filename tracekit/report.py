"""Reports of one run or a comparison of several: html, pdf, png, md, json, csv, parquet, perfetto.

``write_report(paths, out, fmt)`` analyses every PATH (a run folder, a folder of traces, one
trace) and writes one file. Several paths make a comparison report. Every format is written to
a temporary name beside OUT and renamed, so nothing half-written is ever left.

- ``html``: self-contained and offline: plotly.js embedded once (the first figure carries it,
  the others reference it), tables as escaped HTML. Trace strings are never concatenated into
  markup unescaped: cells go through ``html.escape``, figure data through plotly's JSON (which
  writes ``<`` as ``\\u003c``).
- ``pdf`` / ``png``: every figure rendered to SVG by kaleido (one Chromium for all of them),
  placed as ``data:`` images on a static page (tables included for the PDF), which headless
  Chromium prints (``--print-to-pdf``) or photographs (``--screenshot``, the page's exact
  height). No JavaScript runs while printing, so nothing depends on timing.
- ``md``: Markdown tables; ``json``: ``{"schema_version", "runs": [{"name", "path", "summary"}]}``;
  ``csv`` / ``parquet``: the per-rank tables of all runs with a ``run`` column;
  ``perfetto``: tracekit.perfetto's merged Chrome trace.
"""

from __future__ import annotations

import base64
import html
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from tracekit import figures as F
from tracekit import outputs
from tracekit.analyses.group_names import row_label
from tracekit.errors import TracekitError
from tracekit.runname import display_names

FORMATS = {
    "html": "html",
    "pdf": "pdf",
    "png": "png",
    "md": "md",
    "json": "json",
    "csv": "csv",
    "parquet": "parquet",
    "perfetto": "perfetto.json",
}
REPORT_SCHEMA_VERSION = 1
IMAGE_WIDTH = 1100
TOP_EVENTS = 15
MAX_TABLE_ROWS = 200

Table = tuple[str, list[str], list[list[str]]]  # title, header, rows of text cells
Progress = Callable[[str], None]


def default_output(fmt: str) -> Path:
    """``report.<ext>`` in the current folder."""
    return Path(f"report.{FORMATS[fmt]}")


# ---------------------------------------------------------------- tables (text cells, unescaped)


def _f(x: Any, digits: int = 6) -> str:
    if x is None:
        return F.UNKNOWN
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _short(text: str, n: int = 160) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _pct(part: Any, whole: Any) -> str:
    try:
        return f"{100 * float(part) / float(whole):.0f}%" if whole else F.UNKNOWN
    except (TypeError, ValueError):
        return F.UNKNOWN


def rank_table(summary: dict) -> Table:
    head = [
        "rank",
        "node",
        "span s",
        "step s",
        "compute s",
        "comm s",
        "overlap s",
        "exposed comm s",
        "other s",
        "idle s",
        "idle %",
    ]
    rows = [
        [
            _f(r.get("rank")),
            _f(r.get("node")),
            _f(r.get("span_s")),
            _f(r.get("step_time_s")),
            _f(r.get("compute_s")),
            _f(r.get("comm_s")),
            _f(r.get("overlap_s")),
            _f(r.get("exposed_comm_s")),
            _f(r.get("other_s")),
            _f(r.get("idle_s")),
            _pct(r.get("idle_s"), r.get("span_s")),
        ]
        for r in summary.get("ranks") or []
    ]
    return "per-rank breakdown", head, rows


def top_events(events: pl.DataFrame | None, n: int = TOP_EVENTS) -> Table:
    """The events with the most total time (names exactly as in the trace)."""
    head = ["name", "kind", "device", "count", "total s", "mean µs"]
    if events is None or events.height == 0:
        return "top events by total time", head, []
    t = (
        events.filter(pl.col("kind").is_in(["compute", "communication", "memory", "sync"]))
        .group_by("name", "kind", "device")
        .agg(
            pl.len().alias("count"),
            ((pl.col("end_ns") - pl.col("start_ns")).sum() * 1e-9).alias("total_s"),
        )
        .sort("total_s", "name", descending=[True, False])
        .head(n)
    )
    rows = [
        [
            _short(str(r["name"])),
            str(r["kind"]),
            str(r["device"]),
            str(r["count"]),
            f"{r['total_s']:.6f}",
            f"{1e6 * r['total_s'] / max(1, r['count']):.1f}",
        ]
        for r in t.iter_rows(named=True)
    ]
    return "top events by total time", head, rows


def collectives_table(summary: dict) -> Table:
    co = summary.get("collectives") or {}
    # payload: S summed over every rank's rows (rank_bytes) and over calls (call_bytes)
    head = [
        "op",
        "rank rows",
        "payload Σ ranks",
        "payload Σ calls",
        "transfer s",
        "wait s",
        "time s",
        "algbw GB/s",
        "busbw GB/s",
    ]
    rows = [
        [
            str(r.get("op") or "unknown"),
            _f(r.get("count")),
            F.fmt_bytes(r.get("bytes")),
            F.fmt_bytes(r.get("call_bytes")) if "call_bytes" in r else F.UNKNOWN,
            _f(r.get("transfer_s")),
            _f(r.get("wait_s")),
            _f(r.get("time_s")),
            _f(r.get("algbw_gbps"), 3),
            _f(r.get("busbw_gbps"), 3),
        ]
        for r in co.get("per_op") or []
    ]
    rows += [
        [
            f"{row_label(r)} · {r.get('op')}",
            _f(r.get("rank_rows")),
            F.fmt_bytes(r.get("rank_bytes")),
            F.fmt_bytes(r.get("bytes")),  # per_group bytes count per call
            _f(r.get("transfer_s")),
            _f(r.get("wait_s")),
            _f(r.get("time_s")),
            _f(r.get("algbw_gbps"), 3),
            _f(r.get("busbw_gbps"), 3),
        ]
        for r in (co.get("per_group") or [])[:MAX_TABLE_ROWS]
    ]
    return (
        (
            f"collectives: {co.get('count', 0)} calls, ideal bytes per rank "
            f"{F.fmt_bytes(co.get('ideal_bytes_per_rank'))}"
        ),
        head,
        rows,
    )


def pipeline_table(summary: dict) -> Table | None:
    p = summary.get("pipeline")
    if not p:
        return None
    head = [
        "stage",
        "fill s",
        "steady s",
        "drain s",
        "max in-flight",
        "activation peak",
        "weight versions",
    ]
    rows = [
        [
            _f(r.get("stage")),
            _f(r.get("fill_s")),
            _f(r.get("steady_s")),
            _f(r.get("drain_s")),
            _f(r.get("max_inflight_microbatches")),
            F.fmt_bytes(r.get("activation_peak_bytes")),
            _f(r.get("weight_versions")),
        ]
        for r in p.get("per_stage") or []
    ]
    return F.pipeline_theory_text(p), head, rows


def overlap_table(summary: dict) -> Table | None:
    ov = summary.get("overlap")
    if not ov:
        return None
    head = ["unit", "phase", "op", "duration s", "hidden s", "exposed s"]
    rows = [
        [
            str(r.get("unit")),
            str(r.get("phase")),
            str(r.get("op")),
            _f(r.get("duration_s")),
            _f(r.get("hidden_s")),
            _f(r.get("exposed_s")),
        ]
        for r in (ov.get("per_layer") or [])[:MAX_TABLE_ROWS]
    ]
    title = (
        f"all-gather {_f(ov.get('allgather_s'))} s, {F.fmt_frac(ov.get('allgather_hidden_fraction'))} hidden; "
        f"reduce-scatter {_f(ov.get('reducescatter_s'))} s, "
        f"{F.fmt_frac(ov.get('reducescatter_hidden_fraction'))} hidden"
    )
    return title, head, rows


def memory_table(summary: dict) -> Table | None:
    mem = summary.get("memory")
    if not mem or not mem.get("per_rank"):
        return None
    head = ["rank", "params", "grads", "optimizer", "model states", "activation peak", "peak"]
    rows = [
        [_f(r.get("rank"))]
        + [
            F.fmt_bytes(r.get(k))
            for k in (
                "params_bytes",
                "grads_bytes",
                "optimizer_bytes",
                "model_states_bytes",
                "activation_peak_bytes",
                "peak_bytes",
            )
        ]
        for r in mem["per_rank"]
    ]
    theory = mem.get("theory")
    title = "memory per rank" + (
        f"; theory {theory.get('formula')} = {F.fmt_bytes(theory.get('model_states_bytes'))}"
        if theory
        else ""
    )
    return title, head, rows


def traffic_table(summary: dict) -> Table | None:
    tr = summary.get("traffic")
    if not tr:
        return None
    # wire bytes: on every link, summed over links and calls of the window (docs/traffic.md)
    head = ["op", "intra-node wire", "inter-node wire", "wire bytes", "payload Σ calls"]
    rows = [
        [
            str(r.get("op")),
            F.fmt_bytes(r.get("intra")),
            F.fmt_bytes(r.get("inter")),
            F.fmt_bytes(r.get("bytes")),
            F.fmt_bytes(r.get("payload_bytes")),
        ]
        for r in tr.get("by_op") or []
    ]
    rows += [
        [
            f"{row_label(r)} · {r.get('op')}",
            F.fmt_bytes(r.get("intra")),
            F.fmt_bytes(r.get("inter")),
            F.fmt_bytes(r.get("bytes")),
            F.fmt_bytes(r.get("payload_bytes")),
        ]
        for r in (tr.get("by_group") or [])[:MAX_TABLE_ROWS]
    ]
    return (
        (
            f"traffic: {F.fmt_frac(tr.get('inter_node_fraction'))} of "
            f"{F.fmt_bytes(tr.get('total_bytes'))} wire bytes (all links, whole window) "
            "on inter-node links"
        ),
        head,
        rows,
    )


def compare_table(runs: Sequence[tuple[str, dict]]) -> Table:
    head = [
        "run",
        "strategy",
        "ranks",
        "step s",
        "compute %",
        "exposed comm %",
        "idle %",
        "model states",
        "payload bytes (Σ ranks)",
        "wire bytes (all links)",
        "inter-node wire bytes",
        "bubble",
        "all-gather hidden",
    ]
    rows = []
    for r in F.compare_rows(runs):
        rows.append(
            [
                r["run"],
                str(r["strategy"] or "-"),
                str(r["ranks"]),
                _f(r["step_time_s"]),
                _pct(r["compute_total_s"], r["span_s"]),
                _pct(r["exposed_comm_s"], r["span_s"]),
                _pct(r["idle_s"], r["span_s"]),
                F.fmt_bytes(r["model_states_bytes"]),
                F.fmt_bytes(r["collective_bytes"]),
                F.fmt_bytes(r["wire_bytes"]),
                F.fmt_bytes(r["inter_node_bytes"]),
                F.fmt_frac(r["bubble_fraction"]),
                F.fmt_frac(r["allgather_hidden_fraction"]),
            ]
        )
    return "comparison", head, rows


# sections of one run: (title, figure names, table builder, the no-data key)
SECTIONS: list[tuple[str, list[str], Callable[[dict], Table | None] | None, str | None]] = [
    ("time per rank", ["breakdown"], None, None),
    ("timeline", ["timeline"], None, "timeline"),
    ("pipeline", ["pipeline", "pipeline_stages"], pipeline_table, "pipeline"),
    ("overlap of all-gather / reduce-scatter with compute", ["overlap"], overlap_table, "overlap"),
    ("memory", ["memory"], memory_table, "memory"),
    ("traffic", ["traffic_split", "traffic_matrix"], traffic_table, "traffic_split"),
    (
        "collectives",
        ["collective_bandwidth", "collective_time"],
        collectives_table,
        "collective_bandwidth",
    ),
    (
        "what if the network were slower (tracekit predict)",
        ["predict_curve"],
        None,
        None,
    ),
]


# ---------------------------------------------------------------- loading


def _load(paths: Sequence[Path], progress: Progress | None) -> list[Any]:
    from tracekit.analyze import analyze

    out = []
    for i, p in enumerate(paths, 1):
        if progress:
            progress(f"analysing {p} ({i}/{len(paths)})")
        out.append(analyze(p))
    return out


def _cannot_write(out: Path, why: str | None) -> TracekitError:
    return TracekitError(f"cannot write the report here ({why}); choose another place with -o", out)


def _atomic_target(out: Path, suffix: str = "") -> Path:
    """A new empty temporary file beside OUT (tracekit.outputs: our pid in its name); OUT must be
    a regular file or nothing (a FIFO, symlink, device or folder is refused)."""
    out = Path(out)
    outputs.check_file_target(out, "-o")
    parent = out.parent
    tmp = outputs.temp_name(out, suffix=suffix)
    try:
        parent.mkdir(parents=True, exist_ok=True)
        outputs.sweep(parent)  # temp files of reports killed before they finished
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as exc:
        raise _cannot_write(out, exc.strerror) from None
    return tmp


def _commit(tmp: Path, out: Path) -> None:
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # private while written; a report is an ordinary file
    outputs.check_file_target(out, "-o")  # again: it may have appeared while we wrote
    os.replace(tmp, out)


def write_report(
    paths: Sequence[str | Path],
    out: str | Path,
    fmt: str = "html",
    *,
    analyses: Sequence[Any] | None = None,
    names: Sequence[str] | None = None,
    progress: Progress | None = None,
) -> Path:
    """Analyse PATHS (or take ANALYSES already made) and write the report in FMT to OUT."""
    if fmt not in FORMATS:
        raise TracekitError(f"unknown report format {fmt!r}; choose one of {', '.join(FORMATS)}")
    paths = [Path(p) for p in paths]
    if analyses is None:
        if not paths:
            raise TracekitError("nothing to report: give at least one run folder or trace")
        analyses = _load(paths, progress)
    else:
        analyses = list(analyses)
        paths = paths or [Path(a.path) for a in analyses]
    names = list(names) if names else display_names(paths)
    out = Path(out)
    tmp = _atomic_target(out)
    try:
        if progress:
            progress(f"writing {fmt} report")
        WRITERS[fmt](analyses, names, tmp, progress)
        _commit(tmp, out)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if outputs.is_write_failure(exc):
            raise _cannot_write(out, outputs.reason(exc)) from None
        raise
    return out


# ---------------------------------------------------------------- data formats


def _json(
    analyses: Sequence[Any], names: Sequence[str], tmp: Path, progress: Progress | None
) -> None:
    doc = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "runs": [
            {"name": n, "path": str(a.path), "summary": a.summary} for n, a in zip(names, analyses)
        ],
    }
    tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")


def rank_frame(analyses: Sequence[Any], names: Sequence[str]) -> pl.DataFrame:
    parts = [
        a.ranks.select(pl.lit(n).alias("run"), pl.lit(str(a.path)).alias("path"), pl.all())
        for n, a in zip(names, analyses)
    ]
    return pl.concat(parts, how="diagonal_relaxed")


#: a text cell starting with one of = + - @ TAB CR is a formula to a spreadsheet (OWASP "CSV
#: injection")
_FORMULA_START = r"^[=+\-@\t\r]"


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


def _csv(analyses, names, tmp, progress) -> None:
    neutralise_formulas(rank_frame(analyses, names)).write_csv(tmp)


def _parquet(analyses, names, tmp, progress) -> None:
    rank_frame(analyses, names).write_parquet(tmp)


def _perfetto(analyses, names, tmp, progress) -> None:
    from tracekit.perfetto import write_perfetto

    write_perfetto(analyses, tmp, labels=names)


# ---------------------------------------------------------------- markdown


def _md_cell(text: Any) -> str:
    return html.escape(" ".join(str(text).split()), quote=False).replace("|", "\\|")


def _md_table(t: Table) -> list[str]:
    title, head, rows = t
    lines = [f"**{_md_cell(title)}**", ""]
    if not rows:
        return lines + ["_no rows_", ""]
    lines.append("| " + " | ".join(_md_cell(h) for h in head) + " |")
    lines.append("|" + "|".join("---" for _ in head) + "|")
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return lines + [""]


def _md(analyses, names, tmp, progress) -> None:
    lines = ["# tracekit report", ""]
    summaries = [(n, a.summary) for n, a in zip(names, analyses)]
    if len(analyses) > 1:
        lines += ["## comparison", ""] + _md_table(compare_table(summaries))
    for name, a in zip(names, analyses):
        s = a.summary
        lines += [f"## {_md_cell(name)}", "", f"source: {_md_cell(a.path)}", ""]
        for w in s.get("warnings") or []:
            lines.append(f"- warning: {_md_cell(w)}")
        lines.append("")
        lines += _md_table(rank_table(s))
        for title, _figs, table_fn, nodata in SECTIONS[2:]:
            if table_fn is None and nodata is None:
                continue  # figures only (the prediction): nothing for a table format
            lines += [f"### {_md_cell(title)}", ""]
            t = table_fn(s) if table_fn else None
            lines += _md_table(t) if t else [f"_{F.NO_DATA[nodata]}_", ""]
        lines += _md_table(top_events(a.events))
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")


# ---------------------------------------------------------------- html

_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 24px auto; max-width: 1200px;
       color: #222; padding: 0 16px; }
h1 { font-size: 24px; } h2 { font-size: 20px; border-bottom: 1px solid #ddd; padding-top: 12px; }
h3 { font-size: 16px; margin-top: 22px; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
.caption { font-weight: 600; margin-top: 8px; } .nodata { color: #777; font-style: italic; }
.warn { color: #8a5a00; } .src { color: #555; font-size: 13px; } .fig { margin: 8px 0; }
.fig img { display: block; width: 100%; height: auto; }
@media print { .fig, table { page-break-inside: avoid; } body { max-width: none; margin: 0; } }
"""


def _html_table(t: Table) -> str:
    title, head, rows = t
    out = [f'<div class="caption">{html.escape(title)}</div>']
    if not rows:
        return out[0] + '<p class="nodata">no rows</p>'
    out.append(
        "<table><thead><tr>"
        + "".join(f"<th>{html.escape(h)}</th>" for h in head)
        + "</tr></thead><tbody>"
    )
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


class _FigureSink:
    """Turns figures into HTML: interactive (plotly.js embedded once) or static images."""

    def __init__(self, images: dict[int, bytes] | None = None) -> None:
        self.images = images
        self.first = True

    def __call__(self, fig: Any) -> str:
        if self.images is not None:
            svg = self.images[id(fig)]
            return (
                '<div class="fig"><img alt="figure" src="data:image/svg+xml;base64,'
                + base64.b64encode(svg).decode("ascii")
                + '"></div>'
            )
        import plotly.io as pio

        height = fig.layout.height or 420
        div = pio.to_html(
            fig,
            full_html=False,
            include_plotlyjs=self.first,
            default_height=f"{height}px",
            config={"displaylogo": False, "responsive": True},
        )
        self.first = False
        return f'<div class="fig">{div}</div>'


def _report_figures(analyses: Sequence[Any], names: Sequence[str]) -> tuple[dict, list[dict]]:
    summaries = [(n, a.summary) for n, a in zip(names, analyses)]
    compare = F.compare_figures(summaries) if len(analyses) > 1 else {}
    per_run = [F.figures_for(a) for a in analyses]
    from tracekit.figures_predict import curve_for  # tracekit predict's sweep, when it has one

    for figs, a in zip(per_run, analyses):
        figs["predict_curve"] = curve_for(a)
    return compare, per_run


def _html_doc(
    analyses,
    names,
    figure_html: Callable[[Any], str],
    compare: dict,
    per_run: list[dict],
    *,
    tables: bool = True,
) -> str:
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>tracekit report: {html.escape(', '.join(names))}</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>tracekit report</h1>",
    ]
    summaries = [(n, a.summary) for n, a in zip(names, analyses)]
    if len(analyses) > 1:
        parts.append("<h2>comparison</h2>")
        if tables:
            parts.append(_html_table(compare_table(summaries)))
        for fig in compare.values():
            if fig is not None:
                parts.append(figure_html(fig))
    for name, a, figs in zip(names, analyses, per_run):
        s = a.summary
        run = s.get("run") or {}
        parts.append(f"<h2>{html.escape(name)}</h2>")
        desc = f"source: {a.path}"
        if run:
            desc += (
                f" · strategy {run.get('strategy')} · {run.get('world_size')} ranks · {run.get('backend')}"
                f" · {run.get('device')} · {run.get('precision')}"
            )
        win = s.get("window") or {}
        desc += f" · window: {win.get('kind')}, {win.get('steps')} steps"
        parts.append(f'<p class="src">{html.escape(desc)}</p>')
        if tables:
            for w in s.get("warnings") or []:
                parts.append(f'<p class="warn">warning: {html.escape(str(w))}</p>')
            parts.append(_html_table(rank_table(s)))
        for title, fig_names, table_fn, nodata in SECTIONS:
            present = [figs.get(k) for k in fig_names if figs.get(k) is not None]
            if not present and nodata is None and table_fn is None:
                continue  # an optional section (the prediction) this run has nothing for
            parts.append(f"<h3>{html.escape(title)}</h3>")
            if not present and nodata:
                parts.append(f'<p class="nodata">{html.escape(F.NO_DATA[nodata])}</p>')
                continue
            for fig in present:
                parts.append(figure_html(fig))
            t = table_fn(s) if (table_fn and tables) else None
            if t:
                parts.append(_html_table(t))
        if tables:
            parts.append("<h3>events</h3>")
            parts.append(_html_table(top_events(a.events)))
    parts.append("<p class='src'>written by tracekit</p></body></html>")
    return "\n".join(parts)


def _html(analyses, names, tmp, progress) -> None:
    compare, per_run = _report_figures(analyses, names)
    doc = _html_doc(analyses, names, _FigureSink(), compare, per_run)
    tmp.write_text(doc, encoding="utf-8")


# ---------------------------------------------------------------- pdf / png


def chromium_path() -> str:
    """Headless Chromium: $TRACEKIT_CHROMIUM when set, else chromium / google-chrome on PATH."""
    env = os.environ.get("TRACEKIT_CHROMIUM")
    if env:
        if Path(env).is_file() and os.access(env, os.X_OK):
            return env
        raise TracekitError("TRACEKIT_CHROMIUM is not an executable file", env)
    candidates = [os.environ.get("BROWSER_PATH")]
    candidates += [
        shutil.which(n)
        for n in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
    ]
    candidates += ["/usr/bin/chromium"]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    raise TracekitError(
        "pdf and png reports need Chromium (apt-get install chromium, or set TRACEKIT_CHROMIUM)"
    )


def _render_svgs(figs: Iterable[Any], progress: Progress | None) -> dict[int, bytes]:
    import plotly.io as pio

    figs = [f for f in figs if f is not None]
    if not figs:
        return {}
    with tempfile.TemporaryDirectory(prefix="tracekit-img-") as d:
        files = [Path(d) / f"fig{i}.svg" for i in range(len(figs))]
        if progress:
            progress(f"rendering {len(figs)} figures with kaleido")
        try:
            pio.write_images(
                figs,
                files,
                format="svg",
                width=IMAGE_WIDTH,
                height=[int(f.layout.height or 420) for f in figs],
            )
        except Exception as exc:  # kaleido or its Chromium failed: one line, no traceback
            raise TracekitError(
                f"could not render the figures with kaleido ({type(exc).__name__}: {exc})"
            ) from None
        return {id(f): p.read_bytes() for f, p in zip(figs, files)}


def _chromium(args: list[str], page: Path, target: Path) -> None:
    exe = chromium_path()
    with tempfile.TemporaryDirectory(prefix="tracekit-chromium-") as profile:
        cmd = [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--mute-audio",
            f"--user-data-dir={profile}",
            *args,
            page.as_uri(),
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise TracekitError(f"headless Chromium failed ({type(exc).__name__})", exe) from None
    if not target.is_file() or target.stat().st_size == 0:
        tail = (proc.stderr or "").strip().splitlines()[-1:] or ["no output"]
        raise TracekitError(f"headless Chromium wrote nothing ({tail[0][:200]})", exe)


def _pdf(analyses, names, tmp, progress) -> None:
    chromium_path()  # fail before the slow part
    compare, per_run = _report_figures(analyses, names)
    images = _render_svgs(
        list(compare.values()) + [f for figs in per_run for f in figs.values()], progress
    )
    doc = _html_doc(analyses, names, _FigureSink(images), compare, per_run)
    with tempfile.TemporaryDirectory(prefix="tracekit-pdf-") as d:
        page = Path(d) / "report.html"
        page.write_text(doc, encoding="utf-8")
        target = Path(d) / "report.pdf"
        if progress:
            progress("printing the PDF with headless Chromium")
        _chromium(["--no-pdf-header-footer", f"--print-to-pdf={target}"], page, target)
        shutil.move(str(target), tmp)


def _png(analyses, names, tmp, progress) -> None:
    chromium_path()
    compare, per_run = _report_figures(analyses, names)
    figs: list[tuple[str, Any]] = [("comparison", f) for f in compare.values() if f is not None]
    for name, run_figs in zip(names, per_run):
        keep = (
            run_figs.items()
            if len(analyses) == 1
            else [(k, v) for k, v in run_figs.items() if k in ("breakdown", "timeline")]
        )
        figs += [(name, f) for _, f in keep if f is not None]
    images = _render_svgs([f for _, f in figs], progress)
    header = 56
    blocks, height, last = [], header, None
    for name, fig in figs:
        h = int(fig.layout.height or 420)
        if name != last:
            blocks.append(
                f'<div style="height:36px;font:600 18px sans-serif;padding:8px 12px;'
                f'box-sizing:border-box">{html.escape(name)}</div>'
            )
            height += 36
            last = name
        blocks.append(
            f'<img style="display:block;width:{IMAGE_WIDTH}px;height:{h}px" alt="" '
            f'src="data:image/svg+xml;base64,{base64.b64encode(images[id(fig)]).decode("ascii")}">'
        )
        height += h
    doc = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><style>html,body{margin:0;background:#fff}</style>"
        f"</head><body><div style='height:{header}px;font:700 24px sans-serif;padding:14px 12px;box-sizing:"
        f"border-box'>tracekit report: {html.escape(', '.join(names))}</div>{''.join(blocks)}</body></html>"
    )
    with tempfile.TemporaryDirectory(prefix="tracekit-png-") as d:
        page = Path(d) / "report.html"
        page.write_text(doc, encoding="utf-8")
        target = Path(d) / "report.png"
        if progress:
            progress("drawing the PNG with headless Chromium")
        _chromium(
            [
                "--hide-scrollbars",
                f"--window-size={IMAGE_WIDTH},{height}",
                f"--screenshot={target}",
            ],
            page,
            target,
        )
        shutil.move(str(target), tmp)


WRITERS: dict[str, Callable[..., None]] = {
    "html": _html,
    "pdf": _pdf,
    "png": _png,
    "md": _md,
    "json": _json,
    "csv": _csv,
    "parquet": _parquet,
    "perfetto": _perfetto,
}
