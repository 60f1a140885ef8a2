"""What the tests build their inputs from, in one place (no test module imports another).

- ``traces``: Kineto trace files, hand-built event by event or derived from the real ones.
- ``damage``: real traces damaged on purpose (a hypothesis strategy) for the bad-input tests.
- ``analyses``: events tables from partial rows, and synthetic Analysis objects with every
  section, for figures, report and app.
- ``summary``: a whole summary, valid against tracekit.summary, from the keys a test gives.

The plain-Python reference that recomputes tracekit's numbers from a trace's JSON is
tests/corpus_reference.py; the fixtures and the helpers that start processes (the CLI, a
torchrun job, the Dash app) are in tests/conftest.py.
"""
