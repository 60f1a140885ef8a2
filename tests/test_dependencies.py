"""Every third-party import of the repository is declared in pyproject.toml; nothing is assumed.

The imports of tracekit/, dashboards/, instrumented_runs/, tests/, benchmarks/ and scripts/ are
read from the source (ast, so lazy imports inside functions count), and each top-level module
that is neither the standard library nor ours is mapped to the distribution that installed it
in this environment (importlib.metadata.packages_distributions). That distribution must be
named in ``dependencies`` or in an extra: removing one from pyproject.toml fails this test.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the test extra installs tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("tracekit", "dashboards", "instrumented_runs", "tests", "benchmarks", "scripts")
FIRST_PARTY = {"tracekit", "dashboards", "instrumented_runs"}
# Imported but deliberately not a dependency, with the reason.
NOT_OURS = {
    "hta": "HolisticTraceAnalysis, benchmarks/hta_analyze.py: runs in its own venv "
    "(benchmarks/setup_hta_venv.sh), never in tracekit's",
}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_distributions(pyproject: dict) -> set[str]:
    """Distribution names in ``dependencies`` and every extra, normalised (PEP 503)."""
    project = pyproject["project"]
    reqs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        reqs.extend(extra)
    return {_normalise(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", r)[1]) for r in reqs}


def _is_local(module: str, source: Path, root: Path) -> bool:
    """A module of the repository: a sibling of the importing file (tests' conftest, benchmarks'
    measure) or a top-level folder or file of the repository (``from tests.conftest import``)."""
    return any(
        (here / f"{module}.py").is_file() or (here / module).is_dir()
        for here in (source.parent, root)
    )


def _ours(folder: Path, pattern: str) -> list[Path]:
    """The files of ``folder`` matching ``pattern``, less any virtual environment inside it (a
    folder with ``pyvenv.cfg``: benchmarks/setup_hta_venv.sh makes benchmarks/.venv) and vendored
    code: what the repository wrote, not what pip did."""
    venvs = [v.parent for v in folder.rglob("pyvenv.cfg")]
    return [
        p
        for p in sorted(folder.rglob(pattern))
        if "vendor" not in p.parts and not any(v in p.parents for v in venvs)
    ]


@functools.cache
def third_party_imports(root: Path = ROOT) -> dict[str, set[str]]:
    """Top-level module -> files importing it, for every module that is not stdlib nor ours."""
    found: dict[str, set[str]] = {}
    for folder in FOLDERS:
        for path in _ours(root / folder, "*.py"):
            tree = ast.parse(path.read_bytes(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if (
                        top in sys.stdlib_module_names
                        or top in FIRST_PARTY
                        or top == "__future__"
                        or _is_local(top, path, root)
                    ):
                        continue
                    found.setdefault(top, set()).add(str(path.relative_to(root)))
    return found


def undeclared(
    imports: dict[str, set[str]], declared: set[str], providers: dict[str, list[str]]
) -> list[str]:
    """One line per imported module that no declared distribution provides."""
    problems = []
    for module, files in sorted(imports.items()):
        if module in NOT_OURS:
            continue
        # not installed here (e.g. tomli on Python >= 3.11): the module's own name must be declared
        dists = {_normalise(d) for d in providers.get(module, [module])}
        if not dists & declared:
            where = ", ".join(sorted(files)[:3])
            problems.append(
                f"{module} (distribution {' or '.join(sorted(dists))}), imported by {where}"
            )
    return problems


@functools.cache
def _providers() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _load_pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def test_every_import_is_declared() -> None:
    imports = third_party_imports()
    assert {"torch", "polars", "numpy", "pytest"} <= imports.keys()  # the scan sees the code
    declared = declared_distributions(_load_pyproject())
    problems = undeclared(imports, declared, _providers())
    assert not problems, "imported but not declared in pyproject.toml:\n" + "\n".join(problems)


def test_removing_a_declared_dependency_is_caught() -> None:
    """The check can fail: drop each distribution that some import needs, one at a time."""
    imports = third_party_imports()
    providers = _providers()
    declared = declared_distributions(_load_pyproject())
    needed = {
        _normalise(d): module
        for module in imports
        if module not in NOT_OURS
        for d in providers.get(module, [module])
        if _normalise(d) in declared
    }
    assert {"numpy", "torch", "orjson", "polars"} <= needed.keys()
    for dist, module in needed.items():
        problems = undeclared(imports, declared - {dist}, providers)
        assert any(p.startswith(f"{module} ") for p in problems), (dist, problems)


def test_no_file_reads_outside_the_repository() -> None:
    """The repository stands alone: no path into a sibling folder, no outside design notes."""
    outside = re.compile(re.escape("..") + "/shared|DESIGN" + r"\.md")
    hits = []
    for folder in (*FOLDERS, "docs"):
        for path in _ours(ROOT / folder, "*"):
            if path.suffix not in (".py", ".md", ".sh", ".toml", ".txt") or not path.is_file():
                continue
            for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if outside.search(line):
                    hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()[:80]}")
    assert not hits, "\n".join(hits)


def test_torch_is_the_runs_extra_and_the_name_is_ours() -> None:
    """Issue #25: the analysis installs without torch (it is the `runs` extra), and the
    distribution is not `tracekit`, an unrelated project on PyPI."""
    project = _load_pyproject()["project"]
    assert "torch" not in declared_distributions(
        {"project": {"dependencies": project["dependencies"]}}
    )
    assert any(r.startswith("torch") for r in project["optional-dependencies"]["runs"])
    assert project["name"] == "tracekit-dist"
    from tracekit.cli.runs import DISTRIBUTION

    assert DISTRIBUTION == project["name"]  # the one-line hint names what pip can install


def test_tracekit_never_names_the_run_side() -> None:
    """tracekit finds the strategies through the ``tracekit.run_side`` entry point; not even a
    docstring names the package, so a reader of tracekit/ learns the vocabulary from tracekit
    alone (the import contract in pyproject.toml covers imports, this covers the text)."""
    naming = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "tracekit").rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "instrumented_runs" in line
    ]
    assert naming == [], naming
