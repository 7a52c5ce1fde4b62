"""Language-agnostic word units for perturbations.

PR-MCS perturbs *words*. For languages written with spaces (English, German,
Korean, ...) a word is a whitespace-separated token. Japanese and Chinese are
written without spaces, so there a "word" is either one character (default,
needs nothing installed) or a parser token when the caller passes a tokenizer
(e.g. a spaCy/SudachiPy pipeline: ``tokenizer=lambda s: [t.text for t in nlp(s)]``).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from capscore.errors import param_error

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uff66-\uff9f]")

Tokenizer = Callable[[str], Sequence[str]]


@dataclass(frozen=True)
class Words:
    """A caption split into word units, with the separator that joins them back."""

    units: tuple[str, ...]
    sep: str  # " " for spaced scripts, "" for Japanese/Chinese

    def join(self, units: Sequence[str]) -> str:
        return self.sep.join(u for u in units if u != "")


def is_unspaced(text: str) -> bool:
    """True for text in a script without word spaces (contains CJK and no whitespace)."""
    return bool(_CJK.search(text)) and not any(ch.isspace() for ch in text.strip())


def split_words(text: str, *, mode: str = "auto", tokenizer: Tokenizer | None = None) -> Words:
    """Split ``text`` into word units.

    mode: ``"auto"`` (characters for unspaced CJK text, whitespace otherwise),
    ``"space"`` (whitespace), ``"char"`` (characters, whitespace dropped).
    A ``tokenizer`` (text -> tokens) overrides the mode for unspaced text and is
    used as given for spaced text too (joined back with single spaces).
    """
    if mode not in ("auto", "space", "char"):
        raise param_error("mode", "split_words", "'auto', 'space' or 'char'", mode)
    unspaced = mode == "char" or (mode == "auto" and is_unspaced(text))
    if tokenizer is not None:
        toks = tuple(t for t in (str(x).strip() for x in tokenizer(text)) if t)
        return Words(toks, "" if unspaced else " ")
    if unspaced:
        return Words(tuple(ch for ch in text if not ch.isspace()), "")
    return Words(tuple(text.split()), " ")
