"""The one place the tests find the public trace corpus: the folder named by ``TRACEKIT_CORPUS``
(hta/, kineto/, tracelens/, param/ as the corpus README lists them; docs/corpus-sources.md).

The traces are not committed (docs/corpus.md says why and how to get them). A test that reads
them is marked ``@pytest.mark.corpus`` (or its module sets ``pytestmark``); tests/conftest.py
then calls :func:`require` before it runs, so that without the corpus every such test skips
with the same one reason line, and no other test skips because of it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ENV = "TRACEKIT_CORPUS"
GET_IT = f"python scripts/fetch_corpus.py DEST --manifest M, then {ENV}=DEST (docs/corpus.md)"
#: where the corpus is; a path that cannot exist when the variable is unset, so that module-level
#: constants (CORPUS / "hta" / ...) can be written, and only reading them needs the corpus
CORPUS = Path(os.environ.get(ENV) or "/nonexistent/TRACEKIT_CORPUS-unset")
HTA = CORPUS / "hta"


def missing() -> str | None:
    """Why the corpus cannot be read, or None when it can."""
    if not os.environ.get(ENV):
        return f"no trace corpus: {ENV} is not set; get it with {GET_IT}"
    if not CORPUS.is_dir():
        return f"no trace corpus: {ENV}={CORPUS} is not a folder; get it with {GET_IT}"
    return None


def require() -> Path:
    """The corpus root; skips the calling test (one reason, raised here, so `pytest -ra` shows
    one line for all of them) when it is not there."""
    why = missing()
    if why:
        pytest.skip(why, allow_module_level=True)  # also from a module's top level
    return CORPUS


#: the HTA traces the tests below tests/ were written on (they were committed under
#: the repository until #23); named here so that tests parametrized over them keep their
#: ids, and skip, without the corpus
HTA_TRACES = (
    "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    "distributed_info_unavailable/distributed_info_not_found.json.gz",
    "nccl_parser_config/nccl_data.json.gz",
    "rank_unavailable/rank_not_found.json.gz",
    "trace_filter/sampled_rank-0.json.gz",
    "trace_filter/sampled_rank-1.json.gz",
)
HTA_FOLDERS = tuple(sorted({t.rsplit("/", 1)[0] for t in HTA_TRACES}))  # critical_path/alexnet
