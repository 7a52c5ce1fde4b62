"""The sentence encoder Polos and DENEB bring: SimCSE-RoBERTa, every layer's first token.

Both metrics (keio-smilab24/Polos, Ka2ukiMatsuda/DENEB; ``BERTEncoder`` + ``Estimator.get_sentence_embedding``
with ``layer: mix``, ``pool: cls``) embed a caption with ``princeton-nlp/sup-simcse-roberta-base``:

1. tokens: the released RoBERTa tokenizer on the caption as given (``tokenizer(text, truncation=False)``;
   ``<s>`` and ``</s>`` added, no prefix); a batch is padded with the pad id and masked;
2. hidden states of the embedding layer and of each transformer layer (13 for the base model);
3. a scalar mix (``ScalarMixWithDropout(do_layer_norm=True)``): each layer is layer-normalised with the
   mean and variance of *all* unmasked values of the batch, weighted by softmax(w) and scaled by γ;
4. the first token (``<s>``) of the mix is the sentence vector.

Step 3's weights belong to the trained metric, so the mix is done by the metric's head
(:func:`capscore.scores.polos.mix_layers`). The encoder returns, per sentence, what the mix needs and
nothing that depends on other sentences: the first token's hidden state in every layer, and per layer
the sum, the sum of squares and the count of the sentence's unmasked hidden values. The head can then
normalise per sentence, or pool those sums over the authors' batch exactly — the features are
per-sentence, so they can be deduplicated, cached and shared between Polos and DENEB.

Weights: the metric's checkpoint carries the encoder (``encoder.model.*``; it is frozen during training,
so these are SimCSE's own weights); the architecture (``config.json``) and the tokenizer files come from
the ``sup-simcse-roberta-base`` folder of the weights folder (the files of the Hugging Face release).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from capscore.backbones.base import resolve_device, resolve_dtype, weights_hash
from capscore.errors import CapscoreError
from capscore.backbones.released import file_digest

#: Files of the tokenizer/config folder that decide the vectors (hashed into the identity).
TOKENIZER_FILES = ("config.json", "tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json",
                   "special_tokens_map.json")


@dataclass
class SentenceFeatures:
    """Per-sentence features for a scalar mix over layers (``L`` = layers + 1, ``D`` = width).

    ``first`` (N, L, D): the first token's hidden state in each layer; ``sums`` / ``sumsq`` (N, L): sum and
    sum of squares of the sentence's unmasked hidden values in each layer (float64); ``counts`` (N,): how
    many values that is per layer (tokens × D).
    """

    first: torch.Tensor
    sums: torch.Tensor
    sumsq: torch.Tensor
    counts: torch.Tensor

    def __len__(self) -> int:
        return int(self.first.shape[0])

    def select(self, index) -> "SentenceFeatures":
        return SentenceFeatures(self.first[index], self.sums[index], self.sumsq[index], self.counts[index])

    @staticmethod
    def cat(parts: Sequence["SentenceFeatures"]) -> "SentenceFeatures":
        return SentenceFeatures(*(torch.cat([getattr(p, f) for p in parts]) for f in ("first", "sums", "sumsq", "counts")))


class SentenceEncoder:
    """A RoBERTa-family encoder and its tokenizer, giving :class:`SentenceFeatures` for texts.

    ``identity`` (the cache key of every vector) changes with the weights, the tokenizer/config files,
    the truncation length and the precision.
    """

    def __init__(self, model: torch.nn.Module, tokenizer, *, name: str, files_digest: str = "-",
                 max_tokens: int | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self._files = files_digest
        positions = int(getattr(model.config, "max_position_embeddings", 514))
        pad = int(getattr(model.config, "pad_token_id", 1) or 0)
        # RoBERTa numbers positions from pad_token_id + 1: a 514-row table holds 512 tokens
        self.max_tokens = int(max_tokens or positions - pad - 1)
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else pad)
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self._identity: str | None = None

    @property
    def identity(self) -> str:
        if self._identity is None:
            self._identity = (f"sentence:{self.name}|w={weights_hash(self.model)}|files={self._files}"
                              f"|max={self.max_tokens}|{str(self.dtype).replace('torch.', '')}")
        return self._identity

    def to(self, device: str | torch.device | None = None, dtype: str | torch.dtype | None = None) -> "SentenceEncoder":
        if device is not None:
            self.device = resolve_device(device)
        if dtype is not None:
            self.dtype = resolve_dtype(dtype)
        self.model.to(device=self.device, dtype=self.dtype)
        self._identity = None
        return self

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids as the authors' ``HFTextEncoder.encode``: ``tokenizer(text, truncation=False)``.

        Longer than the position table allows (the authors' code would fail inside RoBERTa): the first
        ``max_tokens - 1`` tokens and the end token are kept.
        """
        out = []
        for ids in self.tokenizer(list(texts), truncation=False)["input_ids"]:
            ids = list(ids)
            if len(ids) > self.max_tokens:
                ids = ids[: self.max_tokens - 1] + ids[-1:]
            out.append(ids)
        return out

    @torch.inference_mode()
    def encode(self, texts: Sequence[str], *, batch_size: int = 64) -> SentenceFeatures:
        """Features of ``texts`` in input order; batches of similar length, padded to their longest."""
        if not texts:
            d = int(self.model.config.hidden_size)
            n_layers = int(self.model.config.num_hidden_layers) + 1
            return SentenceFeatures(torch.zeros(0, n_layers, d), torch.zeros(0, n_layers, dtype=torch.float64),
                                    torch.zeros(0, n_layers, dtype=torch.float64), torch.zeros(0, dtype=torch.float64))
        ids = self.tokenize(texts)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        parts: list[tuple[list[int], SentenceFeatures]] = []
        for s in range(0, len(order), batch_size):
            rows = order[s: s + batch_size]
            parts.append((rows, self._forward([ids[i] for i in rows])))
        feats = SentenceFeatures.cat([f for _, f in parts])
        where = torch.empty(len(ids), dtype=torch.long)
        where[torch.tensor([i for rows, _ in parts for i in rows])] = torch.arange(len(ids))
        return feats.select(where)

    def _forward(self, rows: list[list[int]]) -> SentenceFeatures:
        n, longest = len(rows), max(len(r) for r in rows)
        ids = torch.full((n, longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros(n, longest, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = 1
        out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), output_hidden_states=True)
        hidden = torch.stack(out.hidden_states, dim=1).float().cpu()  # (n, L, T, D)
        hidden = hidden * mask[:, None, :, None]  # padding out of the sums
        return SentenceFeatures(
            first=hidden[:, :, 0, :].contiguous(),
            sums=hidden.sum(dim=(2, 3), dtype=torch.float64),  # float64 accumulators: the batch scope adds them up
            sumsq=(hidden * hidden).sum(dim=(2, 3), dtype=torch.float64),
            counts=mask.sum(1).to(torch.float64) * hidden.shape[-1],
        )


def roberta_from_state_dict(state: Mapping[str, torch.Tensor], config_dir: str | Path, *, where: str) -> torch.nn.Module:
    """A ``RobertaModel`` built from ``config_dir/config.json`` holding exactly ``state`` (strict).

    The buffers ``embeddings.position_ids`` / ``embeddings.token_type_ids`` (saved by older transformers
    releases, rebuilt by every release) may be present or absent.
    """
    from transformers import AutoConfig, RobertaModel

    cfg_file = Path(config_dir).expanduser() / "config.json"
    if not cfg_file.is_file():
        raise CapscoreError(f"{cfg_file}: not found (the sentence encoder's config.json)")
    config = AutoConfig.from_pretrained(str(cfg_file.parent), local_files_only=True)
    if config.model_type not in ("roberta", "xlm-roberta"):
        raise CapscoreError(f"{cfg_file}: model_type {config.model_type!r}; Polos/DENEB expect a RoBERTa encoder")
    with torch.random.fork_rng(devices=[]):  # construction draws random init that is overwritten
        model = RobertaModel(config, add_pooling_layer=any(k.startswith("pooler.") for k in state))
    sd = {k: v for k, v in state.items() if k not in ("embeddings.position_ids", "embeddings.token_type_ids")}
    expected = model.state_dict()
    missing = [k for k in expected if k not in sd]
    unexpected = [k for k in sd if k not in expected]
    if missing or unexpected:
        what = f"missing {missing[0]!r}" if missing else f"unexpected {unexpected[0]!r}"
        raise CapscoreError(f"{where}: the sentence encoder's tensors do not fit {cfg_file} ({what})")
    for k, v in sd.items():
        if tuple(v.shape) != tuple(expected[k].shape):
            raise CapscoreError(f"{where}: sentence encoder tensor {k!r} has shape {tuple(v.shape)}; "
                                f"{cfg_file} expects {tuple(expected[k].shape)}")
    model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    return model.eval()


def load_sentence_encoder(state: Mapping[str, torch.Tensor], folder: str | Path, *, where: str,
                          device: str = "cpu", dtype: str = "fp32") -> SentenceEncoder:
    """The encoder of a metric checkpoint (``state``: its ``encoder.model.*`` tensors) with the config and
    tokenizer files of ``folder`` (the ``sup-simcse-roberta-base`` release, read offline)."""
    from transformers import AutoTokenizer

    base = Path(folder).expanduser()
    if not base.is_dir():
        raise CapscoreError(f"{base}: sentence-encoder folder not found (config.json and tokenizer files of "
                            "https://huggingface.co/princeton-nlp/sup-simcse-roberta-base)")
    model = roberta_from_state_dict(state, base, where=where)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(base), local_files_only=True)
    except (OSError, ValueError) as e:
        raise CapscoreError(f"{base}: no usable tokenizer files ({' '.join(str(e).split())[:160]})") from None
    digest_files = [base / f for f in TOKENIZER_FILES if (base / f).is_file()]

    enc = SentenceEncoder(model, tokenizer, name=base.name, files_digest=file_digest(digest_files))
    return enc.to(device, dtype)


__all__ = ["SentenceEncoder", "SentenceFeatures", "load_sentence_encoder", "roberta_from_state_dict"]
