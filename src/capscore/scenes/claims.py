"""What a caption states: small frozen claim types and the atomic facts they assert.

Captions are *generated from* claims (see :mod:`capscore.scenes.lexicon`), so every
caption knows exactly which facts it states in every language; the oracle compares
those facts with the facts of the scene graph.

Atomic facts (tuples):
  ("obj", shape, color)               an object of this shape and colour exists
  ("count", shape, color, n)          exactly n of them
  ("size", shape, color, size)        ("pattern", shape, color, pattern)
  ("rel", key_a, rel, key_b)          canonical: "left of"/"above"/"next to" only
                                      ("right of"/"below" are stored as their converses,
                                      "next to" with sorted keys)
  ("where", shape, color, region)     ("motion", shape, color, direction)
  ("total", n)                        the scene holds n objects
"""
from __future__ import annotations

from dataclasses import dataclass

CONVERSE = {"left of": "right of", "right of": "left of", "above": "below", "below": "above", "next to": "next to"}


@dataclass(frozen=True)
class Mention:
    shape: str
    color: str
    count: int = 1
    size: str | None = None
    pattern: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.shape, self.color)

    def bare(self) -> "Mention":
        """The same referent without size/pattern (as in "the red circle")."""
        return Mention(self.shape, self.color, self.count)

    def facts(self) -> set[tuple]:
        s, c = self.key
        out = {("obj", s, c), ("count", s, c, self.count)}
        if self.size is not None:
            out.add(("size", s, c, self.size))
        if self.pattern is not None:
            out.add(("pattern", s, c, self.pattern))
        return out


@dataclass(frozen=True)
class Relation:
    a: Mention
    rel: str
    b: Mention

    def converse(self) -> "Relation":
        return Relation(self.b, CONVERSE[self.rel], self.a)

    def facts(self) -> set[tuple]:
        return self.a.facts() | self.b.facts() | {relation_fact(self.a.key, self.rel, self.b.key)}


def relation_fact(a: tuple[str, str], rel: str, b: tuple[str, str]) -> tuple:
    if rel == "right of":
        return ("rel", b, "left of", a)
    if rel == "below":
        return ("rel", b, "above", a)
    if rel == "next to":
        lo, hi = sorted([a, b])
        return ("rel", lo, "next to", hi)
    return ("rel", a, rel, b)


@dataclass(frozen=True)
class Total:
    n: int

    def facts(self) -> set[tuple]:
        return {("total", self.n)}


@dataclass(frozen=True)
class Where:
    m: Mention
    region: str

    def facts(self) -> set[tuple]:
        return self.m.facts() | {("where", *self.m.key, self.region)}


@dataclass(frozen=True)
class Motion:
    m: Mention
    direction: str

    def facts(self) -> set[tuple]:
        return self.m.facts() | {("motion", *self.m.key, self.direction)}


# Forms of a unit (one sentence or phrase):
#   "picture"    noun-phrase caption listing mentions ("A picture of two red circles and ...")
#   "relphrase"  noun-phrase caption with one relation ("A red circle to the left of a blue square.")
#   "total"      "The image shows four objects."
#   "exists"     "There is a large red striped circle." / "There are two blue squares."
#   "relation"   "The red circle is to the left of the blue square."
#   "where"      "The red circle is in the top left corner."
#   "motion"     "The red circle moves left and the two blue squares move up."
FORMS = ("picture", "relphrase", "total", "exists", "relation", "where", "motion")


@dataclass(frozen=True)
class Unit:
    form: str
    claims: tuple

    def facts(self) -> set[tuple]:
        out: set[tuple] = set()
        for c in self.claims:
            out |= c.facts()
        return out
