"""Caption, reference and image-list loaders for ``capscore score``.

Shapes accepted (the first two are those of the clipscore and pacscore scripts):

* captions JSON ``{image_id: caption}``; image id = file stem of an image in
  ``--images DIR`` (``DIR/COCO_val2014_000000000042.jpg`` has id
  ``COCO_val2014_000000000042``), as in ``clipscore.py``;
* references JSON ``{image_id: [ref, ...]}`` (a single string is one reference);
* captions JSONL / CSV, one caption per row, columns ``image``, ``caption`` and
  optionally ``refs`` (a list in JSONL; a JSON list or a single string in CSV),
  ``id`` and ``system``. ``image`` is a path relative to ``--images`` (or
  absolute), or, when ``--images`` is a manifest, an id listed in it;
* an image manifest (CSV/JSONL with ``id`` and ``path``; relative paths are
  relative to the manifest's folder) instead of a folder;
* COCO: results ``[{"image_id": 42, "caption": ...}, ...]`` as captions and
  ``captions_*.json`` (``{"images": [...], "annotations": [...]}``) as
  references. A numeric COCO ``image_id`` also matches an image whose file
  stem ends in that number (``COCO_val2014_000000000042``);
* several candidates per image: ``{image_id: [caption, ...]}``, or an
  ``image_id`` repeated in COCO results; candidate k of image X gets the id
  ``X#k`` (k from 0), and COCO results output drops the suffix again.
* no images at all (``images=None``), for metrics that read text only: a
  record's image is then the image id (or the ``image`` column) by name, never
  read, and references are looked up by that name.

Every input is consumed once: standard input (``-``), a named pipe or a process
substitution (``--captions <(jq ... f.json)``, a ``/dev/fd/N`` path) is copied once
into a private temporary file on first use (:func:`readable_once`), and every later
read in the process (another model or metric) reads that copy; when the name has
no ``.json``/``.jsonl``/``.csv`` suffix, the format is told from the content (a
whole JSON document is ``.json``, a first line holding a JSON object is ``.jsonl``,
anything else ``.csv``). Devices (``/dev/zero``) and terminals are refused.

JSONL and CSV are read lazily, row by row, so memory does not grow with the
number of captions (except for one set of seen ids per file, for the duplicate
check). A problem with one item is yielded as a :class:`BadItem` (the caller
decides whether it is fatal); a problem with a whole file (unreadable, not
JSON, no ``caption`` column) raises :class:`~capscore.errors.InputError`.
"""
from __future__ import annotations

import atexit
import csv
import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
import re

from capscore.data.images import ImageRef
from capscore.data.records import Record
from capscore.data.jsonl import iter_csv_rows, iter_jsonl, json_problem, surrogate_problem, text_name
from capscore.errors import InputError, bounded, short_repr

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tiff", ".tif", ".webp", ".bmp", ".gif")
CAPTION_FORMATS = (".json", ".jsonl", ".csv")

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # long reference lists in one CSV cell


@dataclass(frozen=True)
class BadItem:
    """An input item that cannot be scored; becomes an error row with ``--skip-bad``."""

    id: str
    image: str
    caption: str
    system: str
    where: str  # file:line, or file: id 'x'
    what: str

    @property
    def error(self) -> str:
        return bounded(f"{self.where}: {self.what}")

    def as_error(self) -> InputError:
        return InputError(self.where, self.what)


Item = Record | BadItem


# ------------------------------------------------------------------------------------ images
@dataclass(frozen=True)
class ImageIndex:
    """Where images live: a folder (ids = file stems) or a manifest (ids listed)."""

    root: Path  # folder that relative paths are resolved against
    by_id: Mapping[str, Path]
    source: str  # shown in errors: the folder or manifest path

    def resolve(self, name: str) -> Path | None:
        """An image column value -> a path: a manifest id, else a path relative to ``root`` or absolute."""
        if name in self.by_id:
            return self.by_id[name]
        p = Path(name).expanduser()
        return p if p.is_absolute() else self.root / p


def index_images(images: str | os.PathLike) -> ImageIndex:
    """``--images``: a folder of images, or a CSV/JSONL manifest with ``id`` and ``path``."""
    path = Path(images).expanduser()
    if path.is_dir():
        return _index_folder(path)
    if not path.exists():
        raise InputError(str(path), "--images not found", expected="a folder of images or a CSV/JSONL manifest")
    if path.suffix.lower() not in (".csv", ".jsonl"):
        raise InputError(str(path), "--images is neither a folder nor a manifest",
                         expected="a folder, or a .csv/.jsonl manifest with 'id' and 'path' columns")
    by_id: dict[str, Path] = {}
    for where, row in _rows(path, required=("id", "path")):
        if isinstance(row, str):  # a malformed row is fatal in a manifest: every id must be known
            raise InputError(where, row)
        ident, p = row["id"], row["path"]
        if not isinstance(ident, (str, int)) or str(ident) == "" or not isinstance(p, str) or not p:
            raise InputError(where, "manifest row needs a non-empty 'id' and 'path'", got=row)
        ident = str(ident)
        if ident in by_id:
            raise InputError(where, f"duplicate image id {ident!r} in manifest")
        q = Path(p).expanduser()
        by_id[ident] = q if q.is_absolute() else path.parent / q
    return ImageIndex(path.parent, by_id, str(path))


def _index_folder(folder: Path) -> ImageIndex:
    by_id: dict[str, Path] = {}
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if not entry.is_file() or not entry.name.lower().endswith(IMAGE_SUFFIXES):
            continue
        stem = Path(entry.name).stem
        if stem in by_id:
            raise InputError(str(folder), f"two images share the id {stem!r}: {by_id[stem].name} and {entry.name}",
                             expected="one image per file stem")
        by_id[stem] = folder / entry.name
    return ImageIndex(folder, by_id, str(folder))


# ------------------------------------------------------------------------------------ read once
_SPOOLED: dict[str, Path] = {}  # stdin / pipe given -> its private copy (each is consumed once per process)


def readable_once(path: str | os.PathLike, option: str = "--captions") -> Path:
    """``path`` itself for a regular file (or a missing one: the reader reports it); for stdin
    (``-``), a FIFO or a ``/dev/fd/N`` pipe, a temporary copy made on the first call (module docstring)."""
    text = str(path)
    if text in _SPOOLED:
        return _SPOOLED[text]
    if text == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise InputError("-", f"{option} - reads standard input, which is a terminal; pipe the file in")
        name, src = "stdin", sys.stdin.buffer
    else:
        p = Path(path).expanduser()
        try:
            st = os.stat(p)
        except (OSError, ValueError):
            return p  # missing or unreadable: the reader says which, naming the file
        if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
            return p
        if not stat.S_ISFIFO(st.st_mode) and not stat.S_ISSOCK(st.st_mode):
            raise InputError(text, f"{option} is a device, not a file or pipe")
        try:
            src = open(p, "rb")
        except OSError as e:
            raise InputError(text, f"cannot read {option} ({e.strerror or e})") from None
        name = p.stem or "pipe"
    folder = Path(tempfile.mkdtemp(prefix="capscore-input-"))
    atexit.register(shutil.rmtree, folder, True)
    tmp = folder / "input"
    try:
        with open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    finally:
        if src is not getattr(sys.stdin, "buffer", None):
            src.close()
    suffix = Path(text).suffix.lower()
    if suffix not in CAPTION_FORMATS:
        suffix = _sniff_format(tmp)
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:60] or "pipe"
    dest = folder / f"{safe}{suffix}"
    tmp.rename(dest)
    _SPOOLED[text] = dest
    return dest


def _sniff_format(path: Path) -> str:
    """``.json`` / ``.jsonl`` / ``.csv`` from the content of a file without a telling suffix."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    first = head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    if first == b"[":
        return ".json"
    if first != b"{":
        return ".csv"
    try:
        with open(path, encoding="utf-8-sig") as f:
            json.load(f)
        return ".json"
    except (ValueError, RecursionError):
        return ".jsonl"


# ------------------------------------------------------------------------------------ refs
def load_refs(path: str | os.PathLike) -> dict[str, tuple[str, ...]]:
    """``--refs``: JSON ``{image_id: [refs]}`` (or ``{image_id: ref}``), or JSONL/CSV rows with
    ``image`` (or ``id``) and ``refs`` (JSONL: a list; CSV: a JSON list or a single string).
    A pipe or ``-`` is read once (:func:`readable_once`)."""
    path = readable_once(path, "--refs")
    out: dict[str, tuple[str, ...]] = {}
    _check_not_empty(path, "references")
    if path.suffix.lower() == ".json":
        data = _load_json_dict(path, "{image_id: [reference, ...]} or a COCO captions_*.json")
        if isinstance(data.get("annotations"), list):
            return _coco_refs(path, data)
        for key, value in data.items():
            refs = _as_refs(value)
            if refs is None:
                raise InputError(f"{path}: id {key!r}", "references must be a string or a list of strings", got=value)
            out[str(key)] = refs
        return out
    _check_suffix(path, "--refs")
    for where, row in _rows(path, required=("refs",)):
        if isinstance(row, str):
            raise InputError(where, row)
        key = row.get("image", row.get("id"))
        refs = _as_refs(row.get("refs"), csv_cell=path.suffix.lower() == ".csv")  # JSONL rows may lack it
        if key is None or refs is None:
            raise InputError(where, "a references row needs 'image' (or 'id') and 'refs' (strings)", got=row)
        if str(key) in out:
            raise InputError(where, f"duplicate references for {key!r}")
        out[str(key)] = refs
    return out


def _coco_refs(path: Path, data: dict) -> dict[str, tuple[str, ...]]:
    """COCO ``captions_*.json``: references keyed by ``image_id`` and by the image's file stem."""
    stems = {}
    obj = lambda x: dict(x) if isinstance(x, _Pairs) else x  # noqa: E731  (nested objects load as _Pairs)
    for im in map(obj, data.get("images") or []):
        if isinstance(im, dict) and "id" in im and isinstance(im.get("file_name"), str):
            stems[str(im["id"])] = Path(im["file_name"]).stem
    refs: dict[str, list[str]] = {}
    for n, ann in enumerate(map(obj, data["annotations"])):
        if not isinstance(ann, dict) or "image_id" not in ann or not isinstance(ann.get("caption"), str):
            raise InputError(f"{path}: annotations[{n}]", "a COCO annotation needs 'image_id' and 'caption'",
                             got=ann)
        refs.setdefault(str(ann["image_id"]), []).append(ann["caption"])
    out = {k: tuple(v) for k, v in refs.items()}
    out.update({stems[k]: v for k, v in out.items() if k in stems})
    return out


def _as_refs(value, *, csv_cell: bool = False) -> tuple[str, ...] | None:
    if csv_cell and isinstance(value, str) and value.lstrip().startswith("["):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):  # malformed, a 5000-digit number, nested too deep
            return None
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(r, str) for r in value):
        return tuple(value)
    return None


# ------------------------------------------------------------------------------------ captions
def read_captions(
    path: str | os.PathLike,
    *,
    images: ImageIndex | None,
    refs: Mapping[str, tuple[str, ...]] | None = None,
    system: str | None = None,
) -> Iterator[Item]:
    """Yield one :class:`Record` (or :class:`BadItem`) per caption of ``path``, lazily.

    ``system`` defaults to the file stem; a ``system`` column overrides it per row.
    ``refs`` (from ``--refs``) are looked up by image id; a ``refs`` column wins.
    ``images=None``: no image index (text-only metrics); each record names its image by id.
    Raises :class:`InputError` at once for whole-file problems. A pipe or ``-`` is read once
    (:func:`readable_once`); its system name is then the pipe's name (``stdin`` for ``-``).
    """
    given = str(path)
    path = readable_once(path, "--captions")
    if system is None:
        system = "stdin" if given == "-" else text_name(Path(given).stem)
    suffix = path.suffix.lower()
    _check_not_empty(path, "captions")
    if suffix == ".json":
        return _read_json_captions(path, images, refs, system)
    _check_suffix(path, "--captions")
    return _read_row_captions(path, images, refs, system)


def _json_caption_pairs(path: Path) -> tuple[list[tuple[str, object, str]], bool]:
    """(image key, caption, where) of a ``{image_id: caption | [captions]}`` or COCO results file,
    and whether it is COCO results (where a repeated image_id is another candidate)."""
    expected = '{image_id: caption}, {image_id: [captions]} or COCO results [{"image_id", "caption"}]'
    data = _load_json_any(path, expected)
    if isinstance(data, list) and not isinstance(data, _Pairs):  # _Pairs (an object) is a list too
        out = []
        for n, obj in enumerate(data):
            if not isinstance(obj, _Pairs) or "image_id" not in dict(obj) or "caption" not in dict(obj):
                raise InputError(f"{path}: [{n}]", "a COCO results entry needs 'image_id' and 'caption'",
                                 got=dict(obj) if isinstance(obj, _Pairs) else obj)
            d = dict(obj)
            out.append((str(d["image_id"]), d["caption"], f"{path}: [{n}] image_id {d['image_id']!r}"))
        return out, True
    if not isinstance(data, _Pairs):
        raise InputError(str(path), "wrong JSON shape", expected=expected, got=type(data).__name__)
    out = []
    for key, value in data:
        if isinstance(value, list):  # several candidates of one image
            out += [(str(key), c, f"{path}: id {key!r}[{j}]") for j, c in enumerate(value)]
            if not value:
                out.append((str(key), _NO_CANDIDATES, f"{path}: id {key!r}"))
        else:
            out.append((str(key), value, f"{path}: id {key!r}"))
    return out, False


_NO_CANDIDATES = object()  # {id: []}: an image given an empty list of captions


def _coco_number(images: ImageIndex) -> dict[int, str]:
    """numeric id -> image id, for stems ending in a number (COCO_val2014_000000000042 -> 42)."""
    out: dict[int, str] = {}
    for stem in images.by_id:
        m = re.search(r"(\d+)$", stem)
        if m:
            out.setdefault(int(m.group(1)), stem)
    return out


def _read_json_captions(path, images, refs, system) -> Iterator[Item]:
    triples, results = _json_caption_pairs(path)  # one object: loading it whole is fine
    counts: dict[str, int] = {}
    for key, _, _ in triples:
        counts[key] = counts.get(key, 0) + 1
    listed = {key for key, _, where in triples if where.endswith("]")}
    if not results:  # {id: caption}: a repeated key is a mistake (JSON objects have unique keys), not a candidate
        counts = {k: 1 for k in counts}

    def gen():
        by_number = None
        k_of: dict[str, int] = {}
        for key, caption, where in triples:
            multi = counts[key] > 1 or key in listed
            k = k_of.get(key, 0)
            k_of[key] = k + 1
            ident = f"{key}#{k}" if multi else key
            if k and not multi:
                yield BadItem(key, "", _text(caption), system, where, "duplicate id")
                continue
            if images is None:
                img_id, img = None, ImageRef(name=key)
            else:
                img_id = key if key in images.by_id else None
                if img_id is None and key.isdigit():
                    by_number = _coco_number(images) if by_number is None else by_number
                    img_id = by_number.get(int(key))
                img = images.by_id.get(img_id) if img_id is not None else None
            if caption is _NO_CANDIDATES:
                yield BadItem(ident, key if images is None else str(img or ""), "", system, where,
                              "empty list of captions")
                continue
            if img is None:
                yield BadItem(ident, "", _text(caption), system, where,
                              f"caption without image: no image with id {key!r} in {images.source}")
                continue
            r = (refs.get(key) or refs.get(img_id) or ()) if refs else ()
            yield Record.make(ident, img, caption, r, system=system, source=where)

    return gen()


def _read_row_captions(path, images, refs, system) -> Iterator[Item]:
    rows = _rows(path, required=("image", "caption"))  # raises now on a missing CSV column
    is_csv = path.suffix.lower() == ".csv"

    def gen():
        seen: set[str] = set()  # "system\0id": ids are unique per system
        for n, (where, row) in enumerate(rows, start=1):
            if isinstance(row, str):  # malformed line
                yield BadItem(str(n), "", "", system, where, row)
                continue
            ident = row.get("id")
            ident = str(n) if ident is None or ident == "" else str(ident)
            sys_name = str(row.get("system") or system)
            caption, image = row.get("caption"), row.get("image")
            bad = lambda what: BadItem(ident, _text(image), _text(caption), sys_name, where, what)  # noqa: E731
            missing = [c for c in ("image", "caption") if c not in row]
            if missing:
                yield bad(f"missing field {missing[0]!r}; expected fields 'image' and 'caption'")
                continue
            key = f"{sys_name}\0{ident}"
            if key in seen:
                yield bad(f"duplicate id {ident!r}")
                continue
            seen.add(key)
            if image is None or image == "":
                yield bad("caption without image (empty 'image')")
                continue
            if not isinstance(image, str):
                yield bad(f"'image' must be a string; got {short_repr(image)}")
                continue
            row_refs: tuple[str, ...] = ()
            if row.get("refs") not in (None, ""):
                parsed = _as_refs(row["refs"], csv_cell=is_csv)
                if parsed is None:
                    yield bad(f"'refs' must be a list of strings; got {short_repr(row['refs'])}")
                    continue
                row_refs = parsed
            elif refs:
                row_refs = refs.get(image) or refs.get(Path(image).stem) or ()
            media = ImageRef(name=image) if images is None else images.resolve(image)
            yield Record.make(ident, media, caption, row_refs, system=sys_name, source=where)

    return gen()


# ------------------------------------------------------------------------------------ file readers
def _check_not_empty(path: Path, what: str) -> None:
    try:
        empty = path.is_file() and path.stat().st_size == 0
    except OSError:
        return  # reported by the reader, with the reason
    if empty:
        raise InputError(str(path), f"the {what} file is empty (0 bytes)")


def _check_suffix(path: Path, option: str) -> None:
    if path.suffix.lower() not in CAPTION_FORMATS:
        raise InputError(str(path), f"unsupported {option} format {path.suffix or '(no suffix)'!r}",
                         expected="a .json, .jsonl or .csv file")


def _open_text(path: Path):
    try:
        return open(path, encoding="utf-8-sig", newline="")  # -sig: files saved by Excel start with a BOM
    except FileNotFoundError:
        raise InputError(str(path), "file not found") from None
    except OSError as e:
        raise InputError(str(path), f"cannot read file ({e.strerror or e})") from None


class _Pairs(list):
    """A JSON object kept as its (key, value) pairs, so duplicate keys are not silently dropped."""

    def __repr__(self) -> str:
        return repr(dict(self))


def _load_json_any(path: Path, expected: str):
    """Load a JSON file, objects as :class:`_Pairs` (duplicate keys kept)."""
    with _open_text(path) as f:
        try:
            text = f.read()
            data = json.loads(text, object_pairs_hook=_Pairs)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}:{e.lineno}", f"malformed JSON ({e.msg}, column {e.colno})",
                             expected=expected) from None
        except UnicodeDecodeError:
            raise InputError(str(path), "not UTF-8 text", expected=expected) from None
        except (RecursionError, ValueError) as e:  # nested too deep; an integer over Python's 4300 digits
            raise InputError(str(path), f"unreadable JSON ({json_problem(e)})", expected=expected) from None
    if (problem := surrogate_problem(text, data)) is not None:
        raise InputError(str(path), problem)
    return data


def _load_json_dict(path: Path, expected: str, *, pairs: bool = False):
    """Load a top-level JSON object; ``pairs=True`` keeps duplicate keys (as a list of pairs)."""
    data = _load_json_any(path, expected)
    if not isinstance(data, _Pairs):
        raise InputError(str(path), "wrong JSON shape", expected=expected, got=type(data).__name__)
    if pairs:
        return data
    out = {}
    for k, v in data:
        if k in out:
            raise InputError(str(path), f"duplicate id {k!r}")
        out[k] = v
    return out


def _rows(path: Path, *, required: tuple[str, ...]) -> Iterator[tuple[str, dict | str]]:
    """Lazily yield ``("file:line", row)``; ``row`` is a str error message for a malformed line.

    The header of a CSV (or the first row's keys are not checked for JSONL:
    each JSONL row is checked by the caller) is validated before the first yield.
    """
    if path.suffix.lower() != ".csv":  # JSONL: opened once, by the byte reader (a pipe must not be opened twice)
        if not path.exists():
            raise InputError(str(path), "file not found")
        return _jsonl_rows(path)
    f = _open_text(path)
    reader = csv.DictReader(f, strict=True)  # strict: an unterminated quote is an error, not a swallowed file
    try:
        header = reader.fieldnames or []
    except (csv.Error, UnicodeDecodeError) as e:
        f.close()
        raise InputError(f"{path}:1", f"unreadable CSV header ({e})") from None
    missing = [c for c in required if c not in header]
    if missing:
        f.close()
        raise InputError(f"{path}:1", f"missing column {missing[0]!r}",
                         expected=f"columns {', '.join(required)}", got=header)
    return _csv_rows(f, reader, path)


def _csv_rows(f, reader, path):
    with f:
        for line, _, row in iter_csv_rows(reader, path):  # a broken record stops the file, even with --skip-bad
            if None in row or any(v is None for v in row.values()):
                yield f"{path}:{line}", f"malformed CSV row: {len(reader.fieldnames)} fields expected"
                continue
            yield f"{path}:{line}", row


def _jsonl_rows(path):
    yield from iter_jsonl(path, strict=False)  # as bytes, so a decoding error names its own line


def _text(value) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else short_repr(value)
