"""The optional C fast path of trace ingest (tracekit/ingest/_kscan.c); metadata is in pyproject.toml.

``optional=True``: without a C compiler or Python headers the build goes on and ingest uses its
msgspec path (same results, about 3x slower on large traces).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tracekit.ingest._kscan",
            ["tracekit/ingest/_kscan.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
