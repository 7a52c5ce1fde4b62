"""WebDataset tar shards as img2dataset writes them: ``KEY.jpg|png|webp`` + ``KEY.txt`` + ``KEY.json``.

A sample is the run of consecutive tar members sharing a key (the file name up
to its first dot, folder included), as in the WebDataset format. The image is
the first member with an image extension; the caption is the ``caption_key``
member (``txt`` by default) decoded as UTF-8; references, when asked for, are a
list field of ``KEY.json``. Shards are given as paths, a folder of ``.tar``
files, or brace patterns (``shards/{00000..00127}.tar``, expanded with
``braceexpand``, the expander WebDataset itself uses).

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
from pathlib import Path, PurePosixPath

from capscore._optional import require
from capscore.data.captions import BadItem
from capscore.data.records import Record
from capscore.data.shards import SourceOptions, expect_files
from capscore.embed.images import ImageRef
from capscore.errors import InputError

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")


def list_tar_shards(spec: str) -> list[str]:
    """A path, a folder (its ``*.tar``, sorted) or a brace pattern -> shard paths."""
    braceexpand = require("braceexpand", purpose="WebDataset shards").braceexpand

    if os.path.isdir(spec):
        found = sorted(str(p) for p in Path(spec).iterdir() if p.name.endswith(".tar"))
        return expect_files(found, spec, "WebDataset .tar shards in the folder")
    return expect_files(list(braceexpand(spec)), spec, "WebDataset shard")


def _split(name: str) -> tuple[str, str]:
    p = PurePosixPath(name)
    stem, _, ext = p.name.partition(".")
    key = str(p.parent / stem) if str(p.parent) != "." else stem
    return key, ext.lower()


def _sample(key: str, parts: dict[str, bytes], shard: str, options: SourceOptions):
    where = f"{shard}:{key}"
    image = next((parts[e] for e in IMAGE_EXTS if e in parts), None)
    if image is None:
        return BadItem(key, where, "", "", where, f"no image ({'/'.join(IMAGE_EXTS)}) in the sample; "
                                                  f"members: {sorted(parts)}")
    if options.caption_key not in parts:
        return BadItem(key, where, "", "", where, f"no .{options.caption_key} caption in the sample; "
                                                  f"members: {sorted(parts)}")
    try:
        caption = parts[options.caption_key].decode("utf-8")
    except UnicodeDecodeError:
        return BadItem(key, where, "", "", where, f".{options.caption_key} caption is not UTF-8 text")
    refs: tuple = ()
    if options.refs_key is not None:
        try:
            meta = json.loads(parts.get("json", b"{}"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return BadItem(key, where, caption, "", where, ".json metadata is not valid JSON")
        got = meta.get(options.refs_key) if isinstance(meta, dict) else None
        if isinstance(got, str):
            got = [got]
        if not isinstance(got, list):
            return BadItem(key, where, caption, "", where,
                           f"no list {options.refs_key!r} of references in the sample's .json")
        refs = tuple(got)
    return Record(key, ImageRef(name=where, data=image), caption, refs, "", where)


def read_tar_shard(path: str, *, name: str, options: SourceOptions = SourceOptions()) -> Iterator:
    """Items of one tar shard, in archive order (see the module docstring)."""
    key, parts = None, {}
    last = None
    try:
        f = open(path, "rb")
    except OSError as e:
        raise InputError(path, f"cannot open WebDataset shard ({e.strerror or e})") from None
    with f:
        try:
            tf = tarfile.open(fileobj=f, mode="r|*")
        except tarfile.TarError as e:
            raise InputError(path, f"not a tar archive ({e})") from None
        try:
            for member in tf:
                if not member.isfile():
                    continue
                k, ext = _split(member.name)
                if k != key:
                    if key is not None:
                        yield _sample(key, parts, path, options)
                        last = key
                    key, parts = k, {}
                parts[ext] = tf.extractfile(member).read()
        except (tarfile.TarError, EOFError, OSError) as e:
            if key is not None and options.caption_key in parts and any(e in parts for e in IMAGE_EXTS):
                yield _sample(key, parts, path, options)  # its image and caption were read in full
            elif key is not None:
                yield BadItem(key, f"{path}:{key}", "", "", f"{path}:{key}",
                              "sample cut off by a truncated tar archive")
            yield _truncated(path, key or last, str(e))
            return
        if key is not None:
            yield _sample(key, parts, path, options)
        if not _compressed(path) and f.seek(0, os.SEEK_END) < tf.offset + 2 * tarfile.BLOCKSIZE:
            yield _truncated(path, key, "no end-of-archive marker")


def _compressed(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(6)
    return head.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ"))


def _truncated(path: str, after: str | None, why: str) -> BadItem:
    after_txt = f"after sample {after!r}" if after else "before its first sample"
    return BadItem(f"{path}:<truncated>", path, "", "", path,
                   f"truncated or corrupt tar archive ({why}) {after_txt}; later samples of this shard, "
                   "if any, are lost — re-download the shard")
