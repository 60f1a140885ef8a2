"""The Dash app (dashboards.app wires root, runs, pages, index, plotly_js); every figure comes
from tracekit.figures."""
