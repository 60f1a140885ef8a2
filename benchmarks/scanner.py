"""The C scanner's speed, one build against another, in one process (issue #24).

    git show main:tracekit/ingest/_kscan.c > /tmp/kscan-main.c
    python benchmarks/scanner.py --baseline /tmp/kscan-main.c            # default inputs
    python benchmarks/scanner.py --baseline /tmp/kscan-main.c --rounds 9 FILE_OR_DIR...

Both sources (the baseline and tracekit/ingest/_kscan.c, or ``--candidate``) are compiled as
setup.py compiles the scanner (``-O2``) into a temporary folder and loaded side by side. Each
input is read (and gunzipped) once; then every round scans every input with A, then B, then
B, then A (so a change of load hits both alike), and the table gives, per input, the median
scan time of each build and B/A. Default inputs: the traces of tests/data/gpu, the largest
trace under ``$TRACEKIT_CORPUS`` (benchmarks/corpus_path.py) and sample_traces/dp. Wall times on a
shared machine swing: run it on a quiet one (``uptime`` is printed).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import corpus_path  # noqa: E402


def build(source: Path, where: Path, tag: str) -> ModuleType:
    """Compile SOURCE as the scanner extension into WHERE and load it as ``<tag>._kscan``."""
    from setuptools import Distribution, Extension
    from setuptools.command.build_ext import build_ext

    ext = Extension("_kscan", [str(source)], extra_compile_args=["-O2"])
    cmd = build_ext(Distribution({"ext_modules": [ext]}))
    cmd.build_lib, cmd.build_temp = str(where), str(where / "tmp")
    cmd.ensure_finalized()
    cmd.run()
    (so,) = where.glob("_kscan*.so")
    spec = importlib.util.spec_from_file_location(f"{tag}._kscan", so)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def default_inputs() -> list[Path]:
    corpus = corpus_path.corpus()
    traces = [p for p in corpus.rglob("*.json*") if p.is_file()]
    biggest = sorted(traces, key=lambda p: p.stat().st_size)[-1:]
    gpu = sorted((ROOT / "tests" / "data" / "gpu").glob("*/traces/rank*.json*"))
    return [*gpu, *biggest, *sorted((ROOT / "sample_traces" / "dp" / "traces").glob("rank*.json*"))]


def expand(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        out += sorted(q for q in p.rglob("*.json*") if q.is_file()) if p.is_dir() else [p]
    return out


def timed(scanner: ModuleType, data: bytes | bytearray) -> float:
    t0 = time.perf_counter()
    result = scanner.scan(data)
    took = time.perf_counter() - t0
    if result is None:
        raise SystemExit("a build declined an input: compare on traces both read")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--baseline", type=Path, required=True, help="the _kscan.c to compare with")
    ap.add_argument("--candidate", type=Path, default=ROOT / "tracekit" / "ingest" / "_kscan.c")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("inputs", type=Path, nargs="*")
    args = ap.parse_args()
    from tracekit.ingest.kineto_files import read_bytes

    files = expand(args.inputs) if args.inputs else default_inputs()
    with tempfile.TemporaryDirectory(prefix="tracekit-kscan-bench-") as tmp:
        a = build(args.baseline, Path(tmp) / "a", "baseline")
        b = build(args.candidate, Path(tmp) / "b", "candidate")
        inputs = [(f, read_bytes(f)) for f in files]
        times: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.rounds):
            for i, (_, data) in enumerate(inputs):
                for tag, scanner in (("a", a), ("b", b), ("b", b), ("a", a)):
                    times.setdefault((tag, i), []).append(timed(scanner, data))
    print(
        f"load: {os.getloadavg()}; {args.rounds} rounds, A = {args.baseline}, B = {args.candidate}"
    )
    print("| input | MB of JSON | A ms | B ms | B/A |\n|---|---|---|---|---|")
    total_a = total_b = 0.0
    for i, (f, data) in enumerate(inputs):
        ta, tb = statistics.median(times[("a", i)]), statistics.median(times[("b", i)])
        total_a, total_b = total_a + ta, total_b + tb
        name = f.relative_to(ROOT) if f.is_relative_to(ROOT) else f
        print(
            f"| {name} | {len(data) / 1e6:.1f} | {ta * 1e3:.1f} | {tb * 1e3:.1f} | {tb / ta:.3f} |"
        )
    print(f"| all | | {total_a * 1e3:.1f} | {total_b * 1e3:.1f} | {total_b / total_a:.3f} |")


if __name__ == "__main__":
    main()
