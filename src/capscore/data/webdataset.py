"""WebDataset tar shards as img2dataset writes them: ``KEY.jpg|png|webp`` + ``KEY.txt`` + ``KEY.json``.

A sample is the run of consecutive tar members sharing a key (the file name up
to its first dot, folder included), as in the WebDataset format. The image is
the **first member in archive order** with an image extension (``a.png`` then
``a.jpg``: the PNG is scored; later image members are not read); the caption is
the ``caption_key`` member (``txt`` by default) decoded as UTF-8; references,
when asked for, are a list field of ``KEY.json``. Two members with the same
extension in one sample (``a.txt`` twice, or ``a.png`` twice: ``tar -x`` would
keep the second copy, a stream reader the first) are ambiguous and make the
sample an error row, as does a key that comes back later in the shard (its
members not consecutive: the same id twice). Shards are given as paths, a
folder of ``.tar`` files, or brace patterns (``shards/{00000..00127}.tar``, expanded with ``braceexpand``, the
expander WebDataset itself uses); a pattern is *counted* before it is expanded
and refused over ``max_shards`` names (``braceexpand`` builds every range in
memory, so ``{00000000..99999999}`` would cost minutes and gigabytes).

Bounded reading: only the members a sample needs (images, caption, ``.json``
when references are asked for) are read, and each only when the size declared
in its tar header is at most ``SourceOptions.max_member_bytes`` (256 MiB by
default); a bigger one (a gzip member expanding to gigabytes, a sparse member
declaring 3 GiB) makes its sample a :class:`BadItem` naming ``shard:key`` and
the size, before anything is read.

Damage is contained to what is damaged: a sample without an image or caption,
or with undecodable text, is a :class:`BadItem` named ``shard:key``; a corrupt
image becomes an error row at decode time (the image keeps ``shard:key`` as its
name); a truncated archive yields the samples before the damage and then one
:class:`BadItem` naming the shard. tarfile does not notice an archive cut at a
member boundary, so an uncompressed shard is also checked for its end-of-archive
marker (two zero blocks) after the last member.
"""
from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from capscore._optional import require
from capscore.data.captions import BadItem
from capscore.data.records import Record
from capscore.data.shard_options import SourceOptions, expect_files
from capscore.data.images import ImageRef
from capscore.errors import InputError

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
#: Most shard names a brace pattern may expand to (counted before expanding).
MAX_SHARDS = 1_000_000


def list_tar_shards(spec: str, *, max_shards: int = MAX_SHARDS) -> list[str]:
    """A path, a folder (its ``*.tar``, sorted) or a brace pattern -> shard paths."""
    _brace = require("braceexpand", purpose="WebDataset shards")
    UnbalancedBracesError, braceexpand = _brace.UnbalancedBracesError, _brace.braceexpand

    if os.path.isdir(spec):
        found = sorted(str(p) for p in Path(spec).iterdir() if p.name.endswith(".tar"))
        return expect_files(found, spec, "WebDataset .tar shards in the folder")
    try:
        n = count_brace_names(spec)
    except UnbalancedBracesError:
        raise InputError(spec, "unbalanced braces in the shard pattern",
                         expected="a path or a pattern such as 'shards/{00000..00127}.tar'") from None
    if n > max_shards:
        raise InputError(spec, f"the shard pattern names {n:,} files, over the limit of {max_shards:,} "
                               "(max_shards); check the number of digits in the range")
    return expect_files(list(braceexpand(spec)), spec, "WebDataset shard")


def count_brace_names(pattern: str) -> int:
    """How many names ``braceexpand(pattern)`` yields, computed from the pattern without expanding it.

    Mirrors braceexpand's grammar (``{a,b}`` alternatives, ``{N..M[..S]}`` and ``{a..z}`` ranges,
    nesting, backslash escapes); raises braceexpand's UnbalancedBracesError where it would."""
    from braceexpand import UnbalancedBracesError, alphabet, char_range_re, int_range_re

    def pattern_count(pat: str) -> int:
        start = pos = depth = 0
        total = 1
        while pos < len(pat):
            c = pat[pos]
            if c == "\\":
                pos += 2
                continue
            if c == "{":
                if depth == 0:
                    start = pos
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    total *= expr_count(pat[start + 1:pos])
            pos += 1
        if depth != 0:
            raise UnbalancedBracesError(f"Unbalanced braces: {pat!r}")
        return total

    def expr_count(expr: str) -> int:
        m = int_range_re.match(expr)
        if m:
            a, b, step = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1) or 1
            return abs(b - a) // step + 1
        m = char_range_re.match(expr)
        if m:
            a, b, step = alphabet.index(m.group(1)), alphabet.index(m.group(2)), int(m.group(3) or 1) or 1
            return abs(b - a) // step + 1
        pos = depth = start = 0
        parts = []
        while pos < len(expr):
            c = expr[pos]
            if c == "\\":
                pos += 2
                continue
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            elif c == "," and depth == 0:
                parts.append(expr[start:pos])
                start = pos + 1
            pos += 1
        if depth != 0 or not parts:  # not a sequence: braceexpand keeps the braces and expands inside
            return pattern_count(expr)
        parts.append(expr[start:])
        return sum(pattern_count(p) for p in parts)

    return pattern_count(pattern)


def _split(name: str) -> tuple[str, str]:
    p = PurePosixPath(name)
    stem, _, ext = p.name.partition(".")
    key = str(p.parent / stem) if str(p.parent) != "." else stem
    return key, ext.lower()


@dataclass
class _Sample:
    """The members of one sample read so far (only the ones needed) and its first problem."""

    key: str
    parts: dict = field(default_factory=dict)  # ext -> bytes
    members: list = field(default_factory=list)  # every extension seen, in order (first 20 kept)
    image_ext: str | None = None
    image_name: str = ""  # the member read as the image
    problem: str | None = None

    def wants(self, ext: str, options: SourceOptions) -> bool:
        if ext in IMAGE_EXTS:
            return self.image_ext is None  # the first image member is the sample's image
        return ext == options.caption_key or (ext == "json" and options.refs_key is not None)


def _sample(s: _Sample, shard: str, options: SourceOptions):
    key, parts = s.key, s.parts
    where = f"{shard}:{key}"
    if s.problem is not None:
        return BadItem(key, where, "", "", where, s.problem)
    if s.image_ext is None:
        return BadItem(key, where, "", "", where, f"no image ({'/'.join(IMAGE_EXTS)}) in the sample; "
                                                  f"members: {sorted(set(s.members))}")
    image = parts[s.image_ext]
    if options.caption_key not in parts:
        return BadItem(key, where, "", "", where, f"no .{options.caption_key} caption in the sample; "
                                                  f"members: {sorted(set(s.members))}")
    try:
        caption = parts[options.caption_key].decode("utf-8")
    except UnicodeDecodeError:
        return BadItem(key, where, "", "", where, f".{options.caption_key} caption is not UTF-8 text")
    refs: tuple = ()
    if options.refs_key is not None:
        try:
            meta = json.loads(parts.get("json", b"{}"))
        except (ValueError, RecursionError):  # malformed, not UTF-8, nested too deep, a 5000-digit number
            return BadItem(key, where, caption, "", where, ".json metadata is not valid JSON")
        got = meta.get(options.refs_key) if isinstance(meta, dict) else None
        if isinstance(got, str):
            got = [got]
        if not isinstance(got, list) or not all(isinstance(r, str) for r in got):
            return BadItem(key, where, caption, "", where,
                           f"no list {options.refs_key!r} of reference strings in the sample's .json")
        refs = tuple(got)
    return Record(key, ImageRef(name=where, data=image), caption, refs, "", where)


def read_tar_shard(path: str, *, name: str, options: SourceOptions = SourceOptions()) -> Iterator:
    """Items of one tar shard, in archive order (see the module docstring)."""
    cur: _Sample | None = None
    last = None
    limit = options.max_member_bytes
    try:
        if not os.path.isfile(path):  # a FIFO or device would block or never end
            raise InputError(path, "not a regular file (a WebDataset shard must be a .tar file)")
        f = open(path, "rb")
    except OSError as e:
        raise InputError(path, f"cannot open WebDataset shard ({e.strerror or e})") from None
    with f:
        try:
            tf = tarfile.open(fileobj=f, mode="r|*")
        except tarfile.TarError as e:
            raise InputError(path, f"not a tar archive ({e})") from None
        seen: set[str] = set()  # keys of the samples so far: a key must not come back later in the shard
        try:
            for member in tf:
                if not member.isfile():
                    continue
                k, ext = _split(member.name)
                if cur is None or k != cur.key:
                    if cur is not None:
                        yield _sample(cur, path, options)
                        last = cur.key
                    cur = _Sample(k)
                    if k in seen:
                        cur.problem = (f"key {k!r} comes back after other samples (member {member.name}); a "
                                       "sample's members must be consecutive and its key unique in the shard")
                    seen.add(k)
                if len(cur.members) < 20:
                    cur.members.append(ext)
                if member.name == cur.image_name and cur.problem is None:  # (a caption twice: see below)
                    # tar -x keeps the last copy, a stream reader the first: neither is safe to score
                    cur.problem = (f"member {member.name} appears twice in the sample (tar -x would keep the "
                                   "second copy); expected each member name once")
                if cur.problem is not None or not cur.wants(ext, options):
                    continue  # never read: skipped in the stream
                if ext in cur.parts:
                    cur.problem = f"two .{ext} members in one sample (ambiguous); expected one per extension"
                    continue
                if member.size > limit:
                    cur.problem = (f"member {member.name} declares {member.size:,} bytes, over the "
                                   f"{limit:,}-byte limit (max_member_bytes); not read")
                    continue
                cur.parts[ext] = tf.extractfile(member).read()
                if ext in IMAGE_EXTS:
                    cur.image_ext, cur.image_name = ext, member.name
        except (tarfile.TarError, EOFError, OSError, ValueError) as e:
            if cur is not None and (cur.problem is not None
                                    or options.caption_key in cur.parts and cur.image_ext is not None):
                yield _sample(cur, path, options)  # its image and caption were read in full
            elif cur is not None:
                yield BadItem(cur.key, f"{path}:{cur.key}", "", "", f"{path}:{cur.key}",
                              "sample cut off by a truncated tar archive")
            yield _truncated(path, cur.key if cur else last, str(e))
            return
        if cur is not None:
            yield _sample(cur, path, options)
        if not _compressed(path) and f.seek(0, os.SEEK_END) < tf.offset + 2 * tarfile.BLOCKSIZE:
            yield _truncated(path, cur.key if cur else None, "no end-of-archive marker")


def _compressed(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(6)
    return head.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ"))


def _truncated(path: str, after: str | None, why: str) -> BadItem:
    after_txt = f"after sample {after!r}" if after else "before its first sample"
    return BadItem(f"{path}:<truncated>", path, "", "", path,
                   f"truncated or corrupt tar archive ({why}) {after_txt}; later samples of this shard, "
                   "if any, are lost — re-download the shard")
