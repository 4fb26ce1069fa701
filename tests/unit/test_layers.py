"""The package's import graph: no cycles, and imports point down the layers of docs/design.md.

Read from the source with ``ast``, every import counted: function-level ones (an import
hidden in a function still makes a cycle, it only delays it) and type-only ones under
``if TYPE_CHECKING:`` (they never run, but a module that names another's types while that
one imports it back is one room in two files). Importing ``a.b.c`` also runs the packages
``a.b`` and ``a`` (unless the importer is inside them), so they count as imported too. A
new cycle fails here with its path.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "celery_election"
#: Modules that may import Celery (docs/design.md); every other module is the core. A
#: package listed here (beat, integration) is on the Celery side with all its modules.
CELERY_SIDE = {
    "integration", "beat", "schedule", "keys", "ops", "signals", "web", "runs.once",
}  # fmt: skip
#: Core modules allowed one Celery-side module, and why: the pytest plugin's
#: ``election_keys`` fixture imports the singleton tasks' kit when a test uses it, not before.
ALLOWED = {"pytest_plugin": {"keys", "keys.testing"}}
#: The wings and the top-level modules, bottom to top (docs/design.md draws them): each
#: imports only what stands before it, so the wings hold the one-way arrows the modules
#: hold. ``""`` is the package's face, which names the public parts of every wing.
WINGS = [
    "errors", "release", "signals", "core", "backends", "election", "history", "metrics",
    "settings", "process", "runs", "schedule", "beat", "keys", "web", "integration", "ops",
    "", "testing", "pytest_plugin",
]  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(p for p in parts if p != "__init__")


def imports_of(path: Path, *, typing: bool = True) -> set[str]:
    """The package modules ``path`` imports (``from . import x`` counted as ``x``).

    ``typing=False``: only what runs (imports under ``if TYPE_CHECKING:`` left out).
    """
    here = module_name(path).split(".") if module_name(path) else []
    package = here if path.name == "__init__.py" else here[:-1]
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree) if typing else runtime_nodes(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            target = [*base, *(node.module.split(".") if node.module else [])]
            for alias in node.names:
                candidate = ".".join([*target, alias.name])
                found.add(candidate if candidate in MODULES else ".".join(target))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            name = node.module if isinstance(node, ast.ImportFrom) else None
            for n in [name] if name else [a.name for a in node.names]:  # type: ignore[union-attr]
                if n and n.startswith("celery_election."):
                    found.add(n.removeprefix("celery_election."))
    found = {m for m in found if m in MODULES}
    for m in list(found):  # the packages that importing ``m`` runs first
        parts = m.split(".")
        found.update(".".join(parts[:k]) for k in range(1, len(parts)) if parts[:k] != here[:k])
    return {m for m in found if m in MODULES and m != module_name(path)}


def runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node, less the bodies of ``if TYPE_CHECKING:``."""
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


FILES = sorted(PACKAGE.rglob("*.py"))
MODULES = {module_name(f) for f in FILES}
GRAPH = {module_name(f): imports_of(f) for f in FILES}
#: what runs: the Celery side may be named in a type hint of the core, never imported
RUNTIME = {module_name(f): imports_of(f, typing=False) for f in FILES}


def cycle_from(start: str) -> list[str] | None:
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        for nxt in GRAPH[node]:
            if nxt == start:
                return [*path, nxt]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


def test_the_graph_is_read() -> None:
    assert GRAPH["beat"] == {"beat.persistent", "beat.scheduler"}
    assert GRAPH["beat.persistent"] >= {"beat.scheduler", "beat.ops"}
    assert GRAPH["beat.scheduler"] >= {"beat.election", "beat.fence", "backends.base"}
    assert "election.elector" in GRAPH["beat.election"]
    assert "schedule.spec" in GRAPH["schedule.api"]
    assert "backends.sql_beat" in GRAPH["backends.sql"]


def test_no_import_cycles() -> None:
    cycles = [c for m in sorted(MODULES) if (c := cycle_from(m))]
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)


def test_the_election_core_never_imports_the_operable_schedule() -> None:
    """The operable schedule and its page are a room of their own (``schedule/``): only
    the beat that serves it, the CLI, the app's signal hookup and the worker's and beat's
    /metrics (each entry's overdue seconds, ``schedule/overdue.py``) reach into it."""
    users = {
        m
        for m, deps in GRAPH.items()
        if not m.startswith("schedule") and any(d.split(".")[0] == "schedule" for d in deps)
    }
    beat = {"beat.ops", "beat.catchup", "beat.guards", "beat.history", "beat.election"}
    assert users <= {*beat, "integration.bootstep", "ops.cli", "web"}, sorted(users)
    core = {m for m in MODULES if not on_celery_side(m) and m != "ops.demo"}
    assert not users & core


def on_celery_side(module: str) -> bool:
    """``module`` is, or is in a package that is, on the Celery side (``beat.ops``)."""
    parts = module.split(".")
    return any(".".join(parts[:k]) in CELERY_SIDE for k in range(1, len(parts) + 1))


def test_the_core_never_imports_the_celery_side() -> None:
    core = {m for m in MODULES if not on_celery_side(m) and m != "ops.demo"}
    reach = {m: {s for s in RUNTIME[m] if on_celery_side(s)} - ALLOWED.get(m, set()) for m in core}
    bad = {m: sorted(sides) for m, sides in reach.items() if sides}
    bad.pop("", None)  # the package's __init__ loads the Celery side lazily, by name
    assert bad == {}


def wing(module: str) -> str:
    return module.split(".")[0]


def test_wings_import_only_the_wings_below_them() -> None:
    """One arrow from wing to wing, downwards: a wing that reached up would make the two
    one room, whatever their folders say."""
    assert {wing(m) for m in MODULES} == set(WINGS)
    up = sorted(
        f"{m} -> {d}"
        for m, deps in GRAPH.items()
        for d in deps
        if WINGS.index(wing(d)) > WINGS.index(wing(m))
    )
    assert up == []


def test_the_package_stands_in_wings() -> None:
    """At most 12 modules directly in the package; the rest stand in wings (issue 53)."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 12, top


def test_the_harness_and_the_benchmarks_never_import_the_tests() -> None:
    """Benchmarks and the harness they share stand on the package alone (issue 12)."""
    root = PACKAGE.parent
    offenders = []
    for path in [
        *root.joinpath("harness").rglob("*.py"),
        *root.joinpath("benchmarks").glob("*.py"),
    ]:
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            offenders += [
                f"{path.relative_to(root)}: {n}" for n in names if n.split(".")[0] == "tests"
            ]
    assert len(list(root.joinpath("harness").rglob("*.py"))) > 5  # the harness was read
    assert offenders == []
