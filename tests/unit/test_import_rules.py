"""The architecture's import rules (design.md, style.md), checked statically over every import.

Every ``import`` and ``from ... import`` in the packages counts, module-level and lazy (inside
functions) alike, so a rule cannot be dodged by importing late. The rules:
- ``shared`` depends on no service; each service depends only on ``shared`` and itself; the
  scheduler-side client too (it ships to schedulers, without the services);
- the serving processes never import what does not belong on the hot path (pandas,
  scikit-learn, plotting); the coalescer does not evaluate models, so no XGBoost either;
- nothing imports pickle or its relatives (models travel in XGBoost's native format);
- FastAPI is an admin-API framework: only the training server's app and route modules may import
  it; the prediction server and the coalescer are plain Starlette, and so is ``shared.http``;
- no import cycles between the modules of a package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("shared", "training_server", "prediction_server", "coalescer", "scheduler_client", "stack")
SERVICES = ("training_server", "prediction_server", "coalescer")
OWN_TOP_LEVEL = {*PACKAGES, "bench", "tests"}

ALLOWED_OWN = {
    "shared": {"shared"},
    "training_server": {"shared", "training_server"},
    "prediction_server": {"shared", "prediction_server"},
    "coalescer": {"shared", "coalescer"},
    "scheduler_client": {"shared", "scheduler_client"},
    "stack": {*PACKAGES},  # the launcher and demo start everything; never bench/ or tests/
}
NOT_ON_HOT_PATH = {"pandas", "sklearn", "matplotlib", "scipy", "pyarrow"}
FORBIDDEN_THIRD_PARTY = {
    "prediction_server": NOT_ON_HOT_PATH | {"fastapi"},
    "coalescer": NOT_ON_HOT_PATH | {"xgboost", "fastapi"},
    "shared": NOT_ON_HOT_PATH | {"fastapi"},
    "scheduler_client": NOT_ON_HOT_PATH | {"xgboost"},
}
PICKLE_LIKE = {"pickle", "cPickle", "_pickle", "joblib", "dill", "cloudpickle", "shelve", "marshal"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, int]]:
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    return _imports_of(path.read_text(), package)


def _imports_of(source: str, package: list[str]) -> list[tuple[str, int]]:
    """Absolute names of every module ``source`` imports (relative imports resolved against
    ``package``), with line numbers."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.append((module, node.lineno))
            # ``from pkg import submodule`` imports the submodule too
            found.extend((f"{module}.{alias.name}", node.lineno) for alias in node.names)
    return found


def _sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py"))


ALL_MODULES = {_module_name(p) for p in _sources()}


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(REPO)))
def test_imports_follow_the_architecture(path: Path) -> None:
    owner = path.relative_to(REPO).parts[0]
    problems = []
    for name, line in _imports(path):
        top = name.split(".")[0]
        where = f"{path.relative_to(REPO)}:{line} imports {name}"
        if top in OWN_TOP_LEVEL and top not in ALLOWED_OWN[owner]:
            problems.append(f"{where}: {owner} may import only {sorted(ALLOWED_OWN[owner])}")
        if top in FORBIDDEN_THIRD_PARTY.get(owner, set()):
            problems.append(f"{where}: not allowed in {owner}")
        if top in PICKLE_LIKE:
            problems.append(f"{where}: no pickle on any path")
        in_http_layer = path.stem in {"app", "routes"} or path.stem.endswith("_routes")
        if top == "fastapi" and not in_http_layer:
            problems.append(f"{where}: FastAPI belongs in app/route modules only")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles_within_a_package(package: str) -> None:
    graph: dict[str, set[str]] = {}
    for path in (REPO / package).rglob("*.py"):
        module = _module_name(path)
        graph[module] = {
            name for name, _ in _imports(path) if name in ALL_MODULES and name != module and "." in name
        } - {n for n in ALL_MODULES if module.startswith(n + ".")}  # a module may import its parents
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*trail[trail.index(nxt) :], nxt] if nxt in trail else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_lazy_and_relative_imports() -> None:
    """The rules above would be toothless if imports inside functions or relative ones were missed."""
    source = "from . import relay\n\ndef f():\n    import pandas\n    from ..training_server import trainer\n"
    names = {name for name, _ in _imports_of(source, ["coalescer"])}
    assert {"pandas", "coalescer.relay", "training_server", "training_server.trainer"} <= names
