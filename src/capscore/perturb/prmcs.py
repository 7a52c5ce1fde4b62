"""PR-MCS text perturbations (Kim et al., 2023, "PR-MCS: Perturbation Robust Metric
for MultiLingual Image Captioning", section 5.2 and Algorithm 1).

Five word-level perturbations produce captions that a robust metric should score
*below* the original:

============  ===============================================================
repetition    each drawn word is repeated ("a dog runs" -> "a a dog runs")
removal       only the drawn words are kept (Algorithm 1; see below)
masking       each drawn word becomes a mask token (``mask``, default "[MASK]")
jumble        all words are shuffled (the order must change)
substitution  the positions of critical objects are swapped ("a dog chases a
              cat" -> "a cat chases a dog"): the caller's critical objects when
              the data has them, otherwise, for English only, the nouns spaCy
              finds
============  ===============================================================

Substitution follows Algorithm 1's ``sub_in_sent``: the list of critical objects
is shuffled until its order changes, then for j = 1..n the *last* occurrence of
object j in the current caption is replaced by shuffled object j --
``shuffled[j].join(target.rsplit(objects[j], 1))``: once per object, in sequence,
each step seeing the previous steps' result (so a word a step inserted can be
replaced again by a later step, as in the algorithm). The paper's Fig. 12 (FR),
Fig. 13 (DE) and Fig. 14 (JA) substitution captions are reproduced exactly by this
rule. A list
with fewer than two distinct objects leaves the caption unchanged (Algorithm 1:
``len(critical_obj_list) < 2``), and so does a replacement that happens to give
back the original caption. One deviation: in spaced scripts an object matches
whole words only ("cat" is not replaced inside "category"); ``str.rsplit`` in
Algorithm 1 matches substrings, which garbles the longer word. Unspaced text
(Japanese) matches substrings, as the algorithm does.

Without critical objects (§5.2: "In the remaining datasets, nouns in the caption
are extracted"), the distinct nouns of the caption in order of appearance are the
objects -- parsed with spaCy's *English* model, so only for English captions: a
caption whose ``lang`` is another language (or that is written without spaces)
is never parsed with it (its articles would come out as nouns: "eine Frau sitzt
an einem Tisch" -> "einem Tisch sitzt an einem Frau"). Such a caption is
not perturbable, with the reason (no critical objects in the data, no parser for
its language), unless the caller passes a parser for that language (``nlp``).
A caption without ``lang`` is taken as English.

Selection (repetition, removal, masking) follows Algorithm 1 (``rep_rem_mask``)
draw for draw: the three perturbations share ONE generator and so one draw per
word; word j is *drawn* when ``rng.random() > threshold``, and when it is not,
Algorithm 1's ``elif random.random() > threshold`` consumes a second number (its
result is unused, but it shifts every later draw, so we make it too). The rate
``p`` is P(drawn) = 1 - threshold: §5.2 says "each word token ... with a
probability of 0.4", so ``p = 0.4`` (threshold 0.6). A drawn word is repeated
(repetition) and masked (masking); for removal Algorithm 1 appends the *drawn*
words to the removal caption, i.e. removal **keeps** the drawn ~40% and deletes
the other ~60% (``removal="keep-drawn"``, default). Fig. 5 agrees with the
algorithm: its removal caption "man, white and shorts, is playing a green trees
a" is exactly the 10 of 26 words that its masking caption masks (16 deleted,
62%). §5.2's prose, "some word tokens are removed ... Each word token is drawn
with a probability of 0.4", reads as deleting the drawn 40%:
``removal="drop-drawn"``.

Choices exposed as parameters:

* ``ensure_change=False`` (Algorithm 1): a caption with no drawn word stays as it
  is (Algorithm 1 emits it unchanged; for removal it emits an empty string).
  ``True`` (capscore's earlier default) draws one word uniformly instead.
* A perturbation that leaves a caption unchanged (nothing drawn, one word to
  jumble, fewer than two distinct critical objects) yields a :class:`Perturbed`
  with ``text=None``, ``unchanged=True`` and a ``reason``: Algorithm 1 would emit
  the original caption, so the probe's percentage drop counts it with its own
  score (Table 2's definition) and its robust rate leaves it out; both count it.
  Removal of every word (``text=None``, ``unchanged=False``) is only counted.

Determinism: every caption gets its own generator,
``random.Random(f"{seed}|rep_rem_mask|{caption}")`` for the three word-level
perturbations (shared, as in Algorithm 1) and ``f"{seed}|{kind}|{caption}"`` for
jumble and substitution (Python's string seeding is stable across runs and
platforms), so a caption's perturbation does not depend on the other captions or
their order. Jumble and substitution call ``rng.shuffle`` on the units, retrying
(at most 20 times) until the order changes (Algorithm 1's ``sub_in_sent`` retries
the same way; its ``jumble`` does not, and may return the caption unchanged).

Language-agnostic: words come from :func:`capscore.perturb.words.split_words`
(whitespace, or characters / parser tokens for Japanese).
"""
from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from capscore.errors import param_error, unknown_name
from capscore.perturb.words import Tokenizer, is_unspaced, split_words
import capscore.nlp

PERTURBATIONS: tuple[str, ...] = ("repetition", "removal", "masking", "jumble", "substitution")
DEFAULT_P = 0.4
DEFAULT_MASK = "[MASK]"
REMOVAL_MODES = ("keep-drawn", "drop-drawn")
_WORD_KINDS = ("repetition", "removal", "masking")
SPACY_MODEL = None  # capscore.nlp chooses: $CAPSCORE_SPACY_MODEL, en_core_web_sm, or the PyPI re-upload
_MAX_TRIES = 20


@dataclass(frozen=True)
class Perturbed:
    """One perturbation of one caption. ``text`` is None when it is not perturbable."""

    original: str
    kind: str
    text: str | None
    positions: tuple[int, ...] = ()  # word units (for substitution: indices of objects moved) that changed
    reason: str = ""
    seed: int = 0
    unchanged: bool = False  # text is None because the caption stays as it is (Algorithm 1 emits it)

    @property
    def ok(self) -> bool:
        return self.text is not None


def _rng(seed: int, kind: str, caption: str) -> random.Random:
    key = "rep_rem_mask" if kind in _WORD_KINDS else kind  # Algorithm 1: one draw per word for all three
    return random.Random(f"{seed}|{key}|{caption}")


def draws(n: int, p: float, rng) -> list[bool]:
    """Algorithm 1's draws for ``n`` words: word j is drawn when ``rng.random() > 1 - p``;
    an undrawn word consumes a second number (Algorithm 1's ``elif``)."""
    threshold = 1.0 - p
    out = []
    for _ in range(n):
        if rng.random() > threshold:
            out.append(True)
        else:
            rng.random()  # Algorithm 1: ``elif random.random() > threshold`` (result unused)
            out.append(False)
    return out


def _select(n: int, p: float, rng, ensure_change: bool) -> list[int]:
    chosen = [i for i, d in enumerate(draws(n, p, rng)) if d]
    if not chosen and ensure_change and n:
        chosen = [rng.randrange(n)]
    return chosen


def _not(caption: str, kind: str, reason: str, seed: int, *, unchanged: bool = True) -> Perturbed:
    return Perturbed(caption, kind, None, (), reason, seed, unchanged)


def _spacy(name: str | None):
    return capscore.nlp.load_spacy(name, disable=("ner", "lemmatizer"))


def _is_english(lang: str | None) -> bool:
    if lang is None:
        return True
    code = lang.strip().lower().replace("_", "-")
    return code in ("en", "eng", "english") or code.startswith("en-")


def _nouns(caption: str, nlp) -> list[str]:
    """The distinct nouns of ``caption``, in order of first appearance."""
    return list(dict.fromkeys(t.text for t in nlp(caption) if t.pos_ in ("NOUN", "PROPN")))


def _replace_last(text: str, old: str, new: str, *, whole_word: bool) -> str:
    """``new.join(text.rsplit(old, 1))`` (Algorithm 1), matching whole words only when ``whole_word``."""
    if not whole_word:
        return new.join(text.rsplit(old, 1))
    last = None
    for m in re.finditer(rf"(?<!\w){re.escape(old)}(?!\w)", text):
        last = m
    return text if last is None else text[: last.start()] + new + text[last.end() :]


def sub_in_sent(caption: str, objects: Sequence[str], shuffled: Sequence[str]) -> str:
    """Algorithm 1's replacement: for each j, the last occurrence of ``objects[j]`` in the caption
    as it stands after steps 1..j-1 becomes ``shuffled[j]``. Whole words in spaced text."""
    whole = not is_unspaced(caption)
    target = caption
    for old, new in zip(objects, shuffled):
        if old:
            target = _replace_last(target, old, new, whole_word=whole)
    return target


def perturb(
    caption: str,
    kind: str,
    *,
    p: float = DEFAULT_P,
    seed: int = 0,
    mask: str = DEFAULT_MASK,
    objects: Sequence[str] | None = None,
    lang: str | None = None,
    ensure_change: bool = False,
    removal: str = "keep-drawn",
    word_mode: str = "auto",
    tokenizer: Tokenizer | None = None,
    nlp: Callable | None = None,
    rng=None,
) -> Perturbed:
    """Apply one PR-MCS perturbation to ``caption`` (see the module docstring).

    ``objects``: critical objects for substitution, in the data's order (None: the
    caption's nouns, parsed with ``nlp`` or, for English only, the bundled English
    pipeline). ``lang``: the caption's language code; a non-English caption without
    objects and without an ``nlp`` is not perturbable by substitution (never parsed
    with the English model). ``rng``: any object with ``random()``/``randrange()``/
    ``shuffle()`` to use instead of the per-caption seeded generator.
    """
    if kind not in PERTURBATIONS:
        raise unknown_name("perturbation", kind, PERTURBATIONS)
    if not (0.0 <= p <= 1.0):
        raise param_error("p", "perturb", "a probability in [0, 1]", p)
    if removal not in REMOVAL_MODES:
        raise param_error("removal", "perturb", "'keep-drawn' (Algorithm 1) or 'drop-drawn' (§5.2 prose)", removal)
    rng = rng if rng is not None else _rng(seed, kind, caption)
    if kind == "substitution":
        return _substitute(caption, rng, seed=seed, objects=objects, nlp=nlp, lang=lang)
    words = split_words(caption, mode=word_mode, tokenizer=tokenizer)
    units = list(words.units)
    n = len(units)
    if n == 0:
        return _not(caption, kind, "empty caption", seed, unchanged=False)
    if kind == "jumble":
        if len(set(units)) < 2:
            return _not(caption, kind, "fewer than two distinct words to shuffle", seed)
        order = list(range(n))
        for _ in range(_MAX_TRIES):
            rng.shuffle(order)
            if [units[i] for i in order] != units:
                break
        new = [units[i] for i in order]
        if new == units:  # pragma: no cover - 20 failed shuffles of >= 2 distinct words
            return _not(caption, kind, "shuffling did not change the word order", seed)
        return Perturbed(caption, kind, words.join(new), tuple(i for i in range(n) if new[i] != units[i]), "", seed)
    chosen = _select(n, p, rng, ensure_change)
    if not chosen:
        if kind == "removal" and removal == "keep-drawn":  # Algorithm 1 would emit an empty caption
            return _not(caption, kind, f"no word drawn with p={p}: removal would leave an empty caption", seed,
                        unchanged=False)
        return _not(caption, kind, f"no word drawn with p={p}", seed)
    sel = set(chosen)
    if kind == "repetition":
        new = [w for i, u in enumerate(units) for w in ((u, u) if i in sel else (u,))]
    elif kind == "removal":
        keep = sel if removal == "keep-drawn" else set(range(n)) - sel
        new = [u for i, u in enumerate(units) if i in keep]
        if not new:
            return _not(caption, kind, "removal would leave an empty caption", seed, unchanged=False)
        sel = set(range(n)) - keep  # positions that changed: the removed words
    else:  # masking
        new = [mask if i in sel else u for i, u in enumerate(units)]
    text = words.join(new)
    if text == caption or new == units:
        return _not(caption, kind, "perturbation left the caption unchanged", seed)
    return Perturbed(caption, kind, text, tuple(sorted(sel)), "", seed)


def _substitute(caption, rng, *, seed, objects, nlp, lang) -> Perturbed:
    kind = "substitution"
    if objects is not None:
        objs, source = [o for o in objects if o], "critical objects"
    elif nlp is not None:
        objs, source = _nouns(caption, nlp), "nouns"
    elif is_unspaced(caption) or not _is_english(lang):
        what = "unspaced text" if lang is None else f"language {lang!r}"
        return _not(caption, kind, f"no critical objects in the data and no parser for {what} "
                                   "(the English parser is not used on it)", seed, unchanged=False)
    else:
        objs, source = _nouns(caption, _spacy(SPACY_MODEL)), "nouns"
    if len(set(objs)) < 2:  # Algorithm 1: fewer than two objects -> the caption as it is
        return _not(caption, kind, f"fewer than two distinct {source} to swap", seed)
    shuffled = list(objs)
    for _ in range(_MAX_TRIES):  # Algorithm 1: ``while current_critical_obj_list == shuffled``
        rng.shuffle(shuffled)
        if shuffled != objs:
            break
    if shuffled == objs:  # pragma: no cover - 20 failed shuffles of >= 2 distinct objects
        return _not(caption, kind, "shuffling did not change the order of the objects", seed)
    text = sub_in_sent(caption, objs, shuffled)
    if text == caption:
        return _not(caption, kind, "Algorithm 1's replacement left the caption unchanged", seed)
    changed = tuple(i for i in range(len(objs)) if shuffled[i] != objs[i])
    return Perturbed(caption, kind, text, changed, "", seed)


def perturb_all(
    captions: Sequence[str],
    kinds: Sequence[str] = PERTURBATIONS,
    *,
    objects: Sequence[Sequence[str] | None] | None = None,
    langs: Sequence[str | None] | None = None,
    **options,
) -> list[list[Perturbed]]:
    """Every kind for every caption: result[i][k] is caption i under kinds[k].

    ``objects``: per-caption critical objects (or None for the nouns of English captions);
    ``langs``: per-caption language codes (None: English).
    """
    for name, per in (("objects", objects), ("langs", langs)):
        if per is not None and len(per) != len(captions):
            raise param_error(name, "perturb_all", f"one entry per caption ({len(captions)})", len(per))
    return [
        [perturb(c, k, objects=(objects[i] if objects is not None else None),
                 lang=(langs[i] if langs is not None else None), **options) for k in kinds]
        for i, c in enumerate(captions)
    ]
