"""The dataset scorer: records in, per-item rows out, streamed in chunks.

It is the thin stateful shell around :mod:`capscore.scores.clipscore`: it
collects a chunk of records, asks the encoder for the unique images and texts
of the chunk (the cache makes repeated images/texts free across chunks), calls
the pure metric function, and yields one row per record. Memory is bounded by
the chunk size, whatever the number of records.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from capscore.data.records import Record
from capscore.embed.engine import Encoder
from capscore.errors import InputError
from capscore.scores.clipscore import MetricSpec, add_prefix, get_metric, resolve_prefix


def _validate(rec: Record, spec: MetricSpec) -> InputError | None:
    where = rec.source or f"item {rec.id}"
    if not isinstance(rec.caption, str):
        return InputError(where, "caption is not a string", got=rec.caption)
    if not rec.caption.strip():
        return InputError(where, "empty caption")
    for r in rec.refs:
        if not isinstance(r, str) or not r.strip():
            return InputError(where, "empty or non-string reference", got=r)
    if spec.needs_refs and not rec.refs:
        return InputError(where, f"{spec.name} needs references; none given")
    return None


def score_records(
    records: Iterable[Record],
    encoder: Encoder,
    metric: str | MetricSpec = "clip-s",
    *,
    prefix: str | None = None,
    chunk_size: int = 2048,
    skip_bad: bool = False,
) -> Iterator[dict]:
    """Yield ``{id, image, caption, system, score, error}`` per record, in input order.

    Rows of reference-based metrics also carry ``image_score`` (the CLIP-S /
    PAC-S part) and ``ref_score`` (the reference part), as clipscore.py reports.

    ``prefix`` defaults to the metric's own ("A photo depicts " for CLIP-S and
    PAC-S, as in their reference code); pass "" for none. It is prepended to
    candidates and references alike. With ``skip_bad`` a bad item yields a row
    with ``score=None`` and the one-line error; otherwise the error is raised.
    """
    spec = get_metric(metric) if isinstance(metric, str) else metric
    prefix = resolve_prefix(spec, prefix)
    it = iter(records)
    while chunk := list(itertools.islice(it, chunk_size)):
        errors: dict[int, str] = {}
        for i, rec in enumerate(chunk):
            err = _validate(rec, spec)
            if err is not None:
                if not skip_bad:
                    raise err
                errors[i] = str(err)
        good = [i for i in range(len(chunk)) if i not in errors]
        img_err: dict[int, str] | None = {} if skip_bad else None
        img = encoder.encode_images([chunk[i].image for i in good], errors=img_err)
        for j, msg in (img_err or {}).items():
            errors[good[j]] = msg
        txt = encoder.encode_texts(add_prefix(prefix, [chunk[i].caption for i in good]))
        parts: dict[str, list[float]] = {}
        if spec.needs_refs and good:
            R = max(len(chunk[i].refs) for i in good)
            flat = add_prefix(prefix, [r for i in good for r in chunk[i].refs])
            emb = encoder.encode_texts(flat)
            refs = torch.zeros(len(good), R, emb.shape[-1])
            mask = torch.zeros(len(good), R, dtype=torch.bool)
            k = 0
            for row, i in enumerate(good):
                n = len(chunk[i].refs)
                refs[row, :n] = emb[k : k + n]
                mask[row, :n] = True
                k += n
            scores = spec.compute(img, txt, refs, mask)
            parts = {k: v.tolist() for k, v in spec.components(img, txt, refs, mask).items()}
        elif not good:  # every item of the chunk was bad: nothing to compute
            scores = torch.empty(0)
        else:
            scores = spec.compute(img, txt)
        by_index = dict(zip(good, scores.tolist()))
        part_of = {i: {k: v[row] for k, v in parts.items()} for row, i in enumerate(good)}
        for i, rec in enumerate(chunk):
            s = by_index.get(i)
            if i in errors or s is None or math.isnan(s):
                row = _row(rec, None, errors.get(i, "could not be scored"))
                row.update(dict.fromkeys(COMPONENTS, None) if spec.needs_refs else {})
            else:
                row = _row(rec, s, None)
                row.update(part_of.get(i, {}))
            yield row


def score_pair_records(
    records: Sequence[Record],
    encoder: Encoder,
    name: str = "abe",
    *,
    prefix: str | None = None,
    skip_bad: bool = False,
    **options,
) -> list[dict]:
    """Rows like :func:`score_records` for a pair scorer that is not a CLIPScore formula (ABE-CLIP).

    ``prefix`` defaults to the scorer's own (none for ABE); ``options`` go to the scorer's config. Bad captions and
    images become error rows with ``skip_bad``, else the first one is raised.
    """
    from capscore.scores.pairs import get_pair_scorer

    scorer = get_pair_scorer(name, **options)  # imports capscore.scores.abe lazily; options: its config
    prefix = resolve_prefix(name, prefix)
    errors: dict[int, str] = {}
    for i, rec in enumerate(records):
        where = rec.source or f"item {rec.id}"
        if not isinstance(rec.caption, str):
            errors[i] = str(InputError(where, "caption is not a string", got=rec.caption))
        elif not rec.caption.strip():
            errors[i] = str(InputError(where, "empty caption"))
    if errors and not skip_bad:
        raise InputError.from_message(errors[min(errors)])
    good = [i for i in range(len(records)) if i not in errors]
    img_err: dict[int, str] | None = {} if skip_bad else None
    # checks (and caches) every image, so one bad file becomes one error row; a scorer that needs patch
    # tokens (ABE-CLIP) gets them from this same forward
    encoder.encode_images([records[i].image for i in good], errors=img_err,
                          patches=getattr(scorer, "needs_patches", False))
    for j, msg in (img_err or {}).items():
        errors[good[j]] = msg
    good = [i for i in good if i not in errors]
    values = scorer(encoder, [records[i].image for i in good], add_prefix(prefix, [records[i].caption for i in good]))
    by_index = dict(zip(good, values.tolist() if hasattr(values, "tolist") else list(values)))
    rows = []
    for i, rec in enumerate(records):
        s = by_index.get(i)
        ok = s is not None and math.isfinite(s)
        rows.append(_row(rec, float(s) if ok else None, None if ok else errors.get(i, "could not be scored")))
    return rows


COMPONENTS = ("image_score", "ref_score")  # extra row fields of RefCLIP-S / RefPAC-S (MetricSpec.components)


def _row(rec: Record, score: float | None, error: str | None) -> dict:
    return {
        "id": rec.id,
        "image": rec.image.where() if rec.image.path is None else str(rec.image.path),
        "caption": rec.caption if isinstance(rec.caption, str) else repr(rec.caption),
        "system": rec.system,
        "score": score,
        "error": error,
    }


@dataclass
class Summary:
    """Running count/mean/skipped, overall and per system (caption set)."""

    metric: str
    count: int = 0
    skipped: int = 0
    total: float = 0.0
    systems: dict[str, list[float]] = field(default_factory=dict)  # name -> [sum, count]

    def add(self, row: dict) -> None:
        if row.get("score") is None:
            self.skipped += 1
            return
        self.count += 1
        self.total += row["score"]
        acc = self.systems.setdefault(row.get("system") or "", [0.0, 0])
        acc[0] += row["score"]
        acc[1] += 1

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else float("nan")

    def system_means(self) -> dict[str, float]:
        return {k: s / n for k, (s, n) in sorted(self.systems.items()) if n}

    def as_dict(self) -> dict:
        return {"metric": self.metric, "count": self.count, "mean": self.mean, "skipped": self.skipped,
                "systems": self.system_means()}
