"""The shape of the beat wing, read from the source: classes, fields, methods, long functions.

    .venv/bin/python benchmarks/beat_shape.py                     # this repository
    .venv/bin/python benchmarks/beat_shape.py --tree /work/before # another checkout

Issue 41 (the beat refactor): a before/after view of ``celery_election/beat/*.py`` and of
``ElectionLoop`` (``celery_election/election/loop.py``), read with ``ast``: the package is
not imported, so any tree can be read, whatever the venv's editable install points at.
Celery is imported (``celery.beat``) for the names of its schedulers' methods.

Printed (markdown):

* classes: every class defined in ``beat/*.py`` (nested ones as ``Outer.Inner``) and
  ``ElectionLoop``: module, lines (``end_lineno - lineno + 1``, decorators not counted),
  instance fields (distinct ``self.X`` assigned anywhere in the class: ``=``, ``+=``,
  annotated, tuple targets, ``setattr(self, "X", ...)`` and ``object.__setattr__(self,
  "X", ...)``, in its methods and the functions nested in them, ``self`` being each method's
  first parameter; plus the annotated names of the class body, ``ClassVar`` excluded), methods
  defined in the class body (properties and static/class methods included), and "Celery
  overrides": how many of those method names are also methods or properties of
  ``celery.beat.Scheduler`` or ``celery.beat.PersistentScheduler`` (dunders included:
  ``__init__`` counts), with the names;
* modules: lines, ``type: ignore`` comments, classes, functions (all ``def``, nested too);
* the functions longer than ``--long`` (60) lines, longest first, by qualified name.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import io
import sys
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from celery.beat import PersistentScheduler, Scheduler

ROOT = Path(__file__).resolve().parents[1]
Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass
class ClassShape:
    module: str
    name: str
    lines: int
    fields: set[str] = field(default_factory=set)
    methods: list[str] = field(default_factory=list)


@dataclass
class ModuleShape:
    module: str
    lines: int
    type_ignores: int
    classes: int
    functions: int


def celery_methods() -> set[str]:
    """Names of the functions and properties of Celery's two schedulers (inherited too)."""
    names: set[str] = set()
    for cls in (Scheduler, PersistentScheduler):
        for name, value in inspect.getmembers(cls):
            if inspect.isfunction(value) or isinstance(value, property):
                names.add(name)
    return names


def nodes_within(node: ast.AST) -> list[ast.AST]:
    """Every node under ``node``, not entering nested classes."""
    out: list[ast.AST] = []
    todo = list(ast.iter_child_nodes(node))
    while todo:
        child = todo.pop()
        out.append(child)
        if not isinstance(child, ast.ClassDef):
            todo.extend(ast.iter_child_nodes(child))
    return out


def is_self(node: ast.AST, selves: set[str]) -> bool:
    return isinstance(node, ast.Name) and node.id in selves


def assigned_attrs(target: ast.AST, selves: set[str]) -> set[str]:
    if isinstance(target, ast.Attribute) and is_self(target.value, selves):
        return {target.attr}
    if isinstance(target, (ast.Tuple, ast.List)):
        return {a for elt in target.elts for a in assigned_attrs(elt, selves)}
    if isinstance(target, ast.Starred):
        return assigned_attrs(target.value, selves)
    return set()


def is_staticmethod(fn: Function) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)


def instance_fields(cls: ast.ClassDef) -> set[str]:
    fields: set[str] = set()
    for stmt in cls.body:
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and "ClassVar" not in ast.unparse(stmt.annotation)
        ):
            fields.add(stmt.target.id)
    for fn in cls.body:
        if not isinstance(fn, Function) or is_staticmethod(fn):
            continue
        params = [*fn.args.posonlyargs, *fn.args.args]
        if not params:
            continue
        selves = {params[0].arg}
        for node in nodes_within(fn):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    fields |= assigned_attrs(target, selves)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
                fields |= assigned_attrs(node.target, selves)
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                fields |= assigned_attrs(node.optional_vars, selves)
            elif isinstance(node, ast.Call) and len(node.args) >= 2:
                func = ast.unparse(node.func)
                obj, name = node.args[0], node.args[1]
                if (
                    func in ("setattr", "object.__setattr__")
                    and is_self(obj, selves)
                    and isinstance(name, ast.Constant)
                    and isinstance(name.value, str)
                ):
                    fields.add(name.value)
    return fields


def classes_of(tree: ast.Module, module: str) -> list[ClassShape]:
    out: list[ClassShape] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                name = prefix + child.name
                shape = ClassShape(
                    module, name, (child.end_lineno or child.lineno) - child.lineno + 1
                )
                shape.fields = instance_fields(child)
                shape.methods = [f.name for f in child.body if isinstance(f, Function)]
                out.append(shape)
                visit(child, name + ".")
            elif isinstance(child, Function):
                visit(child, f"{prefix}{child.name}.<locals>.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def functions_of(tree: ast.Module) -> list[tuple[str, int]]:
    """(qualified name, lines) of every ``def``, nested ones too."""
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, Function):
                name = prefix + child.name
                out.append((name, (child.end_lineno or child.lineno) - child.lineno + 1))
                visit(child, name + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def type_ignores(source: str) -> int:
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return sum(1 for t in tokens if t.type == tokenize.COMMENT and "type: ignore" in t.string)


def render(tree_root: Path, long: int) -> str:
    pkg = tree_root / "celery_election"
    paths = [*sorted((pkg / "beat").glob("*.py")), pkg / "election/loop.py"]
    overridable = celery_methods()
    classes: list[ClassShape] = []
    modules: list[ModuleShape] = []
    longest: list[tuple[int, str]] = []
    every: list[tuple[int, str]] = []
    for path in paths:
        module = str(path.relative_to(pkg).with_suffix("")).replace("/", ".")
        source = path.read_text()
        tree = ast.parse(source, str(path))
        found = classes_of(tree, module)
        if path.name == "loop.py":
            found = [c for c in found if c.name == "ElectionLoop"]
        classes += found
        functions = functions_of(tree)
        modules.append(
            ModuleShape(
                module,
                len(source.splitlines()),
                type_ignores(source),
                len(classes_of(tree, module)),
                len(functions),
            )
        )
        every += [(n, f"{module}.{name}") for name, n in functions]
        longest = [x for x in every if x[0] > long]
    lines = [
        f"## Beat wing shape: `{tree_root}`",
        "",
        "### Classes",
        "",
        "| module | class | lines | instance fields | methods | Celery overrides |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for c in classes:
        overrides = [m for m in c.methods if m in overridable]
        names = f" ({', '.join(overrides)})" if overrides else ""
        lines.append(
            f"| {c.module} | {c.name} | {c.lines} | {len(c.fields)} | {len(c.methods)} "
            f"| {len(overrides)}{names} |"
        )
    lines += [
        f"| **total** | {len(classes)} classes | {sum(c.lines for c in classes)} "
        f"| {sum(len(c.fields) for c in classes)} | {sum(len(c.methods) for c in classes)} "
        f"| {sum(1 for c in classes for m in c.methods if m in overridable)} |",
        "",
        "### Modules",
        "",
        "| module | lines | `type: ignore` | classes | functions |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for m in modules:
        lines.append(f"| {m.module} | {m.lines} | {m.type_ignores} | {m.classes} | {m.functions} |")
    lines += [
        f"| **total** | {sum(m.lines for m in modules)} | {sum(m.type_ignores for m in modules)} "
        f"| {sum(m.classes for m in modules)} | {sum(m.functions for m in modules)} |",
        "",
        f"### Functions longer than {long} lines",
        "",
        "| function | lines |",
        "| --- | ---: |",
    ]
    for n, name in sorted(longest, key=lambda x: (-x[0], x[1])):
        lines.append(f"| {name} | {n} |")
    if not longest:
        lines.append("| (none) | |")
    top = ", ".join(f"{name} {n}" for n, name in sorted(every, key=lambda x: (-x[0], x[1]))[:3])
    lines += ["", f"Longest three: {top}."]
    lines += ["", "Instance fields, per class:", ""]
    for c in classes:
        lines.append(f"- {c.module}.{c.name}: {', '.join(sorted(c.fields)) or '-'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="A checkout (default: this one).")
    parser.add_argument("--long", type=int, default=60, help="List functions longer than this.")
    args = parser.parse_args(argv)
    print(render(args.tree.resolve(), args.long))
    return 0


if __name__ == "__main__":
    sys.exit(main())
