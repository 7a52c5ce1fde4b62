"""Classic reference-based caption metrics — BLEU-1…4, METEOR, ROUGE-L, CIDEr-D, SPICE — with pycocoevalcap's numbers.

pycocoevalcap (the COCO caption evaluation code every captioning paper reports; ``pip install
'capscore[classic]'``) is the reference: its jars do the PTB tokenisation, METEOR and SPICE, and every value
here equals what its scorers' ``compute_score`` returns on the same tokenised text. For each metric a run
yields a :class:`~capscore.scores.classic_stats.ClassicStats`: the **per-caption values** and the **corpus
headline** — the number papers print — computed from per-item sufficient statistics, so that a bootstrap
resample recomputes the headline without Java or tokenising (``stats.corpus(indices)``):

================  ===================================================================================
``bleu1``…``4``   Papineni et al. 2002. Per caption: sentence-level BLEU-n as ``pycocoevalcap.bleu.Bleu(4)``
                  returns it (``closest`` reference length, its tiny/small smoothing constants). Headline:
                  corpus BLEU-n — clipped counts and brevity penalty summed over the whole set (not the
                  mean of the per-caption values).
``meteor``        Denkowski & Lavie 2014, METEOR 1.5 (pycocoevalcap's jar and arguments, ``-l en -norm``);
                  needs Java. Per caption: the jar's segment score. Headline: the jar's aggregate score over
                  all segments (from their summed statistics; not the mean of the segment scores).
``rouge-l``       Lin 2004, ROUGE-L F (β = 1.2) against the best reference. Headline: the mean.
``cider``         Vedantam et al. 2015, CIDEr-D (σ = 6, clipped counts, ×10). Headline: the mean. Its IDF
                  is computed over the **evaluated set** — the references of the captions scored together,
                  one document per image, exactly as the reference code computes it — so a caption's value
                  depends on the other captions of the set. On a handful of images the IDF is meaningless
                  (one image: log(1/1) = 0 for every n-gram, CIDEr 0); a warning is given under
                  :data:`CIDER_MIN_IMAGES` distinct reference sets (a rule of thumb, not from the paper).
                  A resample keeps the set's IDF (why: :mod:`capscore.scores.classic_stats`).
``spice``         Anderson et al. 2016, SPICE F-score (``All.f``) of the SPICE 1.0 jar pycocoevalcap ships;
                  needs Java and the Stanford CoreNLP 3.6.0 jars (below). Headline: the mean over the
                  captions whose F is defined (pycocoevalcap's mean would be NaN if any is not).
================  ===================================================================================

**Backends** (``backend=``). ``"native"`` (default) computes BLEU, ROUGE-L and CIDEr-D with numpy on the
PTB tokens (:mod:`capscore.scores.classic_native`); its values equal pycocoevalcap's to ~1e-15 (tested to
1e-12 on random token sequences and caption sets). ``"pycocoevalcap"`` runs pycocoevalcap's own Python
scorers on the same tokens (the reference; slow on long captions: its ROUGE-L is quadratic in pure Python).
METEOR, SPICE and the PTB tokenizer are always pycocoevalcap's jars.

**One session per run.** A :class:`ClassicSession` (a context manager) holds one long-lived METEOR process,
the METEOR statistics and SPICE results already computed, and uses the process-wide PTB memo; inside
``with ClassicSession():`` every call — any number of batches, systems and metrics — shares them, and
:meth:`ClassicSession.prepare` tokenises every distinct text of a run in one PTB pass. Outside a session
each call opens and closes its own. Processes are killed when the session closes (also on Ctrl-C and at
interpreter exit); a Java tool that dies or goes silent is a one-line error, never a hang
(:mod:`capscore.scores.classic_java`).

**Tokenisation** (``tokenizer=``): ``"ptb"`` (default) is pycocoevalcap's ``PTBTokenizer`` — Stanford
CoreNLP 3.4.1's PTB tokenizer with ``-preserveLines -lowerCase`` and the punctuation tokens removed —
applied to candidates and references alike, as the COCO evaluation does; it needs Java. Each text is
tokenised alone on its line, so its tokens are remembered for the process (by text). Without Java,
``"ptb"`` is a one-line error; ``tokenizer="simple"`` is the documented fallback: lower-case, split off
punctuation and the PTB clitics (``'s``, ``n't``, ``'re``, ``'ve``, ``'ll``, ``'d``, ``'m``), drop the same
punctuation tokens. It matches the PTB output on ordinary captions (tested) but not on every corner
(quotes, brackets, abbreviations with periods), so numbers from it are close to, not equal to, the
papers'. ``tokenizer="none"`` scores the texts as given (already tokenised).

**Texts are made line-safe first**, whatever the tokenizer: every line or paragraph separator and control
character becomes a space (``\\r``, ``\\v``, ``\\f``, U+0085, U+2028, … would otherwise start a new line in
a line-based Java tool and shift every text after it), lone surrogates become U+FFFD, and ``|||`` is
removed from every text sent to METEOR (its field separator). So a text's scores never depend on another
item's text.

**Bad input** is a one-line :class:`~capscore.errors.InputError` naming the item: a caption that is not a
string; references missing, not a list of strings, or blank. Documented values instead of errors: an empty
caption (or one of punctuation only) scores 0 on BLEU, METEOR, ROUGE-L and CIDEr-D — what pycocoevalcap
returns for it; a set whose references all tokenise to nothing (emoji only, say) has CIDEr-D 0 everywhere
(pycocoevalcap's own CIDEr fails on it); non-ASCII text is scored as the tokenizer leaves it (the PTB tokenizer drops characters it
cannot tokenise, e.g. emoji). A very long caption is scored, but METEOR's aligner may exhaust the jar's
2 GB heap on one (thousands of words repeating a few): that is a one-line error naming the item.

SPICE needs ``stanford-corenlp-3.6.0.jar`` and ``stanford-corenlp-3.6.0-models.jar`` (inside
``stanford-corenlp-full-2015-12-09.zip``), which pycocoevalcap would download on first use. capscore
never downloads: it looks in ``$CAPSCORE_SPICE_DIR``, then ``~/.cache/capscore/spice`` (under
``$CAPSCORE_CACHE`` if set), then pycocoevalcap's own ``spice/lib`` folder, and otherwise raises a one-line
error saying where to put them. It runs pycocoevalcap's ``spice-1.0.jar`` (its main class, the same
arguments as ``pycocoevalcap.spice.Spice``) with those jars on the class path, writing its temporary files
and its parse cache under the capscore cache instead of inside the installed package.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import re
import shutil  # noqa: F401  (tests replace shutil.which to simulate a machine without Java)
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
import dataclasses
import functools
from functools import partial
from importlib.metadata import PackageNotFoundError, version

from capscore.errors import CapscoreError, InputError, param_error, unknown_name
from capscore.scores import classic_java
from capscore.scores.classic_java import (
    CORENLP_JARS, Meteor, PUNCTUATIONS, corenlp_dir, jar_problem, java, line_safe, need_java,
    pycoco_dir, run_spice, spice_dirs, spice_jars, timeout_default,
)
from capscore._log import warn
from capscore.scores.metric import Metric, Values, register

if TYPE_CHECKING:  # numpy is imported where scores are computed: the metric registry stays cheap
    import numpy as np

    from capscore.scores.classic_stats import ClassicStats

CLASSIC_METRICS = ("bleu1", "bleu2", "bleu3", "bleu4", "meteor", "rouge-l", "cider", "spice")
TOKENIZERS = ("ptb", "simple", "none")
BACKENDS = ("native", "pycocoevalcap")
CIDER_MIN_IMAGES = 100
NEEDS_JAVA = frozenset({"meteor", "spice"})
CITATIONS = {
    "bleu": "Papineni et al. 2002 (BLEU), pycocoevalcap.bleu",
    "meteor": "Denkowski & Lavie 2014 (METEOR 1.5), pycocoevalcap.meteor",
    "rouge-l": "Lin 2004 (ROUGE-L), pycocoevalcap.rouge",
    "cider": "Vedantam et al. 2015 (CIDEr-D), pycocoevalcap.cider",
    "spice": "Anderson et al. 2016 (SPICE), pycocoevalcap.spice",
}
_MEMO_MAX = 1_000_000  # texts (PTB) or pairs (METEOR, SPICE) remembered before a memo starts afresh
_SET_MEMO_ITEMS = 200_000  # items whose BLEU/ROUGE-L/CIDEr-D results a session remembers (ClassicSession._sets)


def __getattr__(name: str):  # ClassicStats lives with numpy; importing it here would load numpy with the registry
    if name in ("ClassicStats", "ClassicResult"):
        from capscore.scores.classic_stats import ClassicStats  # noqa: PLC0415  (deferred: numpy)

        return ClassicStats
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------------------------------ tokenisation
_CLITICS = re.compile(r"(?i)(\w)(n't|'s|'re|'ve|'ll|'d|'m)\b")
_BRACKETS = {"(": "-lrb-", ")": "-rrb-", "[": "-lsb-", "]": "-rsb-", "{": "-lcb-", "}": "-rcb-"}
_PUNCT = re.compile(r"(\.\.\.|--|[!?]+|[,;:()\[\]{}\"`]|'(?=\s|$)|(?<=\s)'(?!(?:s|re|ve|ll|d|m)\b))")
_FINAL_PERIOD = re.compile(r"(?<=[^\s.])\.(?=\s|$)")


def simple_tokenize(text: str) -> str:
    """The Java-free approximation of the PTB tokenisation (module docstring): lower-case, clitics and
    punctuation split off, brackets written as PTB writes them lower-cased (``-lrb-`` …, which pycocoevalcap's
    punctuation list, in upper case, does not remove), a sentence-final period split off (not the periods
    inside ``u.s.`` or ``3.5``), pycocoevalcap's punctuation tokens dropped."""
    t = _CLITICS.sub(r"\1 \2", text.lower())
    t = _PUNCT.sub(r" \1 ", " " + t + " ")
    words = []
    for w in t.split():
        if "." in w[:-1] and w.endswith(".") and not w.endswith(".."):
            words.append(w)  # an abbreviation with inner periods keeps its final one (u.s.)
            continue
        words.extend(_FINAL_PERIOD.sub(" .", w).split())
    out = [_BRACKETS.get(w, w) for w in words]
    return " ".join(w for w in out if w not in PUNCTUATIONS and w != '"')


_PTB_MEMO: dict[str, str] = {}


def tokenize(texts: Sequence[str], *, tokenizer: str = "ptb", timeout: float | None = None) -> list[str]:
    """Texts -> tokenised texts (space-separated tokens), in order; every text made line-safe first (module
    docstring). PTB tokens are remembered by text for the process: only texts not seen before reach the jar,
    all of them in one run of it."""
    if tokenizer not in TOKENIZERS:
        raise param_error("tokenizer", "tokenize", f"one of {', '.join(TOKENIZERS)}", tokenizer)
    texts = [line_safe(t) for t in texts]
    if tokenizer == "none":
        return texts
    if tokenizer == "simple":
        return [simple_tokenize(t) for t in texts]
    known = {t: _PTB_MEMO[t] for t in texts if t in _PTB_MEMO}
    new = list(dict.fromkeys(t for t in texts if t not in known))
    if new:
        known.update(zip(new, classic_java.ptb_tokenize(new, timeout=timeout or timeout_default())))
        _remember(_PTB_MEMO, new, known)
    return [known[t] for t in texts]


def _remember(memo: dict, new: list, known: dict) -> None:
    """Add the ``new`` keys' answers (from ``known``) to a bounded memo."""
    if len(memo) + len(new) > _MEMO_MAX:
        memo.clear()
    memo.update((k, known[k]) for k in new)


# ------------------------------------------------------------------------------------ input checks
def _canonical(names) -> list[str]:
    if isinstance(names, str):
        names = [names]
    out = []
    for n in names:
        if n not in CLASSIC_METRICS:
            raise unknown_name("classic metric", n, CLASSIC_METRICS)
        out.append(n)
    return list(dict.fromkeys(out))


def _check_options(func: str, tokenizer: str, backend: str) -> None:
    if tokenizer not in TOKENIZERS:
        raise param_error("tokenizer", func, f"one of {', '.join(TOKENIZERS)}", tokenizer)
    if backend not in BACKENDS:
        raise param_error("backend", func, f"one of {', '.join(BACKENDS)}", backend)


def _validate(candidates, references, ids, where: str = "") -> tuple[list[str], list[list[str]], list[str]]:
    """Line-safe candidates, references, and a name per item for errors (``where`` prefixes each name)."""
    if not _listlike(candidates):
        raise CapscoreError(f"the candidates must be a list of strings; got {type(candidates).__name__}")
    if not _listlike(references):
        raise CapscoreError(f"the references must be a list (one list of strings per caption); got "
                            f"{type(references).__name__}")
    candidates, references = list(candidates), list(references)
    if len(candidates) != len(references):
        raise CapscoreError(f"candidates and references differ in length: {len(candidates)} vs {len(references)}")
    if not len(candidates):
        raise CapscoreError("the classic metrics need at least one caption")
    names = [f"{where}caption {i}" for i in range(len(candidates))] if ids is None else [
        f"{where}item {x}" for x in ids]
    if len(names) != len(candidates):
        raise CapscoreError(f"ids and candidates differ in length: {len(names)} vs {len(candidates)}")
    cands, refs = [], []
    for name, c, rs in zip(names, candidates, references):
        if not isinstance(c, str):
            raise InputError(name, "the caption must be a string", got=c)
        if isinstance(rs, str):
            rs = [rs]
        if not _listlike(rs):
            raise InputError(name, "the references must be a list of strings", got=rs)
        rs = list(rs)
        if not rs:
            raise InputError(name, "a reference-based metric needs at least one non-empty reference", got=rs)
        safe = []
        for k, r in enumerate(rs):
            if not isinstance(r, str):
                raise InputError(name, f"reference {k} is not a string", got=r)
            r = line_safe(r)
            if not r.strip():
                raise InputError(name, "a reference-based metric needs at least one non-empty reference; "
                                 f"reference {k} is blank", got=rs)
            safe.append(r)
        cands.append(line_safe(c))
        refs.append(safe)
    return cands, refs, names


def _listlike(x) -> bool:
    """A list, tuple, array or other iterable collection — not a string, bytes, a mapping or a scalar."""
    return hasattr(x, "__iter__") and hasattr(x, "__len__") and not isinstance(x, (str, bytes, Mapping))


# ------------------------------------------------------------------------------------ the session
_ACTIVE: contextvars.ContextVar[ClassicSession | None] = contextvars.ContextVar("capscore_classic_session",
                                                                                 default=None)


def active_session() -> ClassicSession | None:
    """The :class:`ClassicSession` open in this context (``with ClassicSession(): ...``), or ``None``."""
    return _ACTIVE.get()


@contextlib.contextmanager
def _session(timeout: float | None = None) -> Iterator[ClassicSession]:
    """The active session, or a fresh one closed when the block ends."""
    current = active_session()
    if current is not None and not current.closed:
        yield current
        return
    with ClassicSession(timeout=timeout) as s:
        yield s


def in_session(func):
    """``func`` run inside one :class:`ClassicSession` (the active one, or one opened for the call and closed
    after it): every classic metric it scores — any number of metrics, loops, reference draws — shares one
    METEOR process and the PTB memo."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with _session():
            return func(*args, **kwargs)

    return wrapper


class ClassicSession:
    """The Java tools and memos of one run (module docstring): one METEOR process started on first use,
    the METEOR statistics and SPICE results of every (candidate, references) pair already scored, and the
    PTB memo. Use as a context manager (it is then the :func:`active_session` for the calls inside);
    :meth:`close` kills the processes and is idempotent. ``timeout``: seconds a Java tool may stay silent
    (default ``$CAPSCORE_JAVA_TIMEOUT`` or 120)."""

    def __init__(self, *, timeout: float | None = None):
        if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
            raise param_error("timeout", "ClassicSession", "a number of seconds > 0", timeout)
        self.timeout = float(timeout) if timeout is not None else timeout_default()
        self._meteor = None
        self._meteor_memo: dict[tuple, str] = {}
        self._spice_memo: dict[tuple, float] = {}
        self._sets: dict[tuple, dict] = {}  # (backend, candidates, references) -> metric -> (values, stats)
        self._set_items = 0
        self._tokens: list[contextvars.Token] = []
        self.closed = False
        self.prepared = False  # a run's texts were tokenised (ClassicFormula.session)

    def __enter__(self) -> ClassicSession:
        self._tokens.append(_ACTIVE.set(self))
        return self

    def __exit__(self, *exc) -> None:
        try:
            _ACTIVE.reset(self._tokens.pop())
        finally:
            self.close()

    def close(self) -> None:
        """Kill the METEOR process (if started); the session cannot be reused."""
        self.closed = True
        if self._meteor is not None:
            self._meteor.close()
            self._meteor = None

    # ------------------------------------------------------------------------------ tokens
    def prepare(self, texts: Sequence[str], *, tokenizer: str = "ptb") -> None:
        """Tokenise every distinct text of a run now, in one PTB pass (later calls find them in the memo)."""
        if tokenizer == "ptb":
            tokenize([t for t in texts if isinstance(t, str)], tokenizer="ptb", timeout=self.timeout)

    def tokenize(self, texts: Sequence[str], *, tokenizer: str = "ptb") -> list[str]:
        """:func:`tokenize` with this session's timeout."""
        return tokenize(texts, tokenizer=tokenizer, timeout=self.timeout)

    # ------------------------------------------------------------------------------ scoring
    def score(self, names: Sequence[str] | str, candidates: Sequence[str], references: Sequence[Sequence[str]], *,
              tokenizer: str = "ptb", backend: str = "native",
              ids: Sequence | None = None) -> dict[str, ClassicStats]:
        """Each named metric for every caption against its references: name -> ClassicStats (values in input
        order). All captions are scored together (CIDEr's IDF comes from all their references). ``ids``
        names the items in errors (default: ``caption i``)."""
        return self.score_systems(names, {"": (candidates, references)}, tokenizer=tokenizer, backend=backend,
                                  ids={"": ids} if ids is not None else None)[""]

    def score_systems(self, names: Sequence[str] | str,
                      systems: Mapping[str, tuple[Sequence[str], Sequence[Sequence[str]]]], *,
                      tokenizer: str = "ptb", backend: str = "native",
                      ids: Mapping[str, Sequence] | None = None) -> dict[str, dict[str, ClassicStats]]:
        """Several systems (name -> (candidates, references)), each scored as its own evaluated set, with one
        PTB pass over all their texts and one SPICE run: system -> metric -> ClassicStats."""
        if self.closed:
            raise CapscoreError("this ClassicSession is closed; open a new one")
        names = _canonical(names)
        _check_options("ClassicSession.score", tokenizer, backend)
        checked = {}
        for system, pair in systems.items():
            if not (isinstance(pair, Sequence) and len(pair) == 2):
                raise param_error("systems", "ClassicSession.score_systems",
                                  "a mapping of system -> (candidates, references)", pair)
            cands, refs, item_names = _validate(pair[0], pair[1], (ids or {}).get(system),
                                                f"system {system!r} " if system else "")
            checked[system] = (cands, refs, item_names)
        for m in names:
            if m in NEEDS_JAVA:
                need_java(m.upper())
        if "spice" in names:
            spice_jars()
        flat = [t for c, r, _ in checked.values() for t in c + [x for rs in r for x in rs]]
        toks = iter(self.tokenize(flat, tokenizer=tokenizer))
        tokenised = {}
        for system, (cands, refs, item_names) in checked.items():
            c_tok = [next(toks) for _ in cands]
            r_tok = [[next(toks) for _ in rs] for rs in refs]
            tokenised[system] = (c_tok, r_tok, item_names)
        if "spice" in names:
            self._spice([(c, tuple(rs)) for c_tok, r_tok, _ in tokenised.values() for c, rs in zip(c_tok, r_tok)])
        return {system: self._score_set(names, *t, tokenizer=tokenizer, backend=backend)
                for system, t in tokenised.items()}

    def _score_set(self, names, cands, refs, item_names, *, tokenizer, backend) -> dict[str, ClassicStats]:
        import numpy as np  # noqa: PLC0415  (deferred: numpy)

        from capscore.scores.classic_stats import ClassicStats  # noqa: PLC0415  (deferred: numpy)

        out: dict[str, ClassicStats] = {}
        text = [m for m in names if m.startswith("bleu") or m in ("rouge-l", "cider")]
        made = self._text_scores(text, cands, refs, backend)
        for m, (values, stats) in made.items():
            warn = ()
            if m == "cider":
                docs = len({tuple(sorted(r)) for r in refs})
                if docs < CIDER_MIN_IMAGES:
                    warn = (f"CIDEr's IDF comes from the {docs} reference set(s) scored together (fewer than "
                            f"{CIDER_MIN_IMAGES}); on so few images its values mean little (one image: CIDEr is 0)",)
            out[m] = ClassicStats(m, values, stats, tokenizer, backend, warn)
        if "meteor" in names:
            values, stats = self._meteor_scores(cands, refs, item_names)
            out["meteor"] = ClassicStats("meteor", values, stats, tokenizer, backend)
        if "spice" in names:
            values = np.array(self._spice([(c, tuple(rs)) for c, rs in zip(cands, refs)]), dtype=float)
            bad = int(np.isnan(values).sum())
            warn = (f"SPICE gave no F for {bad} of {len(values)} captions; the headline averages the others",) \
                if bad else ()
            out["spice"] = ClassicStats("spice", values, values[:, None], tokenizer, backend, warn)
        return {m: out[m] for m in names}

    def _text_scores(self, names, cands, refs, backend) -> dict[str, tuple]:
        """(values, stats) of the BLEU-n, ROUGE-L and CIDEr-D ``names`` on one tokenised set, remembered for the
        session: a run scores metric after metric on the same blocks, and one BLEU count gives all four n."""
        if not names:
            return {}
        key = (backend, tuple(cands), tuple(map(tuple, refs)))
        known = self._sets.setdefault(key, {})
        todo = [m for m in names if m not in known]
        if any(m.startswith("bleu") for m in todo):
            todo = list(dict.fromkeys(todo + ["bleu1", "bleu2", "bleu3", "bleu4"]))
        if todo:
            if len(known) == 0:
                self._set_items += len(cands)
                if self._set_items > _SET_MEMO_ITEMS:  # bounded: a sharded run of millions forgets old blocks
                    self._sets, self._set_items = {key: known}, len(cands)
            known.update((_native if backend == "native" else _pycocoevalcap)(todo, cands, refs))
        return {m: known[m] for m in names}

    def _meteor_scores(self, cands, refs, item_names):
        import numpy as np  # noqa: PLC0415  (deferred: numpy)

        from capscore.scores.classic_stats import meteor_from_stats, meteor_summable  # noqa: PLC0415  (deferred: numpy)

        keys = [(c, tuple(rs)) for c, rs in zip(cands, refs)]
        known = {k: self._meteor_memo[k] for k in keys if k in self._meteor_memo}
        first = {}
        for i, k in enumerate(keys):
            if k not in known:
                first.setdefault(k, i)
        if first:
            if self._meteor is None or not self._meteor.alive:
                self._meteor = Meteor(timeout=self.timeout)
            todo = list(first)
            known.update(zip(todo, self._meteor.stats(todo, [item_names[i] for i in first.values()])))
            _remember(self._meteor_memo, todo, known)
        lines = [known[k] for k in keys]
        if self._meteor is None or not self._meteor.alive:
            self._meteor = Meteor(timeout=self.timeout)
        values, aggregate = self._meteor.evaluate(lines)
        stats = np.array([[float(x) for x in ln.split()] for ln in lines])
        mine = float(meteor_from_stats(meteor_summable(stats).sum(0)))
        if not math.isclose(mine, aggregate, rel_tol=0, abs_tol=1e-12):
            raise CapscoreError(f"the METEOR jar's aggregate ({aggregate!r}) differs from its statistics' "
                                f"({mine!r}): is pycocoevalcap's meteor-1.5.jar the original?")
        return np.array(values, dtype=float), stats

    def _spice(self, pairs: list[tuple[str, tuple]]) -> list[float]:
        known = {p: self._spice_memo[p] for p in pairs if p in self._spice_memo}
        todo = list(dict.fromkeys(p for p in pairs if p not in known))
        if todo:
            known.update(zip(todo, run_spice(todo, timeout=self.timeout)))
            _remember(self._spice_memo, todo, known)
        return [known[p] for p in pairs]


def _native(names, cands, refs) -> dict[str, tuple]:
    """(values, stats) of BLEU-n, ROUGE-L and CIDEr-D from :mod:`capscore.scores.classic_native`."""
    from capscore.scores.classic_native import TokenSet  # noqa: PLC0415  (deferred: numpy)
    from capscore.scores.classic_stats import bleu_from_stats  # noqa: PLC0415  (deferred: numpy)

    if not names:
        return {}
    ts = TokenSet(cands, refs)
    out = {}
    if any(m.startswith("bleu") for m in names):
        stats = ts.bleu_stats()
        per = bleu_from_stats(stats)
        out.update({m: (per[:, int(m[-1]) - 1], stats) for m in names if m.startswith("bleu")})
    if "rouge-l" in names:
        v = ts.rouge_l()
        out["rouge-l"] = (v, v[:, None])
    if "cider" in names:
        v = ts.cider_d()
        out["cider"] = (v, v[:, None])
    return out


def _pycocoevalcap(names, cands, refs) -> dict[str, tuple]:
    """(values, stats) of BLEU-n, ROUGE-L and CIDEr-D from pycocoevalcap's own scorers."""
    import numpy as np  # noqa: PLC0415  (deferred: numpy)

    if not names:
        return {}
    pycoco_dir()
    gts = {i: list(rs) for i, rs in enumerate(refs)}
    res = {i: [c] for i, c in enumerate(cands)}
    out = {}
    if any(m.startswith("bleu") for m in names):
        from pycocoevalcap.bleu.bleu_scorer import BleuScorer

        scorer = BleuScorer(n=4)
        for i in gts:  # what Bleu(4).compute_score does, keeping the scorer for its per-item counts
            scorer += (res[i][0], gts[i])
        _, per = scorer.compute_score(option="closest", verbose=0)
        stats = np.array([[c["testlen"], scorer._single_reflen(c["reflen"], "closest", c["testlen"]), *c["guess"],
                           *c["correct"]] for c in scorer.ctest], dtype=float)
        out.update({m: (np.asarray(per[int(m[-1]) - 1], dtype=float), stats) for m in names if m.startswith("bleu")})
    if "rouge-l" in names:
        from pycocoevalcap.rouge.rouge import Rouge

        v = np.asarray(Rouge().compute_score(gts, res)[1], dtype=float)
        out["rouge-l"] = (v, v[:, None])
    if "cider" in names:
        from pycocoevalcap.cider.cider import Cider

        if any(r.split() for rs in refs for r in rs):
            v = np.asarray(Cider().compute_score(gts, res)[1], dtype=float)
        else:  # no reference n-gram at all: pycocoevalcap fails (max() of no document frequency); CIDEr is 0
            v = np.zeros(len(cands))
        out["cider"] = (v, v[:, None])
    return out


# ------------------------------------------------------------------------------------ functions
def classic_scores(names: Sequence[str], candidates: Sequence[str], references: Sequence[Sequence[str]], *,
                   tokenizer: str = "ptb", backend: str = "native") -> dict[str, ClassicStats]:
    """Each named metric (:data:`CLASSIC_METRICS`) for every caption against its references, tokenised once.

    ``candidates[i]`` is scored against ``references[i]``; all captions are scored together (CIDEr's IDF
    comes from all their references). Returns name -> ClassicStats (``.values`` in input order,
    ``.corpus()`` the headline). Uses the :func:`active_session`, or a session of its own for this call.
    """
    _check_options("classic_scores", tokenizer, backend)
    with _session() as s:
        return s.score(names, candidates, references, tokenizer=tokenizer, backend=backend)


def classic_score(name: str, candidates: Sequence[str], references: Sequence[Sequence[str]], *,
                  tokenizer: str = "ptb", backend: str = "native") -> ClassicStats:
    """One classic metric (see :func:`classic_scores`)."""
    return classic_scores([name], candidates, references, tokenizer=tokenizer, backend=backend)[name]


def score_tokenized(names: Sequence[str], gts: dict, res: dict, *, tokenizer: str = "none",
                    backend: str = "native") -> dict[str, ClassicStats]:
    """The metrics on already tokenised ``gts`` {key: [refs]} and ``res`` {key: [candidate]} (pycocoevalcap's
    input layout), in the order of ``res``'s keys; ``tokenizer`` is only recorded."""
    if set(gts) != set(res):
        raise CapscoreError("gts and res must have the same keys")
    keys = list(res)
    with _session() as s:
        out = s.score(names, [res[k][0] for k in keys], [gts[k] for k in keys], tokenizer="none", backend=backend,
                      ids=keys)
    if tokenizer != "none":
        out = {m: dataclasses.replace(v, tokenizer=tokenizer) for m, v in out.items()}
    return out


def spice(gts: dict, res: dict) -> np.ndarray:
    """Per-caption SPICE F (``All.f``) on tokenised ``gts``/``res`` in the order of ``res`` (module docstring)."""
    return score_tokenized(["spice"], gts, res)["spice"].values


# ------------------------------------------------------------------------------------ registry rows
@dataclass(frozen=True)
class ClassicFormula:
    """The registry's formula for one classic metric: it reads the captions and references of the batch (no
    vectors) and scores each system (caption set) of the batch as its own evaluated set, in the
    :func:`active_session` (or a session of its own). Options ``tokenizer`` (``"ptb"`` default, ``"simple"``,
    ``"none"``) and ``classic_backend`` (``"native"`` default, ``"pycocoevalcap"``).

    BLEU and METEOR rows carry the per-item statistics of the corpus score as the ``stats`` column
    (:func:`capscore.scores.classic_stats.stats_text`), from which the registry row's ``aggregate`` (the
    headline) is rebuilt. CIDEr declares ``corpus``: its IDF comes from the batch, so a face passes the whole
    evaluated set as one batch. :meth:`session` is the run's: a face opens it once around a run (one PTB pass
    over every text, one METEOR process, the Java checks before anything is scored)."""

    metric: str
    needs: frozenset = frozenset({"refs"})
    columns: tuple = ()

    def _options(self, options) -> tuple[str, str]:
        tokenizer, backend = options.get("tokenizer", "ptb"), options.get("classic_backend", "native")
        _check_options(self.metric, tokenizer, backend)
        return tokenizer, backend

    def systems(self, batch) -> list[tuple[list[int], ClassicStats]]:
        """Each system of the batch scored as its own evaluated set (as pycocoevalcap scores one results
        file): (the positions of its records in the batch, its ClassicStats)."""
        tokenizer, backend = self._options(batch.options)
        groups: dict[str, list[int]] = {}
        for i, r in enumerate(batch.records):
            groups.setdefault(r.system, []).append(i)
        recs = batch.records
        with _session() as s:
            res = s.score_systems([self.metric], {
                system: ([batch.prefix + recs[i].caption for i in idx],
                         [[batch.prefix + x for x in recs[i].refs] for i in idx]) for system, idx in groups.items()},
                tokenizer=tokenizer, backend=backend, ids={system: [recs[i].id for i in idx]
                                                           for system, idx in groups.items()})
        out = []
        for system, idx in groups.items():
            stats = res[system][self.metric]
            for w in stats.warnings:
                warn(w)
            out.append((idx, stats))
        return out

    def stats(self, batch) -> ClassicStats:
        """The batch as one evaluated set (whatever its systems): its ClassicStats (values and headline)."""
        tokenizer, backend = self._options(batch.options)
        with _session() as s:
            res = s.score([self.metric], [batch.prefix + r.caption for r in batch.records],
                          [[batch.prefix + x for x in r.refs] for r in batch.records], tokenizer=tokenizer,
                          backend=backend, ids=[r.id for r in batch.records])[self.metric]
        for w in res.warnings:
            warn(w)
        return res

    def compute(self, batch):
        from capscore.scores.classic_stats import stats_text  # noqa: PLC0415  (deferred: numpy)

        scores = [0.0] * len(batch.records)
        parts = {c: [None] * len(batch.records) for c in self.columns}
        for idx, stats in self.systems(batch):
            for k, i in enumerate(idx):
                scores[i] = float(stats.values[k])
                if "stats" in parts:
                    parts["stats"][i] = stats_text(stats.stats[k])
        return Values(scores, parts)

    @contextlib.contextmanager
    def session(self, texts, options) -> Iterator[ClassicSession]:
        """The run's :class:`ClassicSession`: the active one, else one opened here and closed when the run
        ends (every classic metric of a run enters it; the first opens it). The tools this metric needs
        (pycocoevalcap, Java, the CoreNLP jars for SPICE) are checked first, so a missing one is a one-line
        error before any row is scored; then ``texts()`` (every caption and reference of the run, or None
        for a source too large to hold) are tokenised in one PTB pass."""
        tokenizer, _ = self._options(options)
        pycoco_dir()
        if self.metric in NEEDS_JAVA or tokenizer == "ptb":
            need_java(self.metric.upper() if self.metric in NEEDS_JAVA else "PTB tokenisation (the COCO "
                      "tokenizer of pycocoevalcap; tokenizer 'simple' is a Java-free approximation)")
        if self.metric == "spice":
            spice_jars()
        with _session() as s:
            if texts is not None and tokenizer == "ptb" and not s.prepared:
                s.prepare(list(texts()), tokenizer="ptb")
                s.prepared = True
            yield s

    def describe(self, options) -> str:
        """The identity a result records in place of a backbone's."""
        backend = options.get("classic_backend", "native")
        return (f"pycocoevalcap {pycocoevalcap_version()}, {options.get('tokenizer', 'ptb')} tokenizer"
                + (f", {backend} backend" if backend != "native" else ""))


def pycocoevalcap_version() -> str:
    """The installed pycocoevalcap's version, or ``(not installed)``."""
    try:
        return version("pycocoevalcap")
    except PackageNotFoundError:
        return "(not installed)"


def _aggregate(name: str):
    from capscore.scores.classic_stats import classic_aggregate  # noqa: PLC0415  (deferred: numpy)

    return classic_aggregate(name)


def _register() -> None:
    cites = {"bleu1": "bleu", "bleu2": "bleu", "bleu3": "bleu", "bleu4": "bleu"}
    ranges = {"cider": (0.0, 10.0)}  # CIDEr-D: 10 x a mean of cosines
    for name in CLASSIC_METRICS:
        needs = frozenset({"refs", "corpus"}) if name == "cider" else frozenset({"refs"})
        columns = ("stats",) if name.startswith("bleu") or name == "meteor" else ()
        register(Metric(name=name, citation=CITATIONS[cites.get(name, name)],
                        image=ClassicFormula(name, needs, columns), needs_refs=True, prefix="",
                        range=ranges.get(name, (0.0, 1.0)),
                        note="text only (no backbone): pycocoevalcap on PTB-tokenised captions and references"
                             + ("; IDF over the whole evaluated set" if name == "cider" else "")
                             + ("; needs Java" if name in NEEDS_JAVA else "")
                             + ("; needs the CoreNLP 3.6.0 jars" if name == "spice" else ""),
                        default_model="", aggregate=partial(_aggregate, name)))


_register()


__all__ = [
    "BACKENDS", "CIDER_MIN_IMAGES", "CLASSIC_METRICS", "CORENLP_JARS", "ClassicFormula",
    "ClassicSession", "ClassicStats", "TOKENIZERS", "active_session", "classic_score", "classic_scores", "in_session",
    "corenlp_dir", "jar_problem", "java", "line_safe", "score_tokenized", "simple_tokenize", "spice", "spice_dirs", "tokenize",
]
