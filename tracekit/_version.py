"""The version of tracekit (pyproject.toml says the same), importable without the package's
heavy imports."""

__version__ = "0.1.0"
