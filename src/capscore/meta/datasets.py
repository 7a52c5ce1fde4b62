"""Human-judgment datasets, read from local copies in their published formats.

Nothing is downloaded. Each loader takes the dataset file(s) and an image root
and returns either a :class:`RatingSet` (one human score per caption) or a
:class:`PairSet` (two captions of one image, one preferred by humans). Records
know their source (``file:line`` or ``file: key``) for error messages. The rules
that decide *which* judgments count follow the reference evaluation code; each
loader's docstring states them, and what was left out is counted in ``skipped``.

Formats (see ``docs/meta.md`` for the files each one expects):

=========================  ===========================================================================
``flickr8k-expert``        ``flickr8k.json`` of clipscore/pacscore: ``{key: {image_id, image_path,
                           ground_truth: [refs], human_judgement: [{image_id, image_path, caption,
                           rating}]}}`` — one item per expert rating (1–4).
``flickr8k-cf``            ``crowdflower_flickr8k.json``, same shape; rating = share of "yes".
``composite``              CSV with ``imgid``, ``cand`` or ``mt``, ``refs`` (a list), ``score``.
``pascal50s``              ``pair_pascal.mat`` + ``consensus_pascal.mat`` (the CIDEr release), or an
                           equivalent JSON/JSONL/CSV of pairs.
``foil``                   ``foilv1.0_test_2017.json`` + COCO ``captions_val2014.json``.
``polaris`` / ``nebula`` /  the authors' CSVs (``mt, refs, score, imgid``: Polos' ``polaris_test.csv``,
``longcap-arena``          DENEB's ``nebula_test.csv``, VELA's ``{desc,rel,flu}_dci_{val,test}.csv``), or the
                           Hugging Face parquet (or arrow) files of the dataset cards: Polaris
                           (``refs, cand, img, human_score``), Nebula (``file_name, image, refs, mt,
                           human_score``), LongCap-Arena (``file_name, image, refs, cand, score``).
``decapbench``             JSONL with ``image``, ``caption``, ``score`` (long-caption judgments).
``m-capeval1k``            JSONL with ``image``, ``caption``, ``score``, ``lang``.
``generic``                JSONL or CSV: ``image``, ``caption``, a human score (``score``/``human``/
                           ``human_score``/``rating``), optional ``refs``, ``group``, ``system``,
                           ``lang``, ``id``.
=========================  ===========================================================================

Captions and references are whitespace-normalised (``" ".join(s.split())``) as in
the clipscore and pacscore Flickr8k code; every "is this caption a reference"
comparison is made on the normalised strings.
"""
from __future__ import annotations

import ast
import csv
import hashlib
import json
import math
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from capscore._optional import require
from capscore.data.records import Record
from capscore.data.images import ImageRef
from capscore.data.jsonl import (DuplicateKey, csv_problem, iter_csv_rows, iter_jsonl, json_problem, surrogate_problem,
                                 unique_keys)
from capscore.errors import CapscoreError, InputError, unknown_name
from capscore.meta import oracle
from capscore.meta.sets import Pair, PairSet, Rated, RatingSet
from capscore.embed import cache as embed_cache

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))

PASCAL_CATEGORIES = {1: "HC", 2: "HI", 3: "HM", 4: "MM"}
PASCAL_ORDER = ("HC", "HI", "HM", "MM")
PASCAL_VOTES = 48  # reference sentences (and judgments) per Pascal-50S pair


def norm(text: str) -> str:
    """Whitespace normalisation used for captions, references and every comparison between them."""
    return " ".join(text.split())


# ------------------------------------------------------------------------------------ small readers
def _path(p, what: str) -> Path:
    path = Path(p).expanduser()
    if not path.exists():
        raise InputError(str(path), f"{what} not found")
    return path


def _load_json(path: Path):
    """A JSON file whose every object names each key once (:func:`capscore.data.jsonl.unique_keys`: a key
    given twice is an error naming it, where ``json`` alone would keep the last entry without a word)."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            text = f.read()
        data = json.loads(text, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{e.lineno}", f"malformed JSON ({e.msg}, column {e.colno})") from None
    except DuplicateKey as e:
        raise InputError(f"{path}: key {e.key!r}", "this key appears twice in one JSON object (the second entry "
                         "would silently replace the first); keep one") from None
    except UnicodeDecodeError:
        raise InputError(str(path), "not UTF-8 text") from None
    except OSError as e:
        raise InputError(str(path), f"cannot read file ({e.strerror or e})") from None
    except (RecursionError, ValueError) as e:  # nested too deep; an integer over Python's 4300 digits
        raise InputError(str(path), f"unreadable JSON ({json_problem(e)})") from None
    if (problem := surrogate_problem(text, data)) is not None:
        raise InputError(str(path), problem)
    return data


def read_rows(path: Path) -> Iterator[tuple[str, dict]]:
    """Rows of a JSONL or CSV file as ``("file:line", dict)``; a malformed line raises InputError."""
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".csv", ".json"):
        raise InputError(str(path), f"unsupported format {path.suffix or '(no suffix)'!r}",
                         expected="a .jsonl, .csv or .json file")
    if suffix == ".json":
        data = _load_json(path)
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise InputError(str(path), "wrong JSON shape", expected="a list of objects",
                             got=type(data).__name__)
        for i, row in enumerate(data):
            yield f"{path}: item {i}", row
        return
    if suffix != ".csv":
        yield from iter_jsonl(path)
        return
    try:
        f = open(path, encoding="utf-8-sig", newline="")  # -sig: a BOM (Excel) is accepted, as by `score`
    except OSError as e:
        raise InputError(str(path), f"cannot read file ({e.strerror or e})") from None
    with f:
        reader = csv.DictReader(f, strict=True)  # an unterminated quote is an error, not a swallowed file
        try:
            reader.fieldnames  # the header first, so line numbers below count from it
        except (csv.Error, UnicodeDecodeError) as e:
            raise InputError(f"{path}:1", csv_problem(e)) from None
        for _, last, row in iter_csv_rows(reader, path):
            where = f"{path}:{last}"
            if None in row or any(v is None for v in row.values()):
                raise InputError(where, f"malformed CSV row: {len(reader.fieldnames)} fields expected")
            yield where, row


def _pick(row: Mapping, names: Sequence[str]):
    for n in names:
        if n in row and row[n] not in (None, ""):
            return n, row[n]
    return None, None


def _text(value, where: str, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputError(where, f"{what} must be a non-empty string", got=value)
    return norm(value)


def _number(value, where: str, what: str) -> float:
    """A human score -> float (NaN stays NaN: the caller counts and skips it)."""
    if isinstance(value, bool):
        raise InputError(where, f"{what} must be a number", got=value)
    number = None
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:  # an integer too large for a float
            raise InputError(where, f"{what} is too large", got=value) from None
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            pass
    if number is None:
        raise InputError(where, f"{what} must be a number", got=value)
    if math.isinf(number):  # float('9' * 5000) is inf: never let it through as a score
        raise InputError(where, f"{what} is infinite or too large", got=value)
    return number


def human_score(value, where: str, what: str, scale: tuple[float, float] | None = None) -> float:
    """A human judgment -> float: a number (or its text), never infinite, within ``scale`` (lo, hi) when the
    dataset has one; NaN stays NaN (the loaders count and skip it). Every reader of ratings calls this."""
    number = _number(value, where, what)
    if scale is not None and not math.isnan(number) and not scale[0] <= number <= scale[1]:
        raise InputError(where, f"{what} is outside the dataset's scale [{scale[0]:g}, {scale[1]:g}]", got=value)
    return number


def _count_of(value, where: str, what: str) -> int:
    """A vote count: a whole number >= 0 (3.0 is 3; 2.5, NaN and -1 are errors)."""
    number = _number(value, where, what)
    if math.isnan(number) or number < 0 or number != int(number):
        raise InputError(where, f"{what} must be a whole number >= 0", got=value)
    return int(number)


def _refs(value, where: str) -> tuple[str, ...]:
    """A reference list: a list, a JSON list, a Python list literal (as in the DENEB/Polos CSVs) or one string."""
    if value is None or value == "":
        return ()
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            try:
                value = ast.literal_eval(value)  # literals only: never executes code
            except (ValueError, SyntaxError, RecursionError, MemoryError):
                raise InputError(where, "'refs' is not a readable list", got=value) from None
    if isinstance(value, str):
        value = [value]
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not all(isinstance(r, str) for r in value):
        raise InputError(where, "'refs' must be a list of strings", got=value)
    return tuple(norm(r) for r in value if r.strip())


def _image(root: Path | None, name: str, *, tries: Sequence[str] = ()) -> Path:
    """Resolve an image name against the image root: the name itself, then each alternative in
    ``tries`` (other spellings, the file's base name); the first that exists wins, else the first."""
    p = Path(name).expanduser()
    if p.is_absolute() or root is None:
        return p
    cands = [root / name] + [root / t for t in tries]
    for c in cands:
        if c.is_file():
            return c
    return cands[0]


def _images_root(images) -> Path | None:
    if images is None:
        return None
    root = Path(images).expanduser()
    if not root.is_dir():
        raise InputError(str(root), "--images folder not found")
    return root


def _count(skipped: dict, why: str) -> None:
    skipped[why] = skipped.get(why, 0) + 1


# ------------------------------------------------------------------------------------ Flickr8k
def load_flickr8k(path, images, *, variant: str = "expert") -> RatingSet:
    """Flickr8k-Expert (``variant="expert"``) or Flickr8k-CrowdFlower (``"crowdflower"``).

    Rules (Hessel et al. 2021, appendix A, following the SPICE paper; clipscore's
    ``flickr8k_example``): a NaN rating is skipped and counted. Expert: one item per
    expert rating (the JSON lists each of the three experts' ratings separately);
    a candidate that is itself one of the image's references is skipped. CrowdFlower:
    the rating is the share of "yes" answers, and the candidate is removed from its
    own references. The published JSONs already apply these rules; applying them
    again is a no-op there and protects hand-made files. Images are looked up as
    ``images/image_path``, then with the "Flicker8k" typo fixed, then by base name
    (pacscore keeps only the base name), then in ``images/images/``.
    """
    if variant not in ("expert", "crowdflower"):
        raise CapscoreError(f"The 'variant' parameter of load_flickr8k must be 'expert' or 'crowdflower'; got {variant!r} instead.")
    path = _path(path, "Flickr8k judgments file")
    root = _images_root(images)
    data = _load_json(path)
    if not isinstance(data, dict):
        raise InputError(str(path), "wrong JSON shape", expected="{key: {image_path, ground_truth, human_judgement}}",
                         got=type(data).__name__)
    name = "flickr8k-expert" if variant == "expert" else "flickr8k-cf"
    items: list[Rated] = []
    skipped: dict[str, int] = {}
    for key, entry in data.items():
        where = f"{path}: key {key!r}"
        if not isinstance(entry, dict) or not isinstance(entry.get("human_judgement"), list):
            raise InputError(where, "entry needs 'human_judgement' (a list) and 'ground_truth'", got=entry)
        gts = entry.get("ground_truth", [])
        if not isinstance(gts, list) or not all(isinstance(g, str) for g in gts):
            raise InputError(where, "'ground_truth' must be a list of strings", got=gts)
        refs = tuple(norm(g) for g in gts)
        for j, hj in enumerate(entry["human_judgement"]):
            w = f"{where}, judgement {j}"
            if not isinstance(hj, dict):
                raise InputError(w, "a judgement must be an object with 'caption' and 'rating'", got=hj)
            rating = human_score(hj.get("rating"), w, "'rating'", DATASETS[name].scale)
            if math.isnan(rating):
                _count(skipped, "NaN rating")
                continue
            cand = _text(hj.get("caption"), w, "'caption'")
            if variant == "expert":
                if cand in refs:
                    _count(skipped, "candidate is one of its references")
                    continue
                cand_refs = refs
            else:
                cand_refs = tuple(r for r in refs if r != cand)
            rel = hj.get("image_path") or entry.get("image_path")
            if not isinstance(rel, str) or not rel:
                raise InputError(w, "no 'image_path'")
            base = Path(rel).name
            img = _image(root, rel, tries=(rel.replace("Flicker8k", "Flickr8k"), base, f"images/{base}"))
            rec = Record.make(f"{key}#{j}", img, cand, cand_refs, source=w)
            items.append(Rated(rec, rating, group=str(key)))
    return RatingSet(name, str(path), tuple(items), skipped, {"variant": variant})


# ------------------------------------------------------------------------------------ Composite
def load_composite(path, images) -> RatingSet:
    """Composite (Aditya et al. 2015) in the CSV of the Polos/DENEB evaluation code: columns
    ``imgid``, ``cand`` (or ``mt``), ``refs`` (a list, JSON or Python literal) and ``score``.
    The rated caption is removed from its references; NaN scores are skipped and counted.
    Images: ``images/imgid`` (then by base name)."""
    path = _path(path, "Composite CSV")
    root = _images_root(images)
    items, skipped, seen = [], {}, set()
    for where, row in read_rows(path):
        for col in ("imgid", "refs", "score"):
            if col not in row:
                raise InputError(where, f"missing column {col!r}", expected="imgid, cand (or mt), refs, score")
        _, cand = _pick(row, ("cand", "mt"))
        if cand is None:
            raise InputError(where, "missing caption column", expected="'cand' or 'mt'")
        score = human_score(row["score"], where, "'score'", DATASETS["composite"].scale)
        if math.isnan(score):
            _count(skipped, "NaN score")
            continue
        cand = _text(cand, where, "the caption")
        refs = tuple(r for r in _refs(row["refs"], where) if r != cand)
        imgid = str(row["imgid"])
        img = _image(root, imgid, tries=(Path(imgid).name,))
        ident = str(row.get("id") or where.rsplit(":", 1)[-1])
        if ident in seen:
            raise InputError(where, f"duplicate id {ident!r}")
        seen.add(ident)
        rec = Record.make(ident, img, cand, refs, source=where)
        items.append(Rated(rec, score, group=imgid))
    return RatingSet("composite", str(path), tuple(items), skipped)


# ------------------------------------------------------------------------------------ generic / JSONL
HUMAN_COLUMNS = ("score", "human", "human_score", "rating")


def load_generic(path, images, *, name: str = "generic", require_lang: bool = False) -> RatingSet:
    """JSONL/CSV/JSON-list of ``image``, ``caption``, a human score (``score``, ``human``,
    ``human_score`` or ``rating``) and optionally ``refs``, ``group`` (default: the image; used
    for sample-wise τ), ``system`` (for system-level correlation), ``lang`` and ``id``.
    NaN scores are skipped and counted."""
    path = _path(path, "judgments file")
    root = _images_root(images)
    items, skipped, seen = [], {}, set()
    for n, (where, row) in enumerate(read_rows(path), 1):
        if "image" not in row or "caption" not in row:
            raise InputError(where, "missing field", expected="'image', 'caption' and a human score", got=sorted(row))
        col, human = _pick(row, HUMAN_COLUMNS)
        if col is None:
            raise InputError(where, "no human score", expected=f"one of {', '.join(HUMAN_COLUMNS)}")
        human = human_score(human, where, repr(col), DATASETS[name].scale if name in DATASETS else None)
        if math.isnan(human):
            _count(skipped, f"NaN {col}")
            continue
        image = row["image"]
        if not isinstance(image, str) or not image:
            raise InputError(where, "'image' must be a non-empty string", got=image)
        lang = str(row.get("lang") or "")
        if require_lang and not lang:
            raise InputError(where, "missing 'lang'")
        ident = str(row.get("id") if row.get("id") not in (None, "") else n)
        if ident in seen:
            raise InputError(where, f"duplicate id {ident!r}")
        seen.add(ident)
        rec = Record.make(ident, _image(root, image), _text(row["caption"], where, "'caption'"),
                          _refs(row.get("refs"), where), system=str(row.get("system") or ""), source=where)
        items.append(Rated(rec, human, group=str(row.get("group") or image), lang=lang))
    return RatingSet(name, str(path), tuple(items), skipped)


# ------------------------------------------------------------------------------------ Pascal-50S
def _leaf(x):
    """Unwrap MATLAB cells/char arrays as scipy.io.loadmat returns them -> str or number."""
    while isinstance(x, np.ndarray):
        if x.dtype.kind == "U" and x.size <= 1:
            return str(x.reshape(-1)[0]) if x.size else ""
        if x.size != 1:
            raise ValueError(f"expected one value, got an array of shape {x.shape}")
        x = x.reshape(-1)[0]
    if isinstance(x, bytes):
        return x.decode()
    return x.item() if isinstance(x, np.generic) else x


def _fields(el) -> list:
    """One element of a MATLAB struct array (numpy.void) or cell row -> its fields, unwrapped."""
    if isinstance(el, np.void) and el.dtype.names:
        parts = [el[n] for n in el.dtype.names]
    else:
        parts = list(np.asarray(el, dtype=object).reshape(-1))
    return [_leaf(p) for p in parts]


def pascal_label(votes_a: int, votes_b: int, rng: np.random.Generator) -> int:
    """Majority of the reference votes (0 = A, 1 = B); a tie is broken by one draw from ``rng``
    (A if the draw is < 0.5) — the rule of the clipscore Pascal-50S loader, with a seeded draw."""
    if votes_a != votes_b:
        return 0 if votes_a > votes_b else 1
    return 0 if rng.random() < 0.5 else 1


def load_pascal50s(path, images, *, seed: int = 0) -> PairSet:
    """Pascal-50S (Vedantam et al. 2015): 4000 pairs in four categories (HC, HI, HM, MM), 48 reference
    sentences per image, each with one human vote for caption A or B.

    ``path`` is the folder holding ``pair_pascal.mat`` and ``consensus_pascal.mat`` (directly or in
    ``pyCIDErConsensus/``), or a JSON/JSONL/CSV with one pair per row: ``image``, ``a``, ``b``,
    ``category`` (HC/HI/HM/MM or 1–4), ``refs`` (list) and either ``label`` (0/1 or "a"/"b") or
    ``votes_a`` and ``votes_b``. The label is the majority vote; ties are broken by a draw from
    ``numpy.random.default_rng(seed)``, one draw per tied pair in file order. Images:
    ``images/JPEGImages/NAME`` or ``images/NAME``.
    """
    path = _path(path, "Pascal-50S data")
    root = _images_root(images)
    rng = np.random.default_rng(seed)
    if path.is_dir():
        items = _pascal_from_mat(path, root, rng)
    else:
        items = _pascal_from_rows(path, root, rng)
    return PairSet("pascal50s", str(path), tuple(items), {}, {"seed": seed})


def _pascal_image(root: Path | None, name: str) -> Path:
    return _image(root, f"JPEGImages/{name}", tries=(name,))


def _pascal_from_mat(folder: Path, root, rng) -> list[Pair]:
    from scipy.io import loadmat  # noqa: PLC0415  (deferred: scipy)

    base = folder if (folder / "pair_pascal.mat").exists() else folder / "pyCIDErConsensus"
    pair_file, cons_file = base / "pair_pascal.mat", base / "consensus_pascal.mat"
    for f in (pair_file, cons_file):
        if not f.exists():
            raise InputError(str(folder), f"{f.name} not found", expected="pair_pascal.mat and consensus_pascal.mat")
    try:
        pm, cm = loadmat(str(pair_file)), loadmat(str(cons_file))
    except Exception as e:  # scipy raises several types for a non-MAT file
        raise InputError(str(base), f"cannot read MATLAB file ({e})") from None
    for m, f, keys in ((pm, pair_file, ("new_input", "category")), (cm, cons_file, ("triplets",))):
        for k in keys:
            if k not in m:
                raise InputError(str(f), f"no variable {k!r}", expected=", ".join(keys))
    pairs, cats, trips = pm["new_input"].reshape(-1), pm["category"].reshape(-1), cm["triplets"].reshape(-1)
    if len(cats) != len(pairs) or len(trips) != PASCAL_VOTES * len(pairs):
        raise InputError(str(base), "sizes do not match",
                         expected=f"one category per pair and {PASCAL_VOTES} triplets per pair",
                         got=f"{len(pairs)} pairs, {len(cats)} categories, {len(trips)} triplets")
    out = []
    for i, el in enumerate(pairs):
        where = f"{pair_file}: pair {i}"
        try:
            name, a, b = _fields(el)
            cat = int(_leaf(cats[i]))
            votes = {}
            refs = []
            for j in range(i * PASCAL_VOTES, (i + 1) * PASCAL_VOTES):
                ref, c1, c2, winner = _fields(trips[j])
                refs.append(norm(str(ref)))
                chosen = norm(str(c1 if winner == 1 else c2))
                votes[chosen] = votes.get(chosen, 0) + 1
        except (ValueError, TypeError) as e:
            raise InputError(where, f"unexpected MATLAB structure ({e})") from None
        if cat not in PASCAL_CATEGORIES:
            raise InputError(where, "category must be 1-4 (HC, HI, HM, MM)", got=cat)
        a, b = norm(str(a)), norm(str(b))
        if set(votes) - {a, b}:
            raise InputError(f"{cons_file}: triplets of pair {i}", "a vote names a caption that is not in the pair",
                             got=sorted(set(votes) - {a, b})[0])
        va, vb = votes.get(a, 0), votes.get(b, 0)
        out.append(Pair(str(i), ImageRef(path=_pascal_image(root, str(name)), name=f"{where}: image {name}"),
                        a, b, tuple(refs), PASCAL_CATEGORIES[cat], pascal_label(va, vb, rng), where, (va, vb)))
    return out


def _pascal_from_rows(path: Path, root, rng) -> list[Pair]:
    out = []
    for n, (where, row) in enumerate(read_rows(path)):
        _, a = _pick(row, ("a", "caption_a"))
        _, b = _pick(row, ("b", "caption_b"))
        if a is None or b is None or "image" not in row or "category" not in row:
            raise InputError(where, "missing field", expected="image, a, b, category, refs, label or votes_a/votes_b",
                             got=sorted(row))
        cat = row["category"]
        if str(cat).strip().isdigit():
            cat = PASCAL_CATEGORIES.get(int(cat), str(cat))
        cat = str(cat).strip().upper()
        if cat not in PASCAL_ORDER:
            raise InputError(where, "category must be HC, HI, HM or MM (or 1-4)", got=row["category"])
        votes = None
        if row.get("label") not in (None, ""):
            lab = str(row["label"]).strip().lower()
            if lab not in ("0", "1", "a", "b"):
                raise InputError(where, "'label' must be 0/1 or a/b", got=row["label"])
            label = 0 if lab in ("0", "a") else 1
        elif "votes_a" in row and "votes_b" in row:
            va, vb = (_count_of(row[k], where, repr(k)) for k in ("votes_a", "votes_b"))
            votes, label = (va, vb), pascal_label(va, vb, rng)
        else:
            raise InputError(where, "no human preference", expected="'label' or 'votes_a' and 'votes_b'")
        ident = str(row.get("id") if row.get("id") not in (None, "") else n)
        out.append(Pair(ident, ImageRef(path=_pascal_image(root, str(row["image"])), name=f"{where}: image {row['image']}"),
                        _text(a, where, "'a'"), _text(b, where, "'b'"), _refs(row.get("refs"), where),
                        cat, label, where, votes))
    return out


# ------------------------------------------------------------------------------------ FOIL
def load_foil(path, images, *, coco_captions=None) -> PairSet:
    """FOIL-COCO (Shekhar et al. 2017) test set: ``foilv1.0_test_2017.json`` (COCO-style ``images`` and
    ``annotations``; an annotation ``id`` is shared by one original caption, ``foil: false``, and its
    foiled versions, ``foil: true``) with references from COCO ``captions_val2014.json``
    (``coco_captions``; default: that file next to ``path`` or in ``annotations/`` beside it).

    One pair per foiled caption: (original, foil), the original preferred. References are the
    image's COCO captions minus the original (compared after whitespace normalisation); the
    1-ref setting uses the first of them, the 4-ref setting all of them (4 for most COCO images),
    as in the PAC-S / Polos evaluation code. Images: ``images/file_name``.
    """
    path = _path(path, "FOIL annotations")
    root = _images_root(images)
    if coco_captions is None:
        for c in (path.parent / "captions_val2014.json", path.parent / "annotations" / "captions_val2014.json"):
            if c.exists():
                coco_captions = c
                break
        else:
            raise InputError(str(path), "COCO references not found",
                             expected="captions_val2014.json beside the FOIL file, or --coco-captions FILE")
    coco_path = _path(coco_captions, "COCO captions file")
    foil, coco = _load_json(path), _load_json(coco_path)
    for data, p in ((foil, path), (coco, coco_path)):
        if not isinstance(data, dict) or not isinstance(data.get("annotations"), list):
            raise InputError(str(p), "wrong JSON shape", expected="COCO-style {images, annotations}")
    refs_by_image: dict = {}
    for a in coco["annotations"]:
        if isinstance(a, dict) and isinstance(a.get("caption"), str):
            refs_by_image.setdefault(a.get("image_id"), []).append(norm(a["caption"]))
    files = {im.get("id"): im.get("file_name") for im in foil.get("images", []) if isinstance(im, dict)}
    groups: dict = {}
    for k, a in enumerate(foil["annotations"]):
        where = f"{path}: annotation {k}"
        if not isinstance(a, dict) or not {"id", "image_id", "caption", "foil"} <= set(a):
            raise InputError(where, "annotation needs id, image_id, caption, foil", got=a)
        if not isinstance(a["foil"], bool):  # "false" as a string would count as a foil
            raise InputError(where, "'foil' must be true or false", got=a["foil"])
        g = groups.setdefault(a["id"], {"orig": [], "foil": [], "image_id": a["image_id"], "where": where})
        if g["image_id"] != a["image_id"]:
            raise InputError(where, f"annotation id {a['id']!r} names image {a['image_id']!r} here and "
                             f"{g['image_id']!r} at {g['where']}")
        g["foil" if a["foil"] else "orig"].append(_text(a["caption"], where, "'caption'"))
    items, skipped = [], {}
    for ann_id, g in groups.items():
        if len(g["orig"]) != 1:
            _count(skipped, "annotation id without exactly one original caption")
            continue
        orig = g["orig"][0]
        if g["image_id"] not in refs_by_image:
            _count(skipped, "image without COCO references")
            continue
        refs = tuple(r for r in refs_by_image[g["image_id"]] if r != orig)
        fname = files.get(g["image_id"])
        if fname is None:
            if not isinstance(g["image_id"], int) or isinstance(g["image_id"], bool):
                raise InputError(g["where"], "image_id names no entry of 'images' and is not a COCO number",
                                 got=g["image_id"])
            fname = f"COCO_val2014_{g['image_id']:012d}.jpg"
        img = ImageRef(path=_image(root, fname, tries=(f"val2014/{fname}",)), name=f"{g['where']}: image {fname}")
        for j, f in enumerate(g["foil"]):
            items.append(Pair(f"{ann_id}#{j}", img, orig, f, refs, "foil", 0, g["where"]))
    return PairSet("foil", str(path), tuple(items), skipped, {"coco_captions": str(coco_path)})


# ------------------------------------------------------------------------------------ HF parquet / arrow
HF_COLUMNS = {
    # name: (caption columns, image columns, human-score columns)
    "polaris": (("cand",), ("img",), ("human_score",)),
    "nebula": (("mt", "cand"), ("image", "file_name"), ("human_score",)),
    "longcap-arena": (("cand",), ("image", "file_name"), ("score", "human_score")),
}


def _table_files(path: Path, split: str | None) -> list[Path]:
    if path.is_file():
        return [path]
    pats = [f"{split}-*.parquet", f"{split}*.parquet", f"{split}-*.arrow", f"{split}*.arrow",
            f"data/{split}-*.parquet", f"data/{split}-*.arrow"] if split else ["*.parquet", "*.arrow", "data/*.parquet"]
    for pat in pats:
        found = sorted(p for p in path.glob(pat) if p.is_file())
        if found:
            return found
    raise InputError(str(path), f"no parquet/arrow files{' for split ' + repr(split) if split else ''}",
                     expected="a .parquet/.arrow file, or a folder with SPLIT-*.parquet (give --split)")


def _read_table(p: Path):
    pa, pq = require("pyarrow", purpose="reading Parquet"), require("pyarrow.parquet", purpose="reading Parquet")

    try:
        if p.suffix == ".arrow":
            with pa.memory_map(str(p)) as src:
                try:
                    return pa.ipc.open_stream(src).read_all()
                except pa.ArrowInvalid:
                    return pa.ipc.open_file(src).read_all()
        return pq.read_table(str(p))
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(str(p), f"cannot read as parquet/arrow ({e})") from None


def _embedded_image(value, where: str, root: Path | None, extract_to: Path) -> tuple[Path, str]:
    """An HF ``Image`` cell ({bytes, path}) or a file name -> (a path on disk, group key)."""
    if isinstance(value, dict):
        data, name = value.get("bytes"), value.get("path")
        if data:
            digest = hashlib.sha256(data).hexdigest()
            suffix = Path(name).suffix if isinstance(name, str) and Path(name).suffix else ".img"
            out = extract_to / f"{digest[:32]}{suffix}"
            if not out.exists():
                extract_to.mkdir(parents=True, exist_ok=True)
                tmp = out.with_suffix(out.suffix + f".{os.getpid()}.tmp")
                tmp.write_bytes(data)
                os.replace(tmp, out)
            return out, name or digest[:32]
        value = name
    if isinstance(value, str) and value:
        return _image(root, value, tries=(Path(value).name,)), value
    raise InputError(where, "no image (neither embedded bytes nor a file name)", got=value)


def load_hf(path, images, *, name: str, split: str | None = None, extract_to=None) -> RatingSet:
    """Polaris, Nebula or LongCap-Arena from local parquet/arrow files of their Hugging Face releases.

    ``path``: one file, or the dataset folder with ``--split`` (e.g. ``test``; LongCap-Arena's splits
    are ``dci_val.desc``, ``dci_test.rel``, ... — one aspect each). Embedded images are written
    once to ``extract_to`` (default: ``images`` if given, else the capscore cache folder) under their
    content hash, so the encoder reads them like any file; rows whose image is only a file name are
    looked up in ``images``. References come from ``refs``; NaN scores are skipped and counted.
    """
    if name not in HF_COLUMNS:
        raise unknown_name("Hugging Face judgment dataset", name, HF_COLUMNS)
    path = _path(path, f"{name} data")
    root = _images_root(images)
    if extract_to is None:
        extract_to = root if root is not None else embed_cache.DEFAULT_CACHE_DIR / "meta-images"
    extract_to = Path(extract_to)
    cap_cols, img_cols, human_cols = HF_COLUMNS[name]
    items, skipped = [], {}
    files = _table_files(path, split)
    for f in files:
        table = _read_table(f)
        cols = set(table.column_names)
        need = [("caption", cap_cols), ("image", img_cols), ("human score", human_cols)]
        chosen = {}
        for what, options in need:
            hit = [c for c in options if c in cols]
            if not hit:
                raise InputError(str(f), f"no {what} column", expected=" or ".join(options), got=sorted(cols))
            chosen[what] = hit[0]
        names = [chosen["caption"], chosen["image"], chosen["human score"]] + (["refs"] if "refs" in cols else [])
        row_no = 0
        for batch in table.select(names).to_batches(max_chunksize=1024):
            for r in batch.to_pylist():
                where = f"{f}: row {row_no}"
                row_no += 1
                human = human_score(r[chosen["human score"]], where, repr(chosen["human score"]), DATASETS[name].scale)
                if math.isnan(human):
                    _count(skipped, "NaN score")
                    continue
                img, group = _embedded_image(r[chosen["image"]], where, root, extract_to)
                cand = _text(r[chosen["caption"]], where, "the caption")
                rec = Record.make(where.rsplit("row ", 1)[-1] if len(files) == 1 else f"{f.name}:{where.rsplit('row ', 1)[-1]}",
                                  img, cand, _refs(r.get("refs"), where), source=where)
                items.append(Rated(rec, human, group=group))
    return RatingSet(name, str(path), tuple(items), skipped, {"split": split})


# ------------------------------------------------------------------------------------ Polaris, Nebula, LongCap-Arena
#: The authors' CSV release of each (their evaluation code reads these): file name per split.
PUBLISHED_CSV = {
    "polaris": "polaris_{split}.csv",  # Polos: data_en/polaris/polaris_{train,val,test}.csv (also on the HF card)
    "nebula": "nebula_{split}.csv",  # DENEB: data_en/nebula/nebula_{train,val,test}.csv
    "longcap-arena": "{aspect}_{part}.csv",  # VELA: {desc,rel,flu}_dci_{val,test}.csv
}
#: Hugging Face split names -> the CSV files' split names.
CSV_SPLIT = {"validation": "val", "valid": "val"}
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")


def _published_csv(name: str, folder: Path, split: str) -> Path | None:
    """The CSV of ``split`` inside a dataset folder (directly or in ``test/``), or None."""
    if name == "longcap-arena":
        part, _, aspect = split.partition(".")
        if not aspect:
            raise InputError(str(folder), f"LongCap-Arena split {split!r} names no aspect",
                             expected="dci_val.desc|rel|flu (TestA) or dci_test.desc|rel|flu (TestB)")
        file = PUBLISHED_CSV[name].format(aspect=aspect, part=part)
    else:
        file = PUBLISHED_CSV[name].format(split=CSV_SPLIT.get(split, split))
    for cand in (folder / file, folder / "test" / file):
        if cand.is_file():
            return cand
    return None


def load_rating_csv(path, images, *, name: str) -> RatingSet:
    """A judgment CSV in the Polos / DENEB / VELA layout: ``mt`` (or ``cand``), ``refs`` (a Python or JSON
    list), ``score`` (or ``human_score``) and ``imgid`` (or ``image``/``file_name``/``image_path``), one row
    per judgment. Images: ``images/imgid``, then with a usual image suffix added. NaN scores are skipped
    and counted; the group (for sample-wise τ) is the image."""
    path = _path(path, f"{name} CSV")
    root = _images_root(images)
    items, skipped = [], {}
    for where, row in read_rows(path):
        cap_col, cand = _pick(row, ("mt", "cand"))
        img_col, imgid = _pick(row, ("imgid", "image", "file_name", "image_path"))
        score_col, score = _pick(row, ("score", "human_score"))
        if cand is None or imgid is None or score is None:
            raise InputError(where, "missing column", expected="mt (or cand), refs, score, imgid", got=sorted(row))
        human = human_score(score, where, repr(score_col), DATASETS[name].scale if name in DATASETS else None)
        if math.isnan(human):
            _count(skipped, f"NaN {score_col}")
            continue
        imgid = str(imgid)
        img = _image(root, imgid, tries=(*(imgid + s for s in IMAGE_SUFFIXES), Path(imgid).name))
        rec = Record.make(str(row.get("id") or where.rsplit(":", 1)[-1]), img, _text(cand, where, repr(cap_col)),
                          _refs(row.get("refs"), where), source=where)
        items.append(Rated(rec, human, group=imgid))
    return RatingSet(name, str(path), tuple(items), skipped)


def load_published(name: str, path, images, *, split: str | None = None) -> RatingSet:
    """Polaris, Nebula or LongCap-Arena in either published layout.

    ``path``: the authors' CSV file; a Hugging Face parquet/arrow file; or the dataset folder, in which
    the CSV of ``split`` is looked for first (``polaris_test.csv``, ``nebula_test.csv``,
    ``desc_dci_val.csv`` …, directly or in ``test/``), then the parquet files of that split
    (``data/SPLIT-*.parquet``, :func:`load_hf`). ``split`` defaults to ``test``; LongCap-Arena's are
    ``dci_val.{desc,rel,flu}`` (TestA) and ``dci_test.{desc,rel,flu}`` (TestB).
    """
    if name not in PUBLISHED_CSV:
        raise unknown_name("published judgment dataset", name, PUBLISHED_CSV)
    p = _path(path, f"{name} data")
    split = split or ("dci_test.desc" if name == "longcap-arena" else "test")
    if p.is_file():
        return load_rating_csv(p, images, name=name) if p.suffix.lower() == ".csv" else load_hf(p, images, name=name)
    found = _published_csv(name, p, split)
    if found is not None:
        ds = load_rating_csv(found, images, name=name)
        return RatingSet(ds.name, ds.source, ds.items, ds.skipped, {"split": split})
    return load_hf(p, images, name=name, split=split)


# ------------------------------------------------------------------------------------ registry
@dataclass(frozen=True)
class DatasetSpec:
    """A human-judgment dataset: how to load it and which statistics its papers report."""

    name: str
    kind: str  # "ratings" or "pairs"
    columns: tuple[str, ...]  # conventional statistics (see capscore.meta.evaluate)
    files: str  # what --path / --images must hold (shown in errors and docs)
    citation: str
    ties: str = "half"  # pair datasets: how a metric tie counts
    scale: tuple[float, float] | None = None  # rating datasets: the human scores' range (checked on reading)


# Default columns follow the tables that report each dataset: Flickr8k-Expert, Flickr8k-CF and Composite
# show Kendall τ-b and τ-c side by side (PAC-S, Sarto et al. 2023, Tables "Flickr8k-Expert / Flickr8k-CF"
# and "Composite"); DeCapBench shows PCC ρ, 1 − R² (unfitted, ×1), Kd τ and Sp τ (SPECS Table 2);
# M-CapEval1k shows τ-c and Pearson ρ per language (PR-MCS Tables 1 and 3).
DATASETS: dict[str, DatasetSpec] = {
    s.name: s
    for s in [
        DatasetSpec("flickr8k-expert", "ratings", ("tau_b", "tau_c"),
                    "--path flickr8k.json (clipscore/pacscore format), --images the Flickr8k folder",
                    "Hodosh et al. 2013; protocol of Hessel et al. 2021 (CLIPScore), appendix A; "
                    "τ-b and τ-c as in Sarto et al. 2023 (PAC-S)", scale=(1.0, 4.0)),
        DatasetSpec("flickr8k-cf", "ratings", ("tau_b", "tau_c"),
                    "--path crowdflower_flickr8k.json, --images the Flickr8k folder",
                    "Hodosh et al. 2013; protocol of Hessel et al. 2021 (CLIPScore), appendix A", scale=(0.0, 1.0)),
        DatasetSpec("composite", "ratings", ("tau_b", "tau_c"),
                    "--path composite CSV (imgid, cand|mt, refs, score), --images folder of imgid files",
                    # the 1-5 ratings of Aditya et al., or the same rescaled to [0, 1] as some evaluation CSVs hold
                    "Aditya et al. 2015; CSV of the Polos/DENEB evaluation code", scale=(0.0, 5.0)),
        DatasetSpec("pascal50s", "pairs", ("HC", "HI", "HM", "MM", "mean"),
                    "--path folder with pair_pascal.mat + consensus_pascal.mat (or a JSON/CSV of pairs), "
                    "--images VOC2010 folder (JPEGImages/)",
                    "Vedantam et al. 2015 (CIDEr); 5-of-48 reference protocol of Sarto et al. 2023 (PAC-S)"),
        DatasetSpec("foil", "pairs", ("1-ref", "4-ref"),
                    "--path foilv1.0_test_2017.json, --coco-captions captions_val2014.json, --images COCO val2014",
                    "Shekhar et al. 2017 (FOIL-COCO); protocol of Hessel et al. 2021 / Sarto et al. 2023",
                    ties="loss"),
        DatasetSpec("polaris", "ratings", ("tau_c", "tau_b"),
                    "--path polaris_test.csv (Polos release), a parquet file, or the dataset folder (+ --split test)",
                    # normalised to [0, 1] (the Polos and DENEB heads regress them through a sigmoid)
                    "Wada et al. 2024 (Polos)", scale=(0.0, 1.0)),
        DatasetSpec("nebula", "ratings", ("tau_c", "tau_b"),
                    "--path nebula_test.csv (DENEB release), a parquet file, or the dataset folder (+ --split test)",
                    "Matsuda et al. 2024 (DENEB)", scale=(0.0, 1.0)),
        DatasetSpec("longcap-arena", "ratings", ("tau_c", "tau_b"),
                    "--path a {desc,rel,flu}_dci_{val,test}.csv, a parquet file, or the dataset folder "
                    "(+ --split dci_val.desc … TestA, dci_test.desc … TestB)",
                    "Matsuda et al. 2025 (VELA)", scale=(0.0, 1.0)),  # normalised, as the release's dataset card shows
        DatasetSpec("decapbench", "ratings", ("pearson", "one_minus_r2", "tau_b", "sample_tau_b"),
                    "--path JSONL with image, caption, score; --images folder",
                    "Ye et al. 2025 (DeCapBench / DCScore); columns of SPECS Table 2"),
        DatasetSpec("m-capeval1k", "ratings", ("by_lang:tau_c", "by_lang:pearson"),
                    "--path JSONL with image, caption, score, lang; --images folder",
                    "M-CapEval1k (Kim et al., PR-MCS): τ-c and Pearson ρ per language, Tables 1 and 3"),
        DatasetSpec("generic", "ratings", ("tau_b", "tau_c", "pearson", "spearman", "one_minus_r2_fit"),
                    "--path JSONL/CSV with image, caption, score[, refs, group, system, lang, id]; --images folder",
                    "your own judgments"),
        DatasetSpec("scenes-oracle", "ratings", ("tau_b", "tau_c", "pearson", "spearman", "one_minus_r2_fit"),
                    "no files: synthetic scenes with their ground-truth F1 as the score",
                    "capscore synthetic scenes"),
    ]
}


def get_dataset(name: str) -> DatasetSpec:
    if name not in DATASETS:
        raise unknown_name("dataset", name, DATASETS)
    return DATASETS[name]


def load_dataset(name: str, path=None, images=None, *, seed: int = 0, split: str | None = None,
                 coco_captions=None, **options) -> RatingSet | PairSet:
    """Load a dataset by its registry name (see :data:`DATASETS`)."""
    spec = get_dataset(name)
    if name == "scenes-oracle":
        return oracle.scenes_oracle(seed=seed, **options)
    if path is None:
        raise CapscoreError(f"--path is required for dataset {name!r}: {spec.files}")
    if name == "flickr8k-expert":
        return load_flickr8k(path, images, variant="expert")
    if name == "flickr8k-cf":
        return load_flickr8k(path, images, variant="crowdflower")
    if name == "composite":
        return load_composite(path, images)
    if name == "pascal50s":
        return load_pascal50s(path, images, seed=seed)
    if name == "foil":
        return load_foil(path, images, coco_captions=coco_captions)
    if name in PUBLISHED_CSV:
        return load_published(name, path, images, split=split)
    return load_generic(path, images, name=name, require_lang=name == "m-capeval1k")


__all__ = [
    "DATASETS", "DatasetSpec", "Pair", "PairSet", "Rated", "RatingSet", "get_dataset", "load_composite",
    "load_dataset", "load_flickr8k", "load_foil", "load_generic", "load_hf", "load_pascal50s", "load_published",
    "load_rating_csv", "norm",
    "pascal_label", "read_rows",
]
