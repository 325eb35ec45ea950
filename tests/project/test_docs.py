"""The docs a newcomer walks: a short README; links that resolve, and no pointer (in code or
docs) to a page or a design document that is not there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE_DIRS = ("bench", "cts", "scripts", "tests")


def code_files() -> list[Path]:
    return [p for d in CODE_DIRS for p in sorted((ROOT / d).rglob("*.py"))]


def test_the_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    text = "\n".join(lines)
    for command in ("make demo", "make test", "docs/architecture.md", "RELIABILITY.md"):
        assert command in text


def test_every_relative_link_of_the_readme_and_docs_resolves():
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} → {target}")
    assert broken == []


def test_every_docs_page_the_code_names_exists():
    named = {
        (path.relative_to(ROOT), page)
        for path in code_files()
        for page in re.findall(r"docs/([\w-]+\.md)", path.read_text())
    }
    assert named, "the code names no docs page any more: is this test still needed?"
    assert [(str(p), page) for p, page in named if not (ROOT / "docs" / page).exists()] == []


def test_no_reference_to_the_design_document_or_to_readme_sections_is_left():
    marker = "DESIGN " + "§"  # split, so this file does not name it itself
    old = "README" + ","
    found = [
        str(p.relative_to(ROOT))
        for p in [*code_files(), *PAGES]
        if marker in p.read_text() or old in p.read_text()
    ]
    assert found == []
