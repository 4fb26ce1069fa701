"""The docs site and the README: the settings page is generated, every example runs or compiles.

Every ``python`` block of README.md and docs/ is either a file of ``examples/`` included as
it is (``--8<-- "path"``, checked to exist here and by ``mkdocs build --strict``) or
compiled here, and each name it imports from ``celery_election`` must exist: a renamed API
breaks this test, not a reader. The Settings page's table is rendered from
``settings.SETTINGS`` by the build's hook (docs/hooks/settings_table.py), never copied by
hand; with the docs extra installed (``pip install -e '.[docs]'``) the site is built here
and its settings page checked for every setting. ``scripts/docs`` (run by .ci/run) does
the same build and check.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from celery_election.settings import RETIRED, SETTINGS, settings_table

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.parts)
SNIPPET = re.compile(r'^\s*--8<--\s+"([^"]+)"\s*$')
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.M | re.S
)


def python_blocks() -> list[tuple[str, str]]:
    """(where, source) of every ```python block of README.md and docs/, snippets resolved."""
    blocks = []
    for page in [ROOT / "README.md", *PAGES]:
        text = page.read_text()
        for n, m in enumerate(FENCE.finditer(text), 1):
            if m.group("lang") != "python":
                continue
            indent = m.group("indent")
            lines = [line.removeprefix(indent) for line in m.group("body").splitlines()]
            resolved = []
            for line in lines:
                include = SNIPPET.match(line)
                if include:
                    resolved.append((ROOT / include.group(1)).read_text())
                else:
                    resolved.append(line + "\n")
            blocks.append((f"{page.relative_to(ROOT)} block {n}", "".join(resolved)))
    return blocks


BLOCKS = python_blocks()


def test_the_site_has_the_pages_the_issue_names() -> None:
    names = {p.relative_to(DOCS).as_posix() for p in PAGES}
    assert {
        "index.md",
        "getting-started.md",
        "workers.md",
        "beat.md",
        "schedule.md",
        "failover.md",
        "deployment.md",
        "settings.md",
        "operations.md",
        "testing.md",
        "without-celery.md",
        "api.md",
        "design.md",
        "benchmarks/index.md",
        "changelog.md",
    } <= names
    assert len(BLOCKS) >= 15, [w for w, _ in BLOCKS]


def test_every_included_file_exists() -> None:
    for page in [ROOT / "README.md", *PAGES]:
        for line in page.read_text().splitlines():
            include = SNIPPET.match(line)
            if include:
                assert (ROOT / include.group(1)).is_file(), (page, line)


@pytest.mark.parametrize(("where", "source"), BLOCKS, ids=[w for w, _ in BLOCKS])
def test_every_python_example_compiles_and_imports_real_names(where: str, source: str) -> None:
    tree = compile(source, where, "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    compile(source, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("celery_election"):
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                assert hasattr(module, alias.name), f"{where}: {node.module}.{alias.name}"


def test_the_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    # the two commands CI and newcomers run
    assert "scripts/demo " in readme
    assert "scripts/test " in readme
    for extra in ("postgres", "psycopg2", "mysql", "mysqlclient", "metrics"):
        assert f"`{extra}`" in readme
    # every link into the site points at a page that exists
    for target in re.findall(r"\]\(((?:docs/|CHANGELOG)[^)#]*)", readme):
        assert (ROOT / target).is_file(), target


# -- the settings page: generated from SETTINGS ----------------------------------------------


def load_hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "settings_table_hook", DOCS / "hooks" / "settings_table.py"
    )
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    return hook


class _Page:
    class file:  # mkdocs: page.file.src_uri
        src_uri = "settings.md"


def test_the_settings_page_is_rendered_from_the_one_definition() -> None:
    """docs/settings.md holds markers, not a copy; the build's hook puts the table in."""
    source = (DOCS / "settings.md").read_text()
    assert "| `election_" not in source, "the settings table is generated: do not copy it"
    rendered = load_hook().on_page_markdown(source, page=_Page(), config=None, files=None)
    assert settings_table() in rendered
    for name in RETIRED:
        assert f"`{name}`" in rendered
    assert "<!--" not in rendered


def missing_settings(html: str) -> list[str]:
    """The settings of ``SETTINGS`` that a built settings page does not name."""
    return [s.name for s in SETTINGS if f"<code>{s.name}</code>" not in html]


def test_the_built_site_names_every_setting(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    pytest.importorskip("material", reason="the docs extra: pip install -e '.[docs]'")
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(tmp_path)],
        cwd=ROOT,
        check=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    html = (tmp_path / "settings" / "index.html").read_text()
    assert missing_settings(html) == []
    deployment = (tmp_path / "deployment" / "index.html").read_text()
    for supported in ("3.10", "5.3", "2.0.30", "psycopg2", "mysqlclient", "eventlet", "Redis"):
        assert supported in deployment


def test_mermaid_diagrams_avoid_what_breaks_their_rendering() -> None:
    """Mermaid ends a statement at ';' and a gantt task's name at ':' (the diagram is then
    left as code, and mkdocs --strict cannot see it)."""
    for page in PAGES:
        for m in FENCE.finditer(page.read_text()):
            if m.group("lang") != "mermaid":
                continue
            body = m.group("body")
            assert ";" not in body, page
            if body.lstrip().startswith("gantt"):
                for line in body.splitlines()[1:]:
                    words = line.strip().split()
                    if words and words[0] not in ("title", "dateFormat", "axisFormat", "section"):
                        assert line.count(":") == 1, (page, line)
