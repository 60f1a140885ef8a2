"""plotly.js for the app: which bundle, served how, started when.

First load: dcc.Graph fetches plotly.js (4.8 MB) only when the first graph mounts, after the
page callback has answered, and a fresh browser context then spends ~1.5 s of its main thread
compiling it function by function (~0.2 s once cached): most of a first visit on a 2-core
machine, whatever the run. So:

- **Which**: plotly.js's cartesian bundle (1.5 MB: bar, scatter, heatmap and a few more, every
  trace type tracekit.figures draws; a third of the full bundle), vendored in dashboards/vendor/
  (its README says from where), when its header names the plotly.js version the installed
  plotly bundles; else plotly's own full bundle, so plotly.js always matches the plotly that
  built the figures. Served at ``_tracekit/<name with the version>``, cached for good.
- **Compile hint**: the file starts with V8's ``//# allFunctionsCalledOnLoad`` (plotly.js runs
  nearly all of its modules on load): Chromium compiles it on a background thread as it arrives
  (of the full bundle's ~1.5 s, ~0.8 s stayed on the main thread; other browsers ignore it).
- **When**: the index preloads it, and the first callback request starts it (once the request
  is out), so it runs while the server builds the page. Until it has run, window.Plotly is a
  promise: dcc.Graph's loader, ``Promise.resolve(window.Plotly || load())``, waits for it
  instead of loading plotly.js again.
"""

from __future__ import annotations

import functools
import html
import json
from pathlib import Path

from dash import Dash
from flask import Response

VENDORED_PLOTLY = Path(__file__).with_name("vendor") / "plotly-cartesian.min.js"
COMPILE_HINT = "//# allFunctionsCalledOnLoad\n"
_RENDERER = """var renderer = new DashRenderer({request_pre: function () { setTimeout(tracekitPlotly, 0); }});
function tracekitPlotly() {
    if (window.Plotly) { return; }
    var script = document.createElement("script");
    script.src = %s;
    script.async = true;
    window.Plotly = new Promise(function (resolve, reject) {
        script.onload = resolve;
        script.onerror = function (e) { window.Plotly = undefined; reject(e); };
    });
    document.head.appendChild(script);
}"""


@functools.cache
def bundle() -> tuple[str, bytes]:
    """(file name, source) of the plotly.js the app serves: the vendored cartesian bundle if its
    header names the plotly.js version the installed plotly bundles, else plotly's full bundle."""
    from plotly.offline import get_plotlyjs, get_plotlyjs_version

    version = get_plotlyjs_version()
    try:
        js = VENDORED_PLOTLY.read_text(encoding="utf-8")
    except OSError:
        js = ""
    if js.startswith(f"/**\n* plotly.js (cartesian - minified) v{version}\n"):
        name = f"plotly-cartesian-{version}.min.js"
    else:
        name, js = f"plotly-{version}.min.js", get_plotlyjs()
    return name, (COMPILE_HINT + js).encode()


def install(app: Dash) -> None:
    """Serve ``bundle()`` from APP, preload it from the index and start it with the first
    callback request."""
    name = "_tracekit/" + bundle()[0]  # versioned: cached for good
    url = app.config.requests_pathname_prefix + name

    @app.server.route(app.config.routes_pathname_prefix + name)
    def plotly_js() -> Response:
        return Response(
            bundle()[1],
            mimetype="application/javascript",
            headers={"Cache-Control": "public, max-age=31536000, immutable"},
        )

    app.index_string = app.index_string.replace(
        "{%css%}",
        '{%css%}\n        <link rel="preload" as="script" href="' + html.escape(url) + '">',
        1,
    )
    app.renderer = _RENDERER % json.dumps(url)
