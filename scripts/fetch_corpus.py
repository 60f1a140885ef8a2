"""Download the public trace corpus into DEST, each file from its upstream repository at the
commit a manifest names, checked against the manifest's sha256.

Run: python scripts/fetch_corpus.py DEST --manifest PATH [--base URL]
then: TRACEKIT_CORPUS=DEST python -m pytest -q tests/test_corpus.py

PATH is the list scripts/corpus_manifest.py writes from a corpus README (the project commits
no part of the corpus, its list neither). URL (default https://raw.githubusercontent.com)
+ /REPO/COMMIT/UPSTREAM is each file's address (any URL urllib opens; the tests use a file:// mirror). A file already in DEST with the right
digest is kept. Each file is written to a temporary name beside it and renamed, so DEST never
holds a half-written or unchecked file. Upstream keeps param's dlrm ranks inside
dlrm_kineto.tar.gz: the member is taken out, its JSON checked against ``json_sha256``, and
gzipped here (the .gz bytes depend on the gzip used, so only the JSON is checked). One line per
file that could not be got, on stderr; exit 1 if any, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile
import tempfile
import urllib.request
from collections.abc import Callable
from pathlib import Path

BASE = "https://raw.githubusercontent.com"
Opener = Callable[[str], bytes]


class Refused(Exception):
    """A file that could not be got: the one line said about it."""


def _open(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as response:  # noqa: S310 - URLs we build
        return response.read()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def content(entry: dict, base: str, opener: Opener, archives: dict[str, bytes]) -> bytes:
    """The bytes to write for one manifest entry, checked."""
    url = f"{base.rstrip('/')}/{entry['repo']}/{entry['commit']}/{entry['upstream']}"
    try:
        if url not in archives:
            archives[url] = opener(url)
        raw = archives[url]
    except OSError as err:  # urllib's URLError/HTTPError are OSErrors
        raise Refused(f"{url}: {getattr(err, 'reason', err)}") from None
    if "member" not in entry:
        if _sha(raw) != entry["sha256"]:
            raise Refused(
                f"{url}: sha256 {_sha(raw)[:12]}… is not the manifest's {entry['sha256'][:12]}…"
            )
        return raw
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:*") as tar:
            member = tar.extractfile(entry["member"])
            data = member.read() if member else b""
    except (tarfile.TarError, KeyError, OSError) as err:
        raise Refused(f"{url}: no member {entry['member']} ({err})") from None
    if _sha(data) != entry["json_sha256"]:
        raise Refused(f"{url}: {entry['member']}: sha256 {_sha(data)[:12]}… is not the manifest's")
    return gzip.compress(data, compresslevel=9, mtime=0)


def _have(target: Path, entry: dict) -> bool:
    if not target.is_file():
        return False
    data = target.read_bytes()
    if "member" in entry:
        try:
            return _sha(gzip.decompress(data)) == entry["json_sha256"]
        except (OSError, EOFError):
            return False
    return _sha(data) == entry["sha256"]


def _write(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fetch(dest: Path, entries: list[dict], base: str = BASE, opener: Opener = _open) -> list[str]:
    """Fetch every entry into dest; the lines about the files that could not be got."""
    failed: list[str] = []
    archives: dict[str, bytes] = {}  # one download per archive, for all its members
    for entry in entries:
        target = dest / entry["path"]
        if _have(target, entry):
            continue
        try:
            _write(target, content(entry, base, opener, archives))
        except Refused as why:
            failed.append(f"fetch_corpus: {entry['path']}: {why}")
    return failed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--base", default=BASE, help=f"where the repositories are ({BASE})")
    parser.add_argument(
        "--manifest", type=Path, required=True, help="scripts/corpus_manifest.py's list"
    )
    args = parser.parse_args(argv)
    try:
        entries = json.loads(args.manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        print(f"fetch_corpus: {args.manifest}: {err}", file=sys.stderr)
        return 2
    failed = fetch(args.dest, entries, args.base)
    for line in failed:
        print(line, file=sys.stderr)
    print(f"{args.dest}: {len(entries) - len(failed)} of {len(entries)} files", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
