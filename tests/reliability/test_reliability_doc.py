"""RELIABILITY.md names a test for every fault it says is handled: each must exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cited_tests() -> list[tuple[str, str]]:
    """(file, test) for every `file.py::name` and following `::name` of the document."""
    cited = []
    for line in (ROOT / "RELIABILITY.md").read_text().splitlines():
        current = None
        for file, name in re.findall(r"`(?:([\w/]+\.py))?::(\w+)`", line):
            current = file or current
            assert current, f"a `::{name}` with no file before it: {line}"
            cited.append((current, name))
    return cited


def test_every_test_reliability_md_cites_exists():
    cited = cited_tests()
    assert len(cited) > 20
    missing = [
        f"{file}::{name}"
        for file, name in cited
        if not re.search(rf"^(async )?def {name}\(", (ROOT / "tests" / file).read_text(), re.M)
    ]
    assert missing == []


def test_the_readme_links_it():
    assert "RELIABILITY.md" in (ROOT / "README.md").read_text()
