"""Every relative link in README.md and docs/**/*.md points to a file that exists, and every #anchor into a
markdown file names one of its headings (GitHub's heading ids), so moving a page or renaming a section
cannot leave a dead link behind.

Links inside fenced code blocks and inline code spans are not links and are skipped; links with a scheme
(https:, mailto:) are not checked (no network here).
"""
from __future__ import annotations

import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def _prose_lines(text: str):
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def slug(heading: str) -> str:
    """GitHub's id for a heading's text: markdown links and code marks reduced to their text, lower case,
    every character but letters, digits, marks, '-', '_' and spaces dropped, spaces turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    kept = "".join(ch for ch in text
                   if ch.isalnum() or ch in "-_ " or unicodedata.category(ch).startswith("M"))
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The ids of a markdown file's headings; a repeated id gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in _prose_lines(text):
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        k = seen.get(base, 0)
        seen[base] = k + 1
        out.add(base if k == 0 else f"{base}-{k}")
    return out


def broken_links(path: Path, root: Path) -> list[str]:
    """'file:line: target (why)' for each relative link of ``path`` that does not resolve."""
    text = path.read_text(encoding="utf-8")
    bad = []
    for n, line in _prose_lines(text):
        for target in _LINK.findall(_CODE_SPAN.sub("", line)):
            if _SCHEME.match(target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(root)}:{n}: {target}"
            if not dest.exists():
                bad.append(f"{where} (no such file)")
            elif root not in dest.parents and dest != root:
                bad.append(f"{where} (outside the repository)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
                bad.append(f"{where} (no heading with that id)")
    return bad


def doc_files(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def test_every_relative_link_in_the_docs_resolves():
    files = doc_files(ROOT)
    assert len(files) > 10  # README and the docs tree were found
    bad = [b for f in files for b in broken_links(f, ROOT)]
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_slug_matches_githubs_heading_ids():
    # ids as GitHub renders them for headings of this repository's docs (derived by hand from its rule)
    assert slug("Text priors and minimal pairs: the blind and paired columns of `scenes eval`") == \
        "text-priors-and-minimal-pairs-the-blind-and-paired-columns-of-scenes-eval"
    assert slug("Retrieval and zero-shot classification") == "retrieval-and-zero-shot-classification"
    assert slug("(1) LongCLIP stretch + long-caption fine-tuning, then SPECS") == \
        "1-longclip-stretch--long-caption-fine-tuning-then-specs"
    assert slug("From docs/papers.md") == "from-docspapersmd"
    assert slug("`capscore reproduce` and `capscore doctor`") == "capscore-reproduce-and-capscore-doctor"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n### A\n") == {"a", "a-1", "a-2"}


def test_a_dead_link_or_anchor_is_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## Real section\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "# Page\n\n"
        "[ok](other.md) [ok anchor](other.md#real-section) [self](#page) [web](https://example.org/x)\n"
        "[gone](missing.md) [bad anchor](other.md#no-such-section)\n"
        "`[in code](missing.md)`\n"
        "```\n[in a fence](missing.md)\n```\n"
    )
    assert broken_links(page, tmp_path) == [
        "docs/page.md:4: missing.md (no such file)",
        "docs/page.md:4: other.md#no-such-section (no heading with that id)",
    ]
