"""The Dash app: layout and callbacks only; every figure comes from tracekit.figures."""
