"""The parse floor: read + gunzip + JSON-decode the same files, nothing else, as fast as Python can.

``python floor.py --parser msgspec|orjson|kscan --workers W FILE...``

- ``msgspec``: decode into the very typed Structs tracekit's ingest declares (``Trace``,
  ``_Event``, ``_Common``: only the fields it reads; each event's args stay raw JSON and the
  X events' common args are decoded, as ingest does; the class definitions are taken from
  tracekit/ingest/kineto_decode.py's source, so this process imports msgspec only, not polars);
- ``orjson``: ``orjson.loads`` of the whole document (dicts and lists of everything);
- ``kscan``: tracekit's own C scanner (tracekit/ingest/_kscan.c), loaded from its shared
  library alone (no polars): the JSON bytes to column buffers, nothing after. The fastest
  parse this machine has, so the hardest floor.

Workers: W > 1 parses in a spawned ProcessPoolExecutor of W processes, one file per task, as
tracekit does; W = 1 parses in this process. Prints the number of events decoded.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import sys
import types
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

KINETO = Path(__file__).resolve().parents[1] / "tracekit" / "ingest" / "kineto_decode.py"
_decoder = _common = None


def _structs() -> dict:
    """Trace, _Event, _Common exactly as kineto_decode.py defines them (exec'd with msgspec only)."""
    import typing

    import msgspec

    tree = ast.parse(KINETO.read_text())
    wanted = {"_Common", "_Event", "Trace", "_NO_RAW"}
    body = [
        n
        for n in tree.body
        if (isinstance(n, ast.ClassDef) and n.name in wanted)
        or (isinstance(n, ast.Assign) and any(getattr(t, "id", None) in wanted for t in n.targets))
    ]
    module = types.ModuleType("kineto_structs")  # registered: msgspec resolves annotations there
    module.__dict__.update(msgspec=msgspec, Any=typing.Any)
    sys.modules[module.__name__] = module
    exec(compile(ast.Module(body=body, type_ignores=[]), str(KINETO), "exec"), module.__dict__)  # noqa: S102
    return module.__dict__


def _kscan() -> types.ModuleType:
    """tracekit.ingest._kscan without importing the tracekit package (which imports polars)."""
    import importlib.machinery
    import importlib.util

    if "tracekit.ingest._kscan" in sys.modules:
        return sys.modules["tracekit.ingest._kscan"]
    built = sorted(KINETO.parent.glob("_kscan*.so"))
    if not built:
        raise SystemExit("tracekit's C scanner is not built (pip install -e . builds it)")
    loader = importlib.machinery.ExtensionFileLoader("tracekit.ingest._kscan", str(built[0]))
    spec = importlib.util.spec_from_file_location("tracekit.ingest._kscan", built[0], loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[spec.name] = module
    return module


def _parse(path: str, parser: str) -> int:
    global _decoder, _common
    data = Path(path).read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    if parser == "orjson":
        import orjson

        return len(orjson.loads(data)["traceEvents"])
    if parser == "kscan":
        return _kscan().scan(data)[0]
    if _decoder is None:
        import msgspec

        structs = _structs()
        _decoder = msgspec.json.Decoder(structs["Trace"], strict=False)
        _common = msgspec.json.Decoder(structs["_Common"], strict=False).decode
    events = _decoder.decode(data).traceEvents
    for e in events:  # the X events' common args, as ingest decodes them
        if e.ph == "X" and e.args:
            _common(e.args)
    return len(events)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parser", choices=["msgspec", "orjson", "kscan"], default="msgspec")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    if a.workers > 1:
        with ProcessPoolExecutor(a.workers, mp_context=get_context("spawn")) as pool:
            n = sum(pool.map(_parse, a.files, [a.parser] * len(a.files)))
    else:
        n = sum(_parse(f, a.parser) for f in a.files)
    print(n)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
