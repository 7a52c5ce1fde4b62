"""Readers for the public compositional-benchmark formats, all into one shape.

Every suite item is *images x captions, matched on the diagonal* (as
CLIP_benchmark treats SugarCrepe and Winoground): image i's true captions are
``truth[i]`` (default ``(i,)``); every other caption is a negative for it.

=================  =============================================================  =====================
format             fields (per item)                                              file
=================  =============================================================  =====================
sugarcrepe         filename, caption, negative_caption                            one JSON per subset
sugarcrepe++       filename, caption, caption2, negative_caption                  one JSON per subset
aro-vg-relation    image_path, bbox_x/y/w/h, true_caption, false_caption,         JSON list
                   relation_name
aro-vg-attribution the same with attributes ([a1, a2]) instead of relation_name   JSON list
aro-order          image_path (or image), caption_options (first = true)          JSON list or JSONL
abc6k              caption, swapped_caption, image (or via a caption -> image      JSONL/CSV/JSON list
                   mapping file)
winoground         id, caption_0, caption_1, image_0, image_1, tag                 examples.jsonl
=================  =============================================================  =====================

A JSON file may be a list or an object keyed by item id (SugarCrepe's
``{"0": {...}, ...}``). Errors name ``file:line`` (the line where the item
starts) and the field, in one line.
"""
from __future__ import annotations

import csv
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from capscore.data.jsonl import csv_problem, iter_csv_rows, json_problem
from capscore.data.images import ImageRef
from capscore.errors import InputError, unknown_name


# ============================================================================ shape
@dataclass(frozen=True)
class SuiteItem:
    id: str
    subset: str
    images: tuple[ImageRef, ...]
    captions: tuple[str, ...]
    source: str  # file:line
    truth: tuple[tuple[int, ...], ...] | None = None  # None: the diagonal
    group: str = ""  # ARO relation / attribute pair, Winoground tag

    def true_captions(self) -> tuple[tuple[int, ...], ...]:
        return self.truth if self.truth is not None else tuple((i,) for i in range(len(self.images)))


@dataclass(frozen=True)
class CropRef(ImageRef):
    """An image file cropped to a box (x, y, w, h), as ARO crops VG images to the relation's bbox."""

    box: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)

    def identity_hint(self) -> str:
        return f"crop:{self.path}:{self.box}"

    def load(self):
        key, im = ImageRef(path=self.path, name=self.name).load()
        x, y, w, h = self.box
        im = im.crop((int(x), int(y), int(x + w), int(y + h)))
        return f"{key}|crop={hashlib.sha1(repr(self.box).encode()).hexdigest()[:12]}", im


# ============================================================================ raw readers
def _ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def json_entries(path: Path) -> Iterator[tuple[str, str, object]]:
    """Top-level entries of a JSON list or object -> (where 'file:line', key, value)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(str(path), "file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(str(path), f"cannot read file ({e})") from None
    dec = json.JSONDecoder()
    line_of = lambda p: f"{path}:{text.count(chr(10), 0, p) + 1}"  # noqa: E731
    pos = _ws(text, 0)
    if pos >= len(text) or text[pos] not in "[{":
        raise InputError(f"{path}:1", "not a JSON list or object", expected="[...] or {...}")
    is_obj, pos, n = text[pos] == "{", _ws(text, pos + 1), 0
    while pos < len(text) and text[pos] not in "]}":
        start = pos
        try:
            if is_obj:
                key, pos = dec.raw_decode(text, pos)
                pos = _ws(text, pos)
                if text[pos] != ":":
                    raise ValueError("expected ':'")
                pos = _ws(text, pos + 1)
            else:
                key = str(n)
            value, pos = dec.raw_decode(text, pos)
        except (ValueError, IndexError, RecursionError) as e:
            what = getattr(e, "msg", None) or json_problem(e)
            raise InputError(line_of(start), f"malformed JSON ({what})") from None
        yield line_of(start), str(key), value
        n += 1
        pos = _ws(text, pos)
        if pos < len(text) and text[pos] == ",":
            pos = _ws(text, pos + 1)


def jsonl_entries(path: Path) -> Iterator[tuple[str, str, object]]:
    try:
        f = open(path, encoding="utf-8")
    except FileNotFoundError:
        raise InputError(str(path), "file not found") from None
    with f:
        n = 0
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{i}", f"malformed JSON line ({e.msg})") from None
            except (RecursionError, ValueError) as e:
                raise InputError(f"{path}:{i}", f"unreadable JSON line ({json_problem(e)})") from None
            yield f"{path}:{i}", str(n), value
            n += 1


def csv_entries(path: Path) -> Iterator[tuple[str, str, object]]:
    try:
        f = open(path, encoding="utf-8-sig", newline="")
    except FileNotFoundError:
        raise InputError(str(path), "file not found") from None
    with f:
        reader = csv.DictReader(f, strict=True)  # an unterminated quote is an error, not a swallowed file
        try:
            reader.fieldnames  # the header first, so line numbers below count from it
        except (csv.Error, UnicodeDecodeError) as e:
            raise InputError(f"{path}:1", csv_problem(e)) from None
        for n, (start, _, row) in enumerate(iter_csv_rows(reader, path)):
            yield f"{path}:{start}", str(n), row


def entries(path: Path) -> Iterator[tuple[str, str, object]]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return jsonl_entries(path)
    if suffix == ".csv":
        return csv_entries(path)
    return json_entries(path)


def field(row: object, where: str, name: str, kind: type | tuple = str, *, alt: str | None = None):
    """row[name] (or row[alt]) checked for type; a one-line InputError otherwise."""
    if not isinstance(row, dict):
        raise InputError(where, "item is not a JSON object", got=row)
    if name not in row and alt is not None and alt in row:
        name = alt
    if name not in row:
        raise InputError(where, f"missing field {name!r}")
    value = row[name]
    if kind is str and (not isinstance(value, str) or not value.strip()):
        raise InputError(where, f"field {name!r} must be a non-empty string", got=value)
    if kind is not str and not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise InputError(where, f"field {name!r} must be {names}", got=value)
    return value


class Images:
    """Resolves image names under ``--images``; an unknown image is an error naming file:line and field."""

    def __init__(self, root: str | Path | None):
        self.root = Path(root).expanduser() if root is not None else None

    def path(self, name: str, where: str, fieldname: str, *, suffixes: tuple[str, ...] = ()) -> Path:
        if self.root is None:
            raise InputError(where, f"field {fieldname!r} names an image but no --images folder was given")
        p = Path(name).expanduser()
        candidates = [p] if p.is_absolute() else [self.root / p, self.root / p.name]
        candidates += [c.with_name(c.name + s) for c in list(candidates) for s in suffixes]
        for c in candidates:
            if c.is_file():
                return c
        raise InputError(where, f"unknown image in field {fieldname!r}: not found under {self.root}", got=name)

    def ref(self, name: str, where: str, fieldname: str, **kw) -> ImageRef:
        return ImageRef(path=self.path(name, where, fieldname, **kw), name=f"{where}: image {name}")


def _files(data: Path, pattern: str) -> list[Path]:
    if data.is_dir():
        files = sorted(data.glob(pattern))
        if not files:
            raise InputError(str(data), f"no {pattern} files in folder")
        return files
    if not data.exists():
        raise InputError(str(data), "--data not found")
    return [data]


# ============================================================================ loaders
def load_sugarcrepe(data: str | Path, images: str | Path | None) -> list[SuiteItem]:
    """SugarCrepe (Hsieh et al., 2023): one JSON per subset (replace_obj.json, swap_att.json, ...);
    ``data`` is one file or a folder of them; subset = file stem."""
    im, out = Images(images), []
    for f in _files(Path(data), "*.json"):
        for where, key, row in entries(f):
            img = im.ref(field(row, where, "filename"), where, "filename")
            caps = (field(row, where, "caption"), field(row, where, "negative_caption"))
            out.append(SuiteItem(f"{f.stem}/{key}", f.stem, (img,), caps, where))
    return out


def load_sugarcrepe_pp(data: str | Path, images: str | Path | None) -> list[SuiteItem]:
    """SugarCrepe++ (Dumpala et al., 2024): caption, caption2 (paraphrase), negative_caption.
    Image 0's true captions are (0, 1); the negative is caption 2."""
    im, out = Images(images), []
    for f in _files(Path(data), "*.json"):
        for where, key, row in entries(f):
            img = im.ref(field(row, where, "filename"), where, "filename")
            caps = tuple(field(row, where, k) for k in ("caption", "caption2", "negative_caption"))
            out.append(SuiteItem(f"{f.stem}/{key}", f.stem, (img,), caps, where, truth=((0, 1),)))
    return out


def _aro_vg(data, images, group_field: str, subset: str) -> list[SuiteItem]:
    im, out = Images(images), []
    f = Path(data)
    for where, key, row in entries(f):
        path = im.path(field(row, where, "image_path"), where, "image_path")
        box = tuple(float(field(row, where, k, (int, float))) for k in ("bbox_x", "bbox_y", "bbox_w", "bbox_h"))
        if box[2] <= 0 or box[3] <= 0:
            raise InputError(where, "bbox_w and bbox_h must be positive", got=box)
        ref = CropRef(path=path, name=f"{where}: image {row['image_path']}", box=box)
        caps = (field(row, where, "true_caption"), field(row, where, "false_caption"))
        g = field(row, where, group_field, (str, list))
        if isinstance(g, list):
            if not g or not all(isinstance(x, str) for x in g):
                raise InputError(where, f"field {group_field!r} must be a list of strings", got=g)
            g = "-".join(g)
        out.append(SuiteItem(f"{subset}/{key}", subset, (ref,), caps, where, group=g))
    return out


def load_aro_vg_relation(data, images) -> list[SuiteItem]:
    """ARO VG-Relation (Yuksekgonul et al., 2023): image cropped to the bbox; grouped by relation_name."""
    return _aro_vg(data, images, "relation_name", "vg-relation")


def load_aro_vg_attribution(data, images) -> list[SuiteItem]:
    """ARO VG-Attribution: image cropped to the bbox; grouped by the attribute pair."""
    return _aro_vg(data, images, "attributes", "vg-attribution")


def load_aro_order(data, images, *, subset: str = "order") -> list[SuiteItem]:
    """ARO COCO-Order / Flickr30k-Order: caption_options[0] is true, the rest are word-order perturbations."""
    im, out = Images(images), []
    f = Path(data)
    for where, key, row in entries(f):
        name = field(row, where, "image_path", alt="image")
        opts = field(row, where, "caption_options", list)
        if len(opts) < 2 or not all(isinstance(c, str) and c.strip() for c in opts):
            raise InputError(where, "field 'caption_options' must list >= 2 non-empty strings", got=opts)
        out.append(SuiteItem(f"{subset}/{key}", subset, (im.ref(name, where, "image_path"),), tuple(opts), where))
    return out


def load_abc6k(data, images, *, mapping: str | Path | None = None) -> list[SuiteItem]:
    """ABC-6K (Feng et al., 2023) caption / attribute-swapped caption pairs joined to images.

    Rows with ``caption`` and ``swapped_caption``; the image is the row's ``image``
    field or, failing that, looked up by caption in ``mapping`` (a JSON object
    ``{caption: image}``). A caption with no image is an error, not a skip.
    """
    im, out = Images(images), []
    table: dict[str, str] = {}
    if mapping is not None:
        for where, key, value in json_entries(Path(mapping)):
            if not isinstance(value, str):
                raise InputError(where, f"mapping value for {key!r} must be an image name", got=value)
            table[key] = value
    for where, key, row in entries(Path(data)):
        cap = field(row, where, "caption")
        swapped = field(row, where, "swapped_caption")
        name = row.get("image") if isinstance(row, dict) and row.get("image") else table.get(cap)
        if not name:
            raise InputError(where, "no image for this caption: missing field 'image' and not in --mapping", got=cap)
        out.append(SuiteItem(f"abc6k/{key}", "abc6k", (im.ref(name, where, "image"),), (cap, swapped), where))
    return out


def load_winoground(data, images) -> list[SuiteItem]:
    """Winoground (Thrush et al., 2022) examples.jsonl; images are ``{image_k}.png`` under --images."""
    im, out = Images(images), []
    for where, key, row in entries(Path(data)):
        refs = tuple(im.ref(field(row, where, f"image_{k}"), where, f"image_{k}", suffixes=(".png", ".jpg"))
                     for k in (0, 1))
        caps = (field(row, where, "caption_0"), field(row, where, "caption_1"))
        ident = str(row.get("id", key))
        out.append(SuiteItem(f"winoground/{ident}", "winoground", refs, caps, where, group=str(row.get("tag", ""))))
    return out


@dataclass(frozen=True)
class ProbeItem:
    """One (image, caption) input of the caption-level probes, with optional labels."""

    id: str
    image: object  # path / PIL / ImageRef
    caption: str
    source: str = ""
    objects: tuple[str, ...] | None = None  # critical objects (PR-MCS substitution)
    wrong_units: tuple[str, ...] | None = None  # wrong details for specificity steps
    lang: str | None = None  # language code (PR-MCS reports per language)


def _str_list(row: dict, where: str, name: str) -> tuple[str, ...] | None:
    if row.get(name) is None:
        return None
    v = row[name]
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise InputError(where, f"field {name!r} must be a list of strings", got=v)
    return tuple(v)


def _critical_objects(row: dict, where: str) -> tuple[str, ...]:
    v = row["critical_objects"]
    if isinstance(v, str):
        return tuple(o.strip() for o in re.split(r"[,、，]", v) if o.strip())
    got = _str_list(row, where, "critical_objects")
    return tuple(o.strip() for o in got if o.strip())


def load_probe_items(data: str | Path, images: str | Path | None) -> list[ProbeItem]:
    """Captions for the caption-level probes (perturb, lgip, specificity): JSONL, CSV or a JSON
    list with ``image`` and ``caption``, optionally ``id``, ``objects`` (critical objects for
    substitution; also read from ``critical_objects``, as a list or as the comma-separated text
    PR-MCS's M-FineCap3k annotation shows, "white shirt, grey shorts, golf, green field", with
    "、" for Japanese), ``wrong_units`` (wrong details, one per specificity step) and ``lang``
    (language code; the perturb probe reports per language, and parses only English captions
    for nouns when no critical objects are given)."""
    im, out = Images(images), []
    for where, key, row in entries(Path(data)):
        caption = field(row, where, "caption")
        ref = im.ref(field(row, where, "image"), where, "image")
        ident = str(row.get("id") or key)
        objects = _str_list(row, where, "objects")
        if objects is None and row.get("critical_objects") is not None:
            objects = _critical_objects(row, where)
        wrong = _str_list(row, where, "wrong_units")
        lang = row.get("lang")
        if lang is not None and (not isinstance(lang, str) or not lang.strip()):
            raise InputError(where, "field 'lang' must be a language code string", got=lang)
        out.append(ProbeItem(ident, ref, caption, where, objects, wrong, lang.strip() if lang else None))
    return out


LOADERS = {
    "sugarcrepe": load_sugarcrepe,
    "sugarcrepe++": load_sugarcrepe_pp,
    "aro-vg-relation": load_aro_vg_relation,
    "aro-vg-attribution": load_aro_vg_attribution,
    "aro-coco-order": lambda d, i: load_aro_order(d, i, subset="coco-order"),
    "aro-flickr-order": lambda d, i: load_aro_order(d, i, subset="flickr-order"),
    "abc6k": load_abc6k,
    "winoground": load_winoground,
}


def load_suite(name: str, data, images, **options) -> list[SuiteItem]:
    if name not in LOADERS:
        raise unknown_name("suite format", name, LOADERS)
    return LOADERS[name](data, images, **options)
