"""Write OUT, the machine-readable list of the public trace corpus,
from a corpus folder's README.md tables (path, size, sha256, repository, commit, upstream path,
licence per file) and the folder itself (LICENSE sizes, the JSON digest of repacked members).

Run: python scripts/corpus_manifest.py CORPUS OUT

Nothing of the corpus is committed, its list neither: OUT goes wherever the caller keeps it.

Only metadata is written: scripts/fetch_corpus.py reads it to download every file from its
upstream repository at the commit named, and tests/test_fetch_corpus.py checks it against the
corpus. A file that upstream keeps inside an archive (param's dlrm_kineto.tar.gz) is an entry
with ``member`` (its name in the archive) and ``json_sha256`` (the digest of the JSON, which is
upstream's byte for byte; the .gz bytes are whatever gzip wrote, so they are not checked).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import sys
from pathlib import Path

# "## hta/ — https://github.com/OWNER/NAME @ `COMMIT` (LICENCE)"
SECTION = re.compile(r"^## (\w+)/ .*github\.com/([\w.-]+/[\w.-]+) @ `([0-9a-f]{40})` \((.+)\)")
LICENSE_SHA = re.compile(r"LICENSE sha256 `([0-9a-f]{64})`")
ARCHIVE = re.compile(r"^(\S+\.tar\.gz) → (\S+)")  # "UPSTREAM.tar.gz → MEMBER (how)"


def _row(line: str) -> list[str]:
    return [c.strip().strip("`") for c in line.strip().strip("|").split("|")]


def entries(corpus: Path) -> list[dict]:
    """Every file of CORPUS/README.md's tables, LICENSE files included, in README order."""
    out: list[dict] = []
    project = repo = commit = licence = ""
    for line in (corpus / "README.md").read_text(encoding="utf-8").splitlines():
        if m := SECTION.match(line):
            project, repo, commit, licence = m.groups()
        elif (m := LICENSE_SHA.search(line)) and project:
            path = f"{project}/LICENSE"
            size = (corpus / path).stat().st_size
            out.append(_entry(path, size, m.group(1), repo, commit, "LICENSE", licence))
        elif line.startswith("| ") and project and not line.startswith("| file"):
            name, size, sha, row_repo, short, upstream, row_licence = _row(line)
            if row_repo != repo or not commit.startswith(short):  # a table that disagrees
                raise ValueError(f"{line}: repository/commit differ from the section's")
            entry = _entry(f"{project}/{name}", int(size), sha, repo, commit, upstream, row_licence)
            if m := ARCHIVE.match(upstream):
                data = gzip.decompress((corpus / entry["path"]).read_bytes())
                entry.update(upstream=m.group(1), member=m.group(2))
                entry["json_sha256"] = hashlib.sha256(data).hexdigest()
            out.append(entry)
    return out


def _entry(path: str, size: int, sha: str, repo: str, commit: str, upstream: str, lic: str) -> dict:
    return {"path": path, "size": size, "sha256": sha, "repo": repo, "commit": commit,
            "upstream": upstream, "licence": lic}  # fmt: skip


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    out = Path(argv[1])
    listed = entries(Path(argv[0]))
    out.write_text(json.dumps(listed, indent=1) + "\n", encoding="utf-8")
    print(f"{out}: {len(listed)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
