"""Code, docstrings and the bundled documents say what things are and measure, not which tracker issue asked for
them (history goes to docs/research/)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ISSUE = re.compile(r"\bissue[- ]\d", re.I)  # "issue 11", "issue-11"; a third party's "issue #2883" is a citation


def test_no_issue_numbers_in_the_package_benchmarks_or_experiments():
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for folder in ("src", "benchmarks", "experiments")
             for p in sorted((ROOT / folder).rglob("*")) if p.suffix in (".py", ".md", ".toml", ".txt")
             for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
             if ISSUE.search(line)]
    assert found == []
