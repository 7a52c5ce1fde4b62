"""SPECS detail units (Chen et al., 2025, "SPECS: Specificity-Enhanced CLIP-Score for
Long Image Caption Evaluation", section 4.2 and appendix A).

A caption is cut into *detail units* with POS tags (spaCy, Penn tags) and a chunk
grammar applied as a cascade on node sequences (NLTK ``RegexpParser`` order: each
rule sees the chunks of the rules before it). Three grammars (``grammar=``):

``"paper"`` -- App. A exactly::

    NP:     {<DT>?<JJ.*>*<NN.*>+}
    VP:     {<VB.*><NP|PP|CLAUSE>+$}
    PP:     {<IN><NP>}
    CLAUSE: {<NP><VP>}

``"capscore"`` (default) -- capscore's extension of it::

    NP:     {<DT>?<JJ>*<NN.*>+}            (also PRP$/CD/PDT determiners, CD/VBN adjectives, PRP)
    VP:     {<RB>*<VB.*>+<RB|VB.*>*<NP|JJ>*}
    PP:     {<RB>?<IN|TO><NP>}
    CLAUSE: {<NP><VP>}
    CONJ:   {<CC><NP|VP|PP|CLAUSE>+}

Why capscore's differs (``docs/papers.md``, SPECS table): the paper's VP is
anchored with ``$`` to the end of the sentence, and when it runs only NPs exist, so
a verb phrase is chunked only when nothing but noun phrases follows the verb up to
the sentence end -- never in a sentence that ends with a period -- and a caption's
verbs, adverbs, numbers and possessives then fall outside every chunk and run on
into the next unit.

``"reference"`` -- the SPECS authors' chunker (github mbzuai-nlp/SPECS,
``data/preprocessing/chunk_preprocessing.py``, used by their ``create_dci.py``)::

    NP:     {<DT>?<JJ>*<NN|NNS|NNP|NNPS>+}
    VP:     {<VB.*><NP|PP|CLAUSE>*}        (only NPs exist when it runs: a verb and its noun objects)
    PP:     {<IN><NP>}
    CLAUSE: {<NP><VP>}
    CONJ:   {<CC><NP|VP|PP|CLAUSE>+}

with its own post-processing instead of the rules below: no cut next to a token that begins or ends
with "."; then, left to right, a cut is removed when (1) the words since the last "." (kept cuts
count as words) are one to three and start with "The", (2) the next word is one of
:data:`REFERENCE_JOIN_WORDS` ("behind in under on to above left right next up down out of 's is",
case-sensitive), or (3) the words since the last "." start with one of them (any case) and contain
neither "is" nor "are"; finally every "." character ends a unit, inside a number or an abbreviation
too ("3.5" -> "3." | "5 ..."). Rules (1) and (3) need a "." before the cut, so they never apply in a
caption's first sentence. Differences from running the authors' script: spaCy's sentences, tokens and
tags instead of NLTK's punkt, ``word_tokenize`` and perceptron tagger; and units are spans of the
caption (its own spacing: "sofa.", "cat's") where theirs re-join tokens with spaces ("sofa .",
"cat 's"). On the same tokens and tags the units are the authors' (the check against their code:
``docs/research/specs-detail-units.md``). ``max_attached_pps`` does not apply to it.

A unit closes after each top-level NP, VP, PP or CLAUSE (a CONJ, like loose
tokens, runs on into the next unit, as in the reference chunker); sentences
always close a unit. The order NP, VP, PP follows the reference's NLTK cascade,
where a VP can take noun objects but not prepositional phrases (they are not
built yet when the VP rule runs).

Then (``capscore`` and ``paper``) the paper's three rules, which all *merge* (we prefer missed
splits to wrong ones):

1. a sentence-initial noun phrase starting with "The" is not split off;
2. a prepositional phrase is not split from what precedes it. "of" phrases
   always stay (they complete a noun phrase); other PPs attach while the
   preceding unit holds fewer than ``max_attached_pps`` (1) of them, so a chain
   of PPs ends a unit where attachment becomes ambiguous. This is our reading
   of the paper's example "A front view of a statue on cement | in a park.";
3. a segment led by a prepositional phrase is not split from what follows
   unless it contains a verb (App. A / §4.2: "segments which start with a
   prepositional phrase", e.g. "To the left of the car | there is a box") --
   sentence-initially and anywhere else. A PP-led segment mid-sentence is one
   that rule 2 left unattached (the cap); rule 3 runs after rule 2 there, so a PP
   first attaches backwards to the noun phrase it modifies and only a PP that
   stays on its own joins the context that follows (repeatedly, until the merged
   unit contains a verb or nothing follows).

Units with no content word (noun, verb, adjective, number, pronoun) are merged
into their neighbour. Each unit is a span of the original caption, so prefixes
(unit 1..k) are exact substrings.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from capscore.errors import param_error
import capscore.nlp

SPACY_MODEL = None  # capscore.nlp chooses: $CAPSCORE_SPACY_MODEL, en_core_web_sm, or the PyPI re-upload

# Penn tag -> one-letter class used by the cascade regexes.
_CLASS = {
    **dict.fromkeys(["DT", "PDT", "PRP$", "WP$"], "D"),
    **dict.fromkeys(["JJ", "JJR", "JJS", "CD"], "A"),
    **dict.fromkeys(["NN", "NNS", "NNP", "NNPS"], "N"),
    "PRP": "R",
    **dict.fromkeys(["IN", "TO"], "P"),
    **dict.fromkeys(["VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "MD"], "V"),
    **dict.fromkeys(["RB", "RBR", "RBS", "RP"], "B"),
    "CC": "C",
}
# Cascade: (label char, regex over node chars). Leaves are upper case, chunks lower case.
_CASCADE = (
    ("n", r"[D]*[AV]*N+|[D]*A+(?=N)N+|R"),
    ("v", r"B*V[BV]*(?:n|A)*"),
    ("p", r"B?Pn"),
    ("s", r"nv"),
    ("c", r"C[npvs]+"),
)
# App. A as printed: DT only as determiner, JJ.* adjectives, VB.* verbs, IN prepositions.
_CLASS_PAPER = {
    "DT": "D",
    **dict.fromkeys(["JJ", "JJR", "JJS"], "A"),
    **dict.fromkeys(["NN", "NNS", "NNP", "NNPS"], "N"),
    "IN": "P",
    **dict.fromkeys(["VB", "VBD", "VBG", "VBN", "VBP", "VBZ"], "V"),
}
_CASCADE_PAPER = (
    ("n", r"D?A*N+"),
    ("v", r"V[nps]+$"),  # <VB.*><NP|PP|CLAUSE>+$ ; only NPs exist when it runs
    ("p", r"Pn"),
    ("s", r"nv"),
)
# The authors' chunker (data/preprocessing/chunk_preprocessing.py): JJ exactly, NN.* nouns, VB.* verbs, IN
# prepositions, CC; its VP takes what exists when it runs (noun phrases), then PP, CLAUSE, CONJ.
_CLASS_REFERENCE = {
    "DT": "D", "JJ": "A",
    **dict.fromkeys(["NN", "NNS", "NNP", "NNPS"], "N"),
    "IN": "P",
    **dict.fromkeys(["VB", "VBD", "VBG", "VBN", "VBP", "VBZ"], "V"),
    "CC": "C",
}
_CASCADE_REFERENCE = (
    ("n", r"D?A*N+"),
    ("v", r"Vn*"),  # <VB.*><NP|PP|CLAUSE>* ; only NPs exist when it runs
    ("p", r"Pn"),
    ("s", r"nv"),
    ("c", r"C[npvs]+"),
)
GRAMMARS = {"capscore": (_CLASS, _CASCADE), "paper": (_CLASS_PAPER, _CASCADE_PAPER),
            "reference": (_CLASS_REFERENCE, _CASCADE_REFERENCE)}
#: Words before which the authors' post-processing never splits (case-sensitive), and which, leading a
#: later sentence (any case), keep it in one unit until "is" or "are" appears.
REFERENCE_JOIN_WORDS = frozenset("behind in under on to above left right next up down out of 's is".split())
_CLOSING = set("npvs")
_CONTENT_POS = {"NOUN", "PROPN", "VERB", "ADJ", "NUM", "PRON", "AUX"}


@dataclass(frozen=True)
class _Node:
    label: str
    start: int  # token index, inclusive
    end: int  # exclusive


@dataclass
class _Seg:
    start: int
    end: int
    first: str  # label of the first node
    has_verb: bool
    pps: int = 0  # non-"of" PPs attached by rule 2


def load_parser(name: str | None = SPACY_MODEL):
    return capscore.nlp.load_spacy(name, disable=("ner", "lemmatizer"))


def _chunk(tags: list[str], grammar: str = "capscore") -> list[_Node]:
    """Run the cascade over one sentence's Penn tags -> top-level nodes."""
    classes, cascade = GRAMMARS[grammar]
    nodes = [_Node(classes.get(t, "X"), i, i + 1) for i, t in enumerate(tags)]
    for label, pattern in cascade:
        s = "".join(n.label for n in nodes)
        out, last = [], 0
        for m in re.finditer(pattern, s):
            if m.end() == m.start():
                continue
            out += nodes[last : m.start()]
            out.append(_Node(label, nodes[m.start()].start, nodes[m.end() - 1].end))
            last = m.end()
        nodes = out + nodes[last:]
    return nodes


def detail_units(caption: str, *, nlp=None, max_attached_pps: int = 1, grammar: str = "capscore") -> list[str]:
    """Split ``caption`` into SPECS detail units (see module docstring)."""
    return [caption[a:b] for a, b in detail_unit_spans(caption, nlp=nlp, max_attached_pps=max_attached_pps,
                                                       grammar=grammar)]


def detail_unit_spans(caption: str, *, nlp=None, max_attached_pps: int = 1,
                      grammar: str = "capscore") -> list[tuple[int, int]]:
    """Character spans (start, end) of the detail units; they tile the caption (minus outer spaces)."""
    if grammar not in GRAMMARS:
        raise param_error("grammar", "detail_units", "'capscore', 'paper' (App. A) or 'reference' (the authors' "
                          "chunker)", grammar)
    doc = (nlp or load_parser())(caption)
    if grammar == "reference":
        return _reference_spans(caption, doc)
    spans: list[tuple[int, int]] = []
    for sent in doc.sents:
        toks = list(sent)
        if not toks:
            continue
        segs = _segment_sentence(toks, max_attached_pps, grammar)
        for j in range(1, len(segs)):  # leading punctuation (", a table") belongs to the unit before
            while segs[j].start < segs[j].end - 1 and toks[segs[j].start].is_punct:
                segs[j].start += 1
                segs[j - 1].end += 1
        for seg in segs:
            a = toks[seg.start].idx
            b = toks[seg.end - 1].idx + len(toks[seg.end - 1].text)
            spans.append((a, b))
    return spans


def _segment_sentence(toks, max_attached_pps: int, grammar: str = "capscore") -> list[_Seg]:
    nodes = _chunk([t.tag_ for t in toks], grammar)
    segs: list[_Seg] = []
    cur: list[_Node] = []

    def close():
        if cur:
            has_verb = any(toks[i].pos_ in ("VERB", "AUX") for n in cur for i in range(n.start, n.end))
            segs.append(_Seg(cur[0].start, cur[-1].end, cur[0].label, has_verb))
            cur.clear()

    for n in nodes:
        cur.append(n)
        if n.label in _CLOSING:
            close()
    close()

    def is_pp(seg: _Seg) -> bool:
        return seg.first == "p"

    def merge(i: int) -> None:  # segs[i] absorbs segs[i + 1]
        a, b = segs[i], segs[i + 1]
        segs[i] = _Seg(a.start, b.end, a.first, a.has_verb or b.has_verb, a.pps + b.pps)
        del segs[i + 1]

    # Rule 3: a leading PP without a verb stays with what follows.
    while len(segs) > 1 and is_pp(segs[0]) and not segs[0].has_verb:
        merge(0)
    # Rule 1: a sentence-initial "The ..." noun phrase is not split off.
    if len(segs) > 1 and toks[segs[0].start].text == "The" and not segs[0].has_verb:
        merge(0)
    # Rule 2: PPs stay with the unit before them ("of" always; others up to the cap).
    i = 1
    while i < len(segs):
        seg = segs[i]
        if is_pp(seg):
            lead = next(toks[k] for k in range(seg.start, seg.end) if toks[k].tag_ in ("IN", "TO"))
            is_of = lead.lower_ == "of"
            if is_of or segs[i - 1].pps < max_attached_pps:
                if not is_of:
                    segs[i - 1].pps += 1
                merge(i - 1)
                continue
        i += 1
    # Rule 3 beyond the sentence start: a PP-led unit rule 2 left on its own joins what follows.
    i = 1
    while i < len(segs) - 1:
        if is_pp(segs[i]) and not segs[i].has_verb:
            merge(i)
            continue
        i += 1
    # Units without a content word (punctuation, a lone conjunction) join a neighbour.
    i = 0
    while len(segs) > 1 and i < len(segs):
        seg = segs[i]
        if not any(toks[k].pos_ in _CONTENT_POS for k in range(seg.start, seg.end)):
            merge(i - 1 if i > 0 else i)
            continue
        i += 1
    return segs


# ----------------------------------------------------------------------------- the authors' chunker
def _reference_spans(caption: str, doc) -> list[tuple[int, int]]:
    """Detail units as the SPECS authors' chunker cuts them (see the module docstring, ``"reference"``)."""
    words: list[tuple[int, str]] = []  # (character offset, text) of every token that is not whitespace
    ends: set[int] = set()  # word indices where a chunker segment ends (a "|" before that word)
    for sent in doc.sents:
        toks = [t for t in sent if not t.is_space]
        if not toks:
            continue
        base = len(words)
        words += [(t.idx, t.text) for t in toks]
        ends |= {base + n.end for n in _chunk([t.tag_ for t in toks], "reference") if n.label in _CLOSING}
        ends.add(base + len(toks))  # the rest of the sentence is a segment of its own
    # no cut next to a token that ends or starts with "." (the sentence split below cuts there)
    bars = sorted(b for b in ends if 0 < b < len(words)
                  and not (words[b - 1][1].endswith(".") or words[b][1].startswith(".")))
    kept: list[int] = []
    for b in bars:
        if not _reference_joins(words, b, set(kept)):
            kept.append(b)
    cuts = {words[b][0] for b in kept} | {i + 1 for i, ch in enumerate(caption) if ch == "."}
    spans, start = [], 0
    for cut in sorted(cuts | {len(caption)}):
        piece = caption[start:cut]
        if piece.strip():
            a = start + len(piece) - len(piece.lstrip())
            spans.append((a, a + len(piece.strip())))
        start = cut
    return spans


def _reference_joins(words: list[tuple[int, str]], b: int, kept: set[int]) -> bool:
    """Whether the authors' post-processing removes the cut before word ``b``. ``kept``: the cuts to its left
    that stay. Their three rules: (1) the words since the last "." (kept cuts count as words) are 1-3 and
    start with "The"; (2) the next word is one of :data:`REFERENCE_JOIN_WORDS`; (3) the words since the last
    "." start with one of them (any case) and hold neither "is" nor "are". Rules 1 and 3 need a "." before
    the cut, so they never apply in a caption's first sentence."""
    if words[b][1] in REFERENCE_JOIN_WORDS:
        return True
    dot = next((k for k in range(b - 1, -1, -1) if "." in words[k][1]), None)
    if dot is None:
        return False
    tail = words[dot][1].rsplit(".", 1)[1]
    since = [tail] if tail else []
    for k in range(dot + 1, b):
        since += ["|", words[k][1]] if k in kept else [words[k][1]]
    if not since:
        return False
    if len(since) <= 3 and since[0] == "The":
        return True
    return since[0].lower() in REFERENCE_JOIN_WORDS and "is" not in since and "are" not in since
