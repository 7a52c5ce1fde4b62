"""Classic reference-based caption metrics — BLEU-1…4, METEOR, ROUGE-L, CIDEr-D, SPICE — computed by pycocoevalcap.

The numbers are pycocoevalcap's (the COCO caption evaluation code every captioning paper reports;
``pip install 'capscore[classic]'``); this module only tokenises, validates, calls it and returns one
value per caption. Nothing here re-implements a metric.

================  =====================================================================================
``bleu1``…``4``   Papineni et al. 2002, sentence-level BLEU-n as ``pycocoevalcap.bleu.Bleu(4)`` returns per
                  caption (``option="closest"`` reference length, its tiny/small smoothing constants);
                  ``corpus`` is its corpus-level BLEU (not the mean of the per-caption values).
``meteor``        Denkowski & Lavie 2014, METEOR 1.5 (``Meteor``: ``-l en -norm``); needs Java.
``rouge-l``       Lin 2004, ROUGE-L F (β = 1.2) against the best reference (``Rouge``).
``cider``         Vedantam et al. 2015, CIDEr-D (``Cider``: σ = 6, clipped counts, ×10). Its IDF is
                  computed over the **evaluated set** — the references of the captions scored together, one
                  document per caption, exactly as the reference code computes it — so a caption's value
                  depends on the other captions in the call. On a handful of images the IDF is meaningless
                  (one image: log(1/1) = 0 for every n-gram, CIDEr 0); a warning is given under
                  :data:`CIDER_MIN_IMAGES` distinct reference sets (a rule of thumb, not from the paper).
``spice``         Anderson et al. 2016, SPICE F-score (``All.f``) of the SPICE 1.0 jar pycocoevalcap ships;
                  needs Java and the Stanford CoreNLP 3.6.0 jars (below).
================  =====================================================================================

Tokenisation (``tokenizer=``): ``"ptb"`` (default) is pycocoevalcap's ``PTBTokenizer`` — Stanford
CoreNLP 3.4.1's PTB tokenizer with ``-preserveLines -lowerCase`` and the punctuation tokens removed —
applied to candidates and references alike, as the COCO evaluation does; it needs Java. Without Java,
``"ptb"`` is a one-line error; ``tokenizer="simple"`` is the documented fallback: lower-case, split off
punctuation and the PTB clitics (``'s``, ``n't``, ``'re``, ``'ve``, ``'ll``, ``'d``, ``'m``), drop the same
punctuation tokens. It matches the PTB output on ordinary captions (tested) but not on every corner
(quotes, brackets, abbreviations with periods), so numbers from it are close to, not equal to, the
papers'. ``tokenizer="none"`` scores the texts as given (already tokenised).

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
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from capscore.errors import CapscoreError, InputError, param_error, unknown_name

if TYPE_CHECKING:  # numpy is imported where scores are computed: the metric registry stays cheap
    import numpy as np

CLASSIC_METRICS = ("bleu1", "bleu2", "bleu3", "bleu4", "meteor", "rouge-l", "cider", "spice")
TOKENIZERS = ("ptb", "simple", "none")
CIDER_MIN_IMAGES = 100
NEEDS_JAVA = frozenset({"meteor", "spice"})
CORENLP_JARS = ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")
CITATIONS = {
    "bleu": "Papineni et al. 2002 (BLEU), pycocoevalcap.bleu",
    "meteor": "Denkowski & Lavie 2014 (METEOR 1.5), pycocoevalcap.meteor",
    "rouge-l": "Lin 2004 (ROUGE-L), pycocoevalcap.rouge",
    "cider": "Vedantam et al. 2015 (CIDEr-D), pycocoevalcap.cider",
    "spice": "Anderson et al. 2016 (SPICE), pycocoevalcap.spice",
}
# pycocoevalcap.tokenizer.ptbtokenizer.PUNCTUATIONS (copied so the simple tokenizer drops the same tokens)
PUNCTUATIONS = frozenset(["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-",
                          ".", "?", "!", ",", ":", "-", "--", "...", ";"])


@dataclass(frozen=True)
class ClassicResult:
    """One classic metric on a set of captions: per-caption ``values`` (in input order) and pycocoevalcap's
    set-level ``corpus`` value (corpus BLEU; the mean for the others)."""

    name: str
    values: np.ndarray = field(repr=False)
    corpus: float
    tokenizer: str
    warnings: tuple[str, ...] = ()


# ------------------------------------------------------------------------------------ environment
def java() -> str | None:
    """Path of the ``java`` executable, or ``None``."""
    return shutil.which("java")


def _pycoco():
    try:
        import pycocoevalcap  # noqa: F401
    except ImportError:
        raise CapscoreError("the classic metrics (BLEU, METEOR, ROUGE-L, CIDEr, SPICE) need pycocoevalcap: "
                            "pip install 'capscore[classic]'") from None
    return Path(next(iter(pycocoevalcap.__path__)))  # a namespace package: no __file__


def _need_java(what: str) -> None:
    if java() is None:
        raise CapscoreError(f"{what} needs Java, which was not found on PATH: install a Java runtime "
                            "(Debian/Ubuntu: apt-get install default-jre-headless)")


def spice_dirs() -> list[Path]:
    """Where the CoreNLP jars for SPICE are looked for, in order (see the module docstring)."""
    from capscore.embed.cache import DEFAULT_CACHE_DIR

    dirs = []
    if os.environ.get("CAPSCORE_SPICE_DIR"):
        dirs.append(Path(os.environ["CAPSCORE_SPICE_DIR"]).expanduser())
    dirs.append(DEFAULT_CACHE_DIR / "spice")
    try:
        dirs.append(_pycoco() / "spice" / "lib")
    except CapscoreError:
        pass
    return dirs


def corenlp_dir() -> Path | None:
    """The first folder of :func:`spice_dirs` holding both CoreNLP 3.6.0 jars, or ``None``."""
    return next((d for d in spice_dirs() if all(jar_problem(d / j) is None for j in CORENLP_JARS)), None)


def jar_problem(path: Path) -> str | None:
    """Why ``path`` is not a usable jar (missing, empty, not a zip archive), or ``None`` when it is one:
    a jar is a zip file, which starts with the bytes ``PK\x03\x04`` (an empty one, ``PK\x05\x06``)."""
    try:
        if not path.is_file():
            return "missing"
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    if size == 0:
        return "empty (0 bytes)"
    if head not in (b"PK\x03\x04", b"PK\x05\x06"):
        return f"not a jar (a jar is a zip archive; {size:,} bytes starting {head!r})"
    return None


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
_PTB_MEMO_MAX = 1_000_000


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 (a child process's stderr) for the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def tokenize(texts: Sequence[str], *, tokenizer: str = "ptb") -> list[str]:
    """Texts -> tokenised texts (space-separated tokens), in order."""
    if tokenizer not in TOKENIZERS:
        raise param_error("tokenizer", "tokenize", f"one of {', '.join(TOKENIZERS)}", tokenizer)
    texts = [t.replace("\n", " ") for t in texts]
    if tokenizer == "none":
        return list(texts)
    if tokenizer == "simple":
        return [simple_tokenize(t) for t in texts]
    _pycoco()
    _need_java("PTB tokenisation (the COCO tokenizer of pycocoevalcap; tokenizer='simple' is a Java-free "
               "approximation)")
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    # each text is tokenised on its own line, so a text's tokens do not depend on the others: texts seen
    # before (another metric, another reference draw on the same dataset) come from memory, not the JVM
    new = list(dict.fromkeys(t for t in texts if t not in _PTB_MEMO))
    if new:
        try:
            with _quiet_stderr():  # the jar reports "PTBTokenizer tokenized N tokens ..." on stderr
                out = PTBTokenizer().tokenize({i: [{"caption": t}] for i, t in enumerate(new)})
        except OSError as e:  # it writes its temporary file next to its jar
            raise CapscoreError(f"pycocoevalcap's PTB tokenizer could not run ({e})") from None
        if len(out) != len(new):
            raise CapscoreError(f"the PTB tokenizer returned {len(out)} lines for {len(new)} texts")
        if len(_PTB_MEMO) + len(new) > _PTB_MEMO_MAX:
            _PTB_MEMO.clear()
        _PTB_MEMO.update((t, out[i][0]) for i, t in enumerate(new))
        got = {t: out[i][0] for i, t in enumerate(new)}
    else:
        got = {}
    return [got[t] if t in got else _PTB_MEMO[t] for t in texts]


# ------------------------------------------------------------------------------------ scoring
def _validate(candidates, references) -> tuple[list[str], list[list[str]]]:
    cands, refs = list(candidates), [list(r) if not isinstance(r, str) else [r] for r in references]
    if len(cands) != len(refs):
        raise CapscoreError(f"candidates and references differ in length: {len(cands)} vs {len(refs)}")
    if not cands:
        raise CapscoreError("the classic metrics need at least one caption")
    for i, (c, rs) in enumerate(zip(cands, refs)):
        if not isinstance(c, str):
            raise InputError(f"caption {i}", "the caption must be a string", got=c)
        if not rs or not all(isinstance(r, str) and r.strip() for r in rs):
            raise InputError(f"caption {i}", "a reference-based metric needs at least one non-empty reference",
                             got=rs)
    return cands, refs


def _canonical(names) -> list[str]:
    out = []
    for n in names:
        if n not in CLASSIC_METRICS:
            raise unknown_name("classic metric", n, CLASSIC_METRICS)
        out.append(n)
    return list(dict.fromkeys(out))


def score_tokenized(names: Sequence[str], gts: dict, res: dict, *, tokenizer: str = "none") -> dict[str, ClassicResult]:
    """pycocoevalcap on already tokenised ``gts`` {key: [refs]} and ``res`` {key: [candidate]} (keys 0..N-1)."""
    import numpy as np

    names = _canonical(names)
    _pycoco()
    n = len(res)
    out: dict[str, ClassicResult] = {}
    bleus = [m for m in names if m.startswith("bleu")]
    if bleus:
        from pycocoevalcap.bleu.bleu import Bleu

        corpus, per = Bleu(4).compute_score(gts, res, verbose=0)
        for m in bleus:
            k = int(m[-1]) - 1
            out[m] = ClassicResult(m, np.asarray(per[k], dtype=float), float(corpus[k]), tokenizer)
    if "rouge-l" in names:
        from pycocoevalcap.rouge.rouge import Rouge

        mean, per = Rouge().compute_score(gts, res)
        out["rouge-l"] = ClassicResult("rouge-l", np.asarray(per, dtype=float), float(mean), tokenizer)
    if "cider" in names:
        from pycocoevalcap.cider.cider import Cider

        mean, per = Cider().compute_score(gts, res)
        docs = len({tuple(sorted(r)) for r in gts.values()})
        warn = ()
        if docs < CIDER_MIN_IMAGES:
            warn = (f"CIDEr's IDF comes from the {docs} reference set(s) scored together (fewer than "
                    f"{CIDER_MIN_IMAGES}); on so few images its values mean little (one image: CIDEr is 0)",)
        out["cider"] = ClassicResult("cider", np.asarray(per, dtype=float), float(mean), tokenizer, warn)
    if "meteor" in names:
        _need_java("METEOR")
        from pycocoevalcap.meteor.meteor import Meteor

        scorer = Meteor()
        try:
            mean, per = scorer.compute_score(gts, res)
        except ValueError as e:  # the jar wrote something else than a number (e.g. out of memory)
            raise CapscoreError(f"METEOR (java) failed: {e}") from None
        finally:
            scorer.meteor_p.stdin.close()
            scorer.meteor_p.kill()
            scorer.meteor_p.wait()
            scorer.__class__ = type("ClosedMeteor", (), {})  # its __del__ would write to the closed pipe
        out["meteor"] = ClassicResult("meteor", np.asarray(per, dtype=float), float(mean), tokenizer)
    if "spice" in names:
        per = spice(gts, res)
        out["spice"] = ClassicResult("spice", per, float(np.nanmean(per)) if n else float("nan"), tokenizer)
    return {m: out[m] for m in names}


def classic_scores(names: Sequence[str], candidates: Sequence[str], references: Sequence[Sequence[str]], *,
                   tokenizer: str = "ptb") -> dict[str, ClassicResult]:
    """Each named metric (:data:`CLASSIC_METRICS`) for every caption against its references, tokenised once.

    ``candidates[i]`` is scored against ``references[i]``; all captions are scored together (CIDEr's IDF
    comes from all their references). Returns name -> :class:`ClassicResult`, values in input order.
    """
    names = _canonical(names)
    if tokenizer not in TOKENIZERS:
        raise param_error("tokenizer", "classic_scores", f"one of {', '.join(TOKENIZERS)}", tokenizer)
    cands, refs = _validate(candidates, references)
    for m in names:
        if m in NEEDS_JAVA:
            _need_java(m.upper())
    if "spice" in names:
        _spice_jars()
    flat = cands + [r for rs in refs for r in rs]
    toks = tokenize(flat, tokenizer=tokenizer)
    res = {i: [toks[i]] for i in range(len(cands))}
    gts, k = {}, len(cands)
    for i, rs in enumerate(refs):
        gts[i] = toks[k:k + len(rs)]
        k += len(rs)
    return score_tokenized(names, gts, res, tokenizer=tokenizer)


def classic_score(name: str, candidates: Sequence[str], references: Sequence[Sequence[str]], *,
                  tokenizer: str = "ptb") -> ClassicResult:
    """One classic metric (see :func:`classic_scores`)."""
    return classic_scores([name], candidates, references, tokenizer=tokenizer)[name]


# ------------------------------------------------------------------------------------ SPICE
def _spice_jars() -> Path:
    found = corenlp_dir()
    if found is None:
        where = spice_dirs()[0]
        raise CapscoreError(f"SPICE needs the Stanford CoreNLP 3.6.0 jars ({' and '.join(CORENLP_JARS)}, from "
                            f"stanford-corenlp-full-2015-12-09.zip); put them in {where} "
                            "(or set CAPSCORE_SPICE_DIR to their folder)")
    return found


def spice(gts: dict, res: dict) -> np.ndarray:
    """Per-caption SPICE F (``All.f``) from pycocoevalcap's SPICE 1.0 jar on tokenised ``gts``/``res`` (module
    docstring: CoreNLP jars from a local folder; temporary files and the parse cache in capscore's cache)."""
    import numpy as np

    from capscore.embed.cache import DEFAULT_CACHE_DIR

    _need_java("SPICE")
    jars = _spice_jars()
    spice_dir = _pycoco() / "spice"
    keys = sorted(res)
    data = [{"image_id": k, "test": res[k][0], "refs": gts[k]} for k in keys]
    work = DEFAULT_CACHE_DIR / "spice"
    (work / "cache").mkdir(parents=True, exist_ok=True)
    cp = os.pathsep.join([str(spice_dir / "spice-1.0.jar"), str(spice_dir / "lib" / "*"),
                          *(str(jars / j) for j in CORENLP_JARS)])
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        inp, outp = Path(tmp) / "in.json", Path(tmp) / "out.json"
        inp.write_text(json.dumps(data), encoding="utf-8")
        cmd = ["java", "-Xmx8G", "-cp", cp, "edu.anu.spice.SpiceScorer", str(inp), "-cache", str(work / "cache"),
               "-out", str(outp), "-subset", "-silent"]
        proc = subprocess.run(cmd, cwd=spice_dir, capture_output=True, text=True)
        if proc.returncode != 0 or not outp.exists():
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise CapscoreError(f"SPICE (java) failed with exit code {proc.returncode}: {last}")
        results = json.loads(outp.read_text(encoding="utf-8"))
    by_id = {r["image_id"]: r["scores"]["All"]["f"] for r in results}

    def f(v):
        try:
            return float(v)
        except (TypeError, ValueError):
            return float("nan")

    order = list(res)
    return np.asarray([f(by_id.get(k)) for k in order], dtype=float)


# ------------------------------------------------------------------------------------ registry rows
@dataclass(frozen=True)
class ClassicFormula:
    """The registry's formula for one classic metric: it reads the captions and references of the batch (no
    vectors) and scores them together with pycocoevalcap. Option ``tokenizer`` (``"ptb"`` default, ``"simple"``,
    ``"none"``). CIDEr declares ``corpus``: its IDF comes from the batch, so a face must pass the whole
    evaluated set as one batch."""

    metric: str
    needs: frozenset = frozenset({"refs"})
    columns: tuple = ()

    def compute(self, batch):
        from capscore._log import warn
        from capscore.scores.metric import Values

        tok = batch.options.get("tokenizer", "ptb")
        res = classic_score(self.metric, [batch.prefix + r.caption for r in batch.records],
                            [[batch.prefix + x for x in r.refs] for r in batch.records], tokenizer=tok)
        for w in res.warnings:
            warn(w)
        return Values([float(v) for v in res.values])

    def describe(self, options) -> str:
        """The identity a result records in place of a backbone's."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("pycocoevalcap")
        except PackageNotFoundError:
            v = "(not installed)"
        return f"pycocoevalcap {v}, {options.get('tokenizer', 'ptb')} tokenizer"


def _register() -> None:
    from capscore.scores.metric import Metric, register

    cites = {"bleu1": "bleu", "bleu2": "bleu", "bleu3": "bleu", "bleu4": "bleu"}
    ranges = {"cider": (0.0, 10.0)}  # CIDEr-D: 10 x a mean of cosines
    for name in CLASSIC_METRICS:
        needs = frozenset({"refs", "corpus"}) if name == "cider" else frozenset({"refs"})
        register(Metric(name=name, citation=CITATIONS[cites.get(name, name)], image=ClassicFormula(name, needs),
                        needs_refs=True, prefix="", range=ranges.get(name, (0.0, 1.0)),
                        note="text only (no backbone): pycocoevalcap on PTB-tokenised captions and references"
                             + ("; IDF over the whole evaluated set" if name == "cider" else "")
                             + ("; needs Java" if name in NEEDS_JAVA else "")
                             + ("; needs the CoreNLP 3.6.0 jars" if name == "spice" else ""),
                        default_model=""))


_register()


__all__ = [
    "CLASSIC_METRICS", "ClassicFormula", "CIDER_MIN_IMAGES", "ClassicResult", "TOKENIZERS", "classic_score", "classic_scores",
    "corenlp_dir", "java", "score_tokenized", "simple_tokenize", "spice", "spice_dirs", "tokenize",
]
