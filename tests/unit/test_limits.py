"""Size and shape limits of the package, read from the source with ``ast`` (issue 41).

A module, a function, a class's state or a scheduler's inheritance chain that grows past
its limit fails here with every offender named (``path:line`` and its size), so the fix
starts from the list. Only the last test imports anything (Celery's scheduler and ours,
to read the MRO); the others read the files.
"""

from __future__ import annotations

import ast
import inspect
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "celery_election"

#: Lines in one module: past this a file holds more than one job; split it by job.
MAX_MODULE_LINES = 600
#: Lines in one function or method (``def`` to its last line, decorators excluded): past
#: this it does several things in a row; name the steps.
MAX_FUNCTION_LINES = 60
#: ``type: ignore`` comments in ``celery_election/beat/``: each hides a type the checker
#: cannot see; many means Celery's untyped API is leaking into our code instead of being
#: wrapped once.
MAX_BEAT_TYPE_IGNORES = 10
#: Instance fields of ``ElectionLoop``: past this the loop holds state that belongs to a
#: collaborator or to one phase, and each step's reads and writes are harder to follow.
#: The phases keep their timers in the values they are handed (election/steps.py).
MAX_ELECTION_LOOP_FIELDS = 20
#: Our classes in ``LeaderScheduler.__mro__``: each layer over Celery's scheduler is a
#: place a hook may be overridden; more than a few and nobody knows which one runs.
MAX_SCHEDULER_LAYERS = 3
#: How many of our classes in that MRO may define one method of Celery's scheduler: two
#: overrides of one hook (each calling ``super()``) split one behaviour over two files.
MAX_OVERRIDES_OF_A_CELERY_METHOD = 1


TYPE_IGNORE = re.compile(r"type:\s*ignore")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def package_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def functions(tree: ast.AST) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method of ``tree``, nested ones too, with its qualified name."""
    todo: list[tuple[str, ast.AST]] = [("", tree)]
    while todo:
        prefix, node = todo.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield prefix + child.name, child
                todo.append((f"{prefix}{child.name}.", child))
            elif isinstance(child, ast.ClassDef):
                todo.append((f"{prefix}{child.name}.", child))
            else:
                todo.append((prefix, child))


def length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the ``def`` (not its decorators) to the function's last line."""
    return (node.end_lineno or node.lineno) - node.lineno + 1


def test_no_module_is_too_long() -> None:
    offenders = []
    for path in package_files():
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            offenders.append(f"{rel(path)}:1 {lines} lines")
    shown = "\n".join(offenders)
    assert not offenders, f"modules over {MAX_MODULE_LINES} lines (split by job):\n{shown}"


def test_no_function_is_too_long() -> None:
    offenders = []
    for path in package_files():
        for name, node in functions(ast.parse(path.read_text())):
            if (n := length(node)) > MAX_FUNCTION_LINES:
                offenders.append(f"{rel(path)}:{node.lineno} {name}: {n} lines")
    assert not offenders, (
        f"functions over {MAX_FUNCTION_LINES} lines (name their steps):\n" + "\n".join(offenders)
    )


def type_ignores(path: Path) -> list[int]:
    """The lines of ``path`` with a ``type: ignore`` comment (comments only, not strings)."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return [
        t.start[0] for t in tokens if t.type == tokenize.COMMENT and TYPE_IGNORE.search(t.string)
    ]


def test_few_type_ignores_in_the_beat() -> None:
    found = [
        f"{rel(path)}:{line}"
        for path in sorted((PACKAGE / "beat").rglob("*.py"))
        for line in type_ignores(path)
    ]
    assert len(found) <= MAX_BEAT_TYPE_IGNORES, (
        f"{len(found)} `type: ignore` comments in celery_election/beat/ "
        f"(at most {MAX_BEAT_TYPE_IGNORES}):\n" + "\n".join(found)
    )


def instance_fields(cls: ast.ClassDef) -> dict[str, int]:
    """The class's instance fields, each with the first line that sets it.

    ``self.X`` assigned anywhere in the class (``=``, ``+=``, annotated, in a tuple, or
    ``setattr(self, "X", ...)`` / ``object.__setattr__(self, "X", ...)``), and the fields
    annotated in the class body (a dataclass's), less ``ClassVar`` ones.
    """
    fields: dict[str, int] = {}
    for stmt in cls.body:
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and "ClassVar" not in ast.unparse(stmt.annotation)
        ):
            fields.setdefault(stmt.target.id, stmt.lineno)
    for node in ast.walk(cls):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in (
            "setattr",
            "object.__setattr__",
        ):
            args = node.args
            if (
                len(args) >= 2
                and isinstance(args[0], ast.Name)
                and args[0].id == "self"
                and isinstance(args[1], ast.Constant)
                and isinstance(args[1].value, str)
            ):
                fields.setdefault(args[1].value, node.lineno)
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):
                targets.extend(t.elts)
            elif isinstance(t, ast.Starred):
                targets.append(t.value)
            elif (
                isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
            ):
                fields.setdefault(t.attr, t.lineno)
    return fields


def test_the_election_loop_holds_few_fields() -> None:
    path = PACKAGE / "election/loop.py"
    classes = [
        n
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.ClassDef) and n.name == "ElectionLoop"
    ]
    assert len(classes) == 1, f"no class ElectionLoop in {rel(path)}"
    fields = instance_fields(classes[0])
    assert len(fields) <= MAX_ELECTION_LOOP_FIELDS, (
        f"ElectionLoop ({rel(path)}:{classes[0].lineno}) has {len(fields)} instance fields "
        f"(at most {MAX_ELECTION_LOOP_FIELDS}):\n"
        + "\n".join(f"{rel(path)}:{line} self.{name}" for name, line in sorted(fields.items()))
    )


def test_the_leader_scheduler_has_few_layers_over_celerys() -> None:
    from celery.beat import PersistentScheduler, Scheduler

    from celery_election.beat import LeaderScheduler

    ours = [c for c in LeaderScheduler.__mro__ if c.__module__.split(".")[0] == "celery_election"]

    def where(cls: type, name: str | None = None) -> str:
        obj = cls if name is None else _function(cls.__dict__[name]) or cls
        try:
            file = Path(inspect.getsourcefile(obj) or "?")
            line = inspect.getsourcelines(obj)[1]
        except (OSError, TypeError):
            return f"{cls.__module__}.{cls.__qualname__}"
        shown = rel(file) if file.is_relative_to(ROOT) else str(file)
        return f"{shown}:{line} {cls.__qualname__}" + (f".{name}" if name else "")

    problems = []
    if len(ours) > MAX_SCHEDULER_LAYERS:
        problems.append(
            f"LeaderScheduler.__mro__ holds {len(ours)} of our classes "
            f"(at most {MAX_SCHEDULER_LAYERS}):\n" + "\n".join(f"  {where(c)}" for c in ours)
        )
    celery_methods = {
        name: f"celery.beat.{base.__name__}.{name}"
        for base in (PersistentScheduler, Scheduler)  # Scheduler's name wins: it is the root
        for name, value in vars(base).items()
        if _function(value) is not None
    }
    for name, celerys in sorted(celery_methods.items()):
        defining = [c for c in ours if name in vars(c)]
        if len(defining) > MAX_OVERRIDES_OF_A_CELERY_METHOD:
            problems.append(
                f"{celerys} is defined in {len(defining)} of our classes "
                f"(at most {MAX_OVERRIDES_OF_A_CELERY_METHOD}):\n"
                + "\n".join(f"  {where(c, name)}" for c in defining)
            )
    assert not problems, "\n".join(problems)


def _function(value: object) -> Any:
    """The function behind a class attribute (a method, static/class method, property).

    None for anything else (a nested class such as ``Scheduler.Entry``, a constant).
    """
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    elif isinstance(value, property):
        value = value.fget
    return inspect.unwrap(value) if inspect.isfunction(value) else None
