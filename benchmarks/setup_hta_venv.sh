#!/usr/bin/env bash
# The benchmark's own virtual environment with HolisticTraceAnalysis (never a tracekit dependency).
# Clean (no system site-packages: those hold tracekit and its stack), gitignored.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet -c "$here/constraints-hta.txt" \
    "HolisticTraceAnalysis==${HTA_VERSION:-0.5.0}"
"$venv/bin/python" -c "import hta, importlib.metadata as m; print('HTA', m.version('HolisticTraceAnalysis'))"
