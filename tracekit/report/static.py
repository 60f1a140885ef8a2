"""The PDF and PNG reports: the figures as static images, printed by headless Chromium.

Every figure is rendered to SVG by kaleido (one Chromium for all of them) and placed as a
``data:`` image on a static page (tables included for the PDF), which headless Chromium prints
(``--print-to-pdf``) or photographs (``--screenshot``, the page's exact height). No JavaScript
runs while printing, so nothing depends on timing.
"""

from __future__ import annotations

import html
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tracekit.errors import TracekitError
from tracekit.figures.timeline import ZOOM_HINT
from tracekit.report.page import FigureSink, html_doc, report_figures, svg_uri
from tracekit.report.progress import Progress

IMAGE_WIDTH = 1100


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
    for f in figs:  # an image cannot zoom: no "zoom in for real spans" in the PDF / PNG
        title = f.layout.title.text
        if title and ZOOM_HINT in title:
            f.update_layout(title_text=title.replace(ZOOM_HINT, ""))
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


#: what headless Chromium makes of the page: its flag and the progress line
_OUTPUTS = {
    "pdf": ("--print-to-pdf", "printing the PDF with headless Chromium"),
    "png": ("--screenshot", "drawing the PNG with headless Chromium"),
}


def _chromium(doc: str, what: str, flags: list[str], tmp: Path, progress: Progress | None) -> None:
    """Headless Chromium makes ``what`` (pdf, png) of the page ``doc``; moved to TMP."""
    exe = chromium_path()
    output_flag, doing = _OUTPUTS[what]
    with tempfile.TemporaryDirectory(prefix=f"tracekit-{what}-") as d:
        page = Path(d) / "report.html"
        page.write_text(doc, encoding="utf-8")
        target = Path(d) / f"report.{what}"
        if progress:
            progress(doing)
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
                *flags,
                f"{output_flag}={target}",
                page.as_uri(),
            ]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise TracekitError(
                    f"headless Chromium failed ({type(exc).__name__})", exe
                ) from None
        if not target.is_file() or target.stat().st_size == 0:
            tail = (proc.stderr or "").strip().splitlines()[-1:] or ["no output"]
            raise TracekitError(f"headless Chromium wrote nothing ({tail[0][:200]})", exe)
        shutil.move(str(target), tmp)


def write_pdf(
    analyses: Sequence[Any], names: Sequence[str], tmp: Path, progress: Progress | None
) -> None:
    chromium_path()  # fail before the slow part
    compare, per_run = report_figures(analyses, names)
    images = _render_svgs(
        list(compare.values()) + [f for figs in per_run for f in figs.values()], progress
    )
    doc = html_doc(analyses, names, FigureSink(images), compare, per_run)
    _chromium(doc, "pdf", ["--no-pdf-header-footer"], tmp, progress)


def write_png(
    analyses: Sequence[Any], names: Sequence[str], tmp: Path, progress: Progress | None
) -> None:
    """The figures one under another (a comparison: its own and each run's breakdown and
    timeline), each run's under its name."""
    chromium_path()
    compare, per_run = report_figures(analyses, names)
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
            f'src="{svg_uri(images[id(fig)])}">'
        )
        height += h
    doc = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><style>html,body{margin:0;background:#fff}</style>"
        f"</head><body><div style='height:{header}px;font:700 24px sans-serif;padding:14px 12px;box-sizing:"
        f"border-box'>tracekit report: {html.escape(', '.join(names))}</div>{''.join(blocks)}</body></html>"
    )
    flags = ["--hide-scrollbars", f"--window-size={IMAGE_WIDTH},{height}"]
    _chromium(doc, "png", flags, tmp, progress)
