"""ABE-CLIP's phrase features F(A, obj), packed through the text tower.

F(prefix, word) (:mod:`capscore.scores.abe`, step 2) is the mean of the normalised final-layer
features of ``word``'s tokens when the text tower encodes ``f"{prefix} {word}"`` (``word`` alone for
an empty prefix). ABE asks for thousands of them per batch of captions: every pool neighbour of every
object, bare and with the caption's attribute phrases.

On a causal tower a word's tokens see only the start token, the prefix and themselves, so the
phrases are *packed*: one row holds the start token, then the prefixes as a token trie (a prefix's
leading tokens shared with another prefix in the row are there once) with every word under its
prefix, each token masked to see only the tokens of its own phrase before it, at the positions it has
there, and no end token (nothing before it depends on it). The result is each phrase's own encoding,
up to float summation order (≤ 1e-6), at a fraction of the tokens. Backbones without
``supports_packed_text``, and phrases whose tokens are not prefix tokens + word tokens, or that would
not fit the context, are encoded whole (``Encoder.text_tokens``).

The encoder supplies the generic parts: the text-tower forward with a caller's attention mask
(``Encoder.masked_text_tokens``) and the feature cache (``Encoder.cached_features``, in memory and,
with a persistent cache, in its byte-bounded feature table).
"""
from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import torch

from capscore.embed.engine import Encoder
from capscore.errors import CapscoreError

# Text that CLIP's BPE tokeniser splits only at spaces, one word at a time: "prefix word" is then
# tokens(prefix) + tokens(word) without tokenising it (other text is checked by tokenising it).
_PLAIN = re.compile(r"[A-Za-z0-9 '-]*")

#: tokens per packed row (a row is longer only for one prefix + word that needs it)
PACKED_ROW_TOKENS = 64


def phrase_features(encoder: Encoder, items: Sequence[tuple[str, str]], *,
                    row_tokens: int = PACKED_ROW_TOKENS) -> list[torch.Tensor]:
    """F(prefix, word) for each ``(prefix, word)``: (token_dim,) float32 each, in input order (module
    docstring). Kept in the encoder's feature cache under (backbone identity, "word-in-context", phrase)."""
    bb = encoder.backbone
    if not bb.has_token_features:
        raise CapscoreError(f"backbone {bb.spec} does not expose per-token text features")
    return encoder.cached_features("word-in-context", [(p, w) for p, w in items],
                                   lambda missing: _encode(encoder, missing, row_tokens), key=lambda x: f"{x[0]}\x1f{x[1]}")


def _encode(encoder: Encoder, items: list[tuple[str, str]], row_tokens: int) -> list[torch.Tensor]:
    bb = encoder.backbone
    memo: dict[str, list[int]] = {}

    def tokens(s: str) -> list[int]:  # without the start and end tokens
        if s not in memo:
            memo[s] = bb.tokenize([s])[0][1:-1]
        return memo[s]

    packed, whole = [], []
    sot = getattr(bb, "sot_id", None)
    for i, (p, w) in enumerate(items):
        pre, wt = (tokens(p) if p else []), tokens(w)
        ok = (bb.supports_packed_text and sot is not None and wt and len(pre) + len(wt) + 2 <= bb.context_length
              and (not p or _PLAIN.fullmatch(p + w) or tokens(f"{p} {w}") == pre + wt))
        (packed if ok else whole).append((i, pre, wt))
    out: list[torch.Tensor | None] = [None] * len(items)
    if whole:
        texts = [f"{items[i][0]} {items[i][1]}" if items[i][0] else items[i][1] for i, _, _ in whole]
        for (i, _, wt), f in zip(whole, encoder.text_tokens(texts)):
            v = f.vectors  # the word's tokens end just before the end token
            out[i] = v[len(v) - 1 - len(wt) : len(v) - 1].mean(0)
    if packed:
        for i, v in _packed_forward(encoder, packed, sot, row_tokens):
            out[i] = v
    return out


def _packed_forward(encoder: Encoder, items: list[tuple[int, list[int], list[int]]], sot: int, row_tokens: int):
    """Yield (index, F) for (index, prefix ids, word ids) items; see the module docstring.

    Each row is a token trie rooted at the start token: a prefix token is added once per row
    under the longest of its leading prefix tokens already there (so "red", "red small" and
    "red large" share "red"), a word's tokens hang under its whole prefix, and every token
    attends to itself and its ancestors only, at its depth as position. That is exactly the
    causal view each token has in its own text."""
    bb = encoder.backbone
    groups: dict[tuple[int, ...], list[tuple[int, list[int]]]] = {}
    for i, pre, wt in items:
        groups.setdefault(tuple(pre), []).append((i, wt))
    rows: list[dict] = []

    def new_row():
        rows.append({"ids": [sot], "pos": [0], "parent": [-1], "nodes": {(): 0}, "out": []})
        return rows[-1]

    def add(row, token: int, parent: int) -> int:
        row["ids"].append(token)
        row["pos"].append(row["pos"][parent] + 1)
        row["parent"].append(parent)
        return len(row["ids"]) - 1

    row = new_row()
    for pre in sorted(groups):  # prefixes with the same leading tokens side by side
        for i, wt in groups[pre]:
            k = len(pre)
            while pre[:k] not in row["nodes"]:  # the longest leading part already in the row
                k -= 1
            if len(row["ids"]) > 1 and len(row["ids"]) + len(pre) - k + len(wt) > row_tokens:
                row, k = new_row(), 0
            node = row["nodes"][pre[:k]]
            for j in range(k, len(pre)):
                node = row["nodes"][pre[: j + 1]] = add(row, pre[j], node)
            start = len(row["ids"])
            for t in wt:
                node = add(row, t, node)
            row["out"].append((i, start, len(row["ids"])))
    rows.sort(key=lambda r: len(r["ids"]))
    budget = encoder.text_token_budget
    s = 0
    while s < len(rows):
        e = s + 1
        while e < len(rows) and (e + 1 - s) * len(rows[e]["ids"]) <= budget:
            e += 1
        batch, s = rows[s:e], e
        L = len(batch[-1]["ids"])
        ids = torch.full((len(batch), L), bb.pad_id, dtype=torch.long)
        pos = torch.zeros((len(batch), L), dtype=torch.long)
        allowed = np.zeros((len(batch), L, L), dtype=bool)
        allowed[:, np.arange(L), np.arange(L)] = True  # padding sees only itself
        for j, r in enumerate(batch):
            n = len(r["ids"])
            ids[j, :n], pos[j, :n] = torch.tensor(r["ids"]), torch.tensor(r["pos"])
            sees = allowed[j]
            for q, parent in enumerate(r["parent"]):  # ancestors come first: sees[parent] is final
                if parent >= 0:
                    sees[q] |= sees[parent]
        tok = encoder.masked_text_tokens(ids, pos, torch.from_numpy(allowed))
        for j, r in enumerate(batch):
            for i, a, b in r["out"]:
                yield i, tok[j, a:b].mean(0).clone()
