"""scripts/fetch_corpus.py, run as a user runs it, against a file:// mirror laid out as
raw.githubusercontent.com is (REPO/COMMIT/PATH) in a temporary folder: never the network.
The manifest it reads is written from the corpus README by scripts/corpus_manifest.py (nothing
of the corpus is committed, its list neither) and checked against the corpus itself."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from builders import corpus_root

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "fetch_corpus.py"
MANIFEST_SCRIPT = ROOT / "scripts" / "corpus_manifest.py"
REPO, COMMIT = "owner/project", "0" * 40


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fetch(dest: Path, mirror: Path, manifest: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(dest), "--base", mirror.as_uri(), "--manifest", str(manifest)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _tar_gz(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_good_wrong_sha_missing_and_archive_member(tmp_path: Path) -> None:
    mirror, dest = tmp_path / "mirror", tmp_path / "dest"
    up = mirror / REPO / COMMIT
    up.mkdir(parents=True)
    good, member = b'{"traceEvents": []}', b'{"traceEvents": [1]}'
    (up / "good.json").write_bytes(good)
    (up / "changed.json").write_bytes(b"not what the manifest says")
    (up / "ranks.tar.gz").write_bytes(_tar_gz({"ranks/r0.json": member}))
    entry = {"repo": REPO, "commit": COMMIT, "licence": "MIT", "size": 1}
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps([
        {**entry, "path": "p/good.json", "upstream": "good.json", "sha256": _sha(good)},
        {**entry, "path": "p/changed.json", "upstream": "changed.json", "sha256": _sha(good)},
        {**entry, "path": "p/gone.json", "upstream": "gone.json", "sha256": _sha(good)},
        {**entry, "path": "p/r0.json.gz", "upstream": "ranks.tar.gz", "member": "ranks/r0.json",
         "sha256": "0" * 64, "json_sha256": _sha(member)},
    ]))  # fmt: skip
    run = _fetch(dest, mirror, manifest)
    assert run.returncode == 1, run.stderr
    lines = [x for x in run.stderr.splitlines() if x.startswith("fetch_corpus: ")]
    assert [x.split(":")[1].strip() for x in lines] == ["p/changed.json", "p/gone.json"], lines
    assert "is not the manifest's" in lines[0] and "gone.json" in lines[1]
    assert (dest / "p" / "good.json").read_bytes() == good
    assert gzip.decompress((dest / "p" / "r0.json.gz").read_bytes()) == member
    assert sorted(p.name for p in (dest / "p").iterdir()) == ["good.json", "r0.json.gz"]
    # again, with the mirror fixed: only what was missing is fetched, and all is there
    (up / "changed.json").write_bytes(good)
    (up / "gone.json").write_bytes(good)
    (up / "good.json").unlink()  # kept in dest, so never asked for
    assert _fetch(dest, mirror, manifest).returncode == 0


@pytest.mark.corpus
def test_the_manifest_lists_the_corpus_and_fetches_it_whole(tmp_path: Path) -> None:
    """Every file of the corpus (but its README) is in the manifest with its size and digest;
    a mirror made from the corpus (dlrm's ranks packed back into their archive) fetches whole."""
    corpus = corpus_root.require()
    manifest = tmp_path / "manifest.json"
    made = subprocess.run([sys.executable, str(MANIFEST_SCRIPT), str(corpus), str(manifest)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert made.returncode == 0, made.stderr
    entries = json.loads(manifest.read_text())
    files = sorted(str(p.relative_to(corpus)) for p in corpus.rglob("*") if p.is_file())
    assert [e["path"] for e in sorted(entries, key=lambda e: e["path"])] == [
        f for f in files if f != "README.md"
    ]
    mirror = tmp_path / "mirror"
    archives: dict[Path, dict[str, bytes]] = {}
    for e in entries:
        data = (corpus / e["path"]).read_bytes()
        assert (len(data), _sha(data)) == (e["size"], e["sha256"]), e["path"]
        target = mirror / e["repo"] / e["commit"] / e["upstream"]
        if "member" in e:
            archives.setdefault(target, {})[e["member"]] = gzip.decompress(data)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(corpus / e["path"], target)
    for target, members in archives.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(_tar_gz(members))
    dest = tmp_path / "dest"
    run = _fetch(dest, mirror, manifest)
    assert run.returncode == 0, run.stderr
    for e in entries:
        data = (dest / e["path"]).read_bytes()
        if "member" in e:
            assert _sha(gzip.decompress(data)) == e["json_sha256"], e["path"]
        else:
            assert _sha(data) == e["sha256"], e["path"]
