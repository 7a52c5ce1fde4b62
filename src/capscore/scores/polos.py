"""Polos (Wada et al., CVPR 2024): a supervised, reference-based caption metric trained on Polaris.

Paper: "Polos: Multimodal Metric Learning from Human Feedback for Image Captioning", arXiv:2402.18091,
§3 (the parallel feature extraction mechanism). Its text is not in ``shared/papers``; every formula
below is read from the authors' code, keio-smilab24/Polos at commit 839d64d: ``PolosEstimator.forward``,
``Estimator.get_sentence_embedding``, ``ScalarMixWithDropout``, ``FeedForward`` and the released
``hparams.yaml`` (``layer: mix``, ``pool: cls``, ``hidden_sizes: 2304,1152``, ``activations: Tanh``,
``final_activation: False``).

For an image ``I``, a candidate ``c`` and its references ``r_1 … r_R``::

    c_s, r_s    = S(c), S(r_j)                          SimCSE-RoBERTa, scalar mix of all layers, first token
    v           = E_I(I)                                CLIP ViT-B/32 image projection (raw, not normalised)
    c_v, r_v    = E_T("A photo depicts " + c), E_T("A photo depicts " + r_j)
    x_j         = [r_s, c_s, |c_s - r_s|, c_s ⊙ r_s,  v, c_v, |v - c_v|, v ⊙ c_v,  |r_v - c_v|, r_v ⊙ c_v]
    s_j         = σ(W3 · tanh(W2 · tanh(W1 · x_j + b1) + b2) + b3)
    Polos(I, c) = max_j s_j                             the authors' aggregation over references

The scalar mix ``S`` (:func:`mix_layers`): ``γ · Σ_k softmax(w)_k · LN(h_k)`` at the first token, where
``LN`` normalises layer ``k`` by the mean and variance of every unmasked value *of the batch* (the
authors' ``_do_layer_norm``), ``ε = 1e-12``.

Choices the code leaves open, exposed as parameters:

* ``layer_norm`` — the authors' layer norm pools its statistics over the whole batch, so a caption's
  score depends on the other captions in its batch (and the published numbers were computed with
  ``predict(batch_size=32)``). ``"sentence"`` (default) normalises each sentence by its own statistics:
  deterministic per item, and exactly the authors' code at batch size 1. ``"batch"`` treats one call of
  :func:`polos_head` as one authors' batch: candidates pooled together, the ``j``-th references of all
  items pooled together, and — as ``torchnlp.collate_tensors`` transposes the reference lists with
  ``zip`` — only the first ``min_i R_i`` references of each item used. :func:`score_polos` with
  ``layer_norm="batch", batch_size=B`` reproduces ``model.predict(samples, batch_size=B)``.
* ``clip`` — the released checkpoint carries the CLIP tower it was trained with (``clip.*``; frozen
  during training, so OpenAI's ViT-B/32): by default that tower is used, through an encoder of the
  encoding engine (each distinct image and text once; raw projections, cached). A run passes the
  encoder of its own ``--model`` when that backbone gives the same vectors
  (:func:`capscore.embed.factory.tower_encoder`), so Polos and CLIP-S on one run encode each image once.
* An item without references has no Polos score (NaN; the metric is reference-based).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from capscore.backbones.released import Part, WeightsFile, find_weights, numbered, read_checkpoint, take
from capscore.backbones.sentence import SentenceEncoder, SentenceFeatures, load_sentence_encoder
from capscore.errors import CapscoreError, param_error
from capscore.backbones.openai_ckpt import backbone_from_state_dict
from capscore.embed.engine import Encoder

from capscore.scores.citations import POLOS_CITATION as CITATION  # noqa: E402
CLIP_PREFIX = "A photo depicts "  # PolosEstimator.forward, for candidates and references alike
LAYER_NORM_EPS = 1e-12  # ScalarMixWithDropout._do_layer_norm
LAYER_NORMS = ("sentence", "batch")
ACTIVATIONS = {"tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu,
               "gelu": torch.nn.functional.gelu}

#: The files of ``--metric-weights DIR`` (see docs/learned.md).
CHECKPOINT = WeightsFile(
    ("polos/reprod.ckpt", "polos/polos.safetensors"),
    "https://polos-polaris.s3.ap-northeast-1.amazonaws.com/reprod.zip (unzip; put reprod/reprod.ckpt and "
    "reprod/hparams.yaml in polos/)",
    "the Polos checkpoint")
SIMCSE = WeightsFile(
    ("sup-simcse-roberta-base",),
    "https://huggingface.co/princeton-nlp/sup-simcse-roberta-base (config.json and the tokenizer files: "
    "vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json)",
    "the SimCSE-RoBERTa config and tokenizer folder")


# ------------------------------------------------------------------------------------ the head
@dataclass(frozen=True)
class ScalarMix:
    """``ScalarMixWithDropout`` at inference: ``weights`` (L,) before softmax, ``gamma`` a scalar."""

    weights: torch.Tensor
    gamma: torch.Tensor


@dataclass(frozen=True)
class PolosHead:
    """The trained part of Polos: the scalar mix and the MLP (``linears``: (W, b) pairs, first to last)."""

    mix: ScalarMix
    linears: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    activation: str = "tanh"
    final_activation: str | None = None  # the FeedForward's own final activation (the release: none)


def mix_layers(f: SentenceFeatures, mix: ScalarMix, *, layer_norm: str = "sentence") -> torch.Tensor:
    """Sentence vectors (N, D): ``γ Σ_k softmax(w)_k (h_k - μ_k) / sqrt(σ²_k + ε)`` at the first token.

    ``layer_norm="sentence"``: μ_k, σ²_k over the sentence's own unmasked values; ``"batch"``: over all
    sentences of ``f`` together (the authors' batch)."""
    if layer_norm not in LAYER_NORMS:
        raise param_error("layer_norm", "mix_layers", f"one of {list(LAYER_NORMS)}", layer_norm)
    sums, sumsq, counts = f.sums, f.sumsq, f.counts[:, None]
    if layer_norm == "batch":
        sums, sumsq, counts = sums.sum(0, keepdim=True), sumsq.sum(0, keepdim=True), counts.sum(0, keepdim=True)
    mean = sums / counts  # (N or 1, L)
    var = (sumsq / counts - mean * mean).clamp_min(0.0)
    normed = (f.first.to(torch.float64) - mean[..., None]) / torch.sqrt(var + LAYER_NORM_EPS)[..., None]
    s = torch.softmax(mix.weights.to(torch.float64).reshape(-1), dim=0)
    if s.numel() != f.first.shape[1]:
        raise CapscoreError(f"the scalar mix has {s.numel()} weights but the encoder gives {f.first.shape[1]} layers")
    return (float(mix.gamma) * (s[None, :, None] * normed).sum(1)).to(torch.float32)


def mlp(x: torch.Tensor, linears: Sequence[tuple[torch.Tensor, torch.Tensor]], activation: str,
        final_activation: str | None = None) -> torch.Tensor:
    """``FeedForward`` at inference (dropout off): Linear, activation, …, Linear[, final activation]."""
    act = ACTIVATIONS[activation]
    for i, (w, b) in enumerate(linears):
        x = x @ w.T.to(x.dtype) + b.to(x.dtype)
        if i < len(linears) - 1:
            x = act(x)
    return ACTIVATIONS[final_activation](x) if final_activation else x


@dataclass
class Features:
    """What the extractors give the head for N items.

    ``cand`` (N) and ``refs`` (M distinct references): :class:`SentenceFeatures`; ``ref_index`` (N, R):
    rows of ``refs`` for each item's references in order, ``-1`` past its last; ``image``, ``cand_clip``
    (N, E) and ``ref_clip`` (M, E): raw CLIP projections (texts with :data:`CLIP_PREFIX`)."""

    cand: SentenceFeatures
    refs: SentenceFeatures
    ref_index: torch.Tensor
    image: torch.Tensor
    cand_clip: torch.Tensor
    ref_clip: torch.Tensor


def reference_vectors(feats: Features, mix: ScalarMix, *, layer_norm: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, R, D) sentence vectors of each item's references and the (N, R) mask of real ones.

    ``"batch"``: the references are taken column by column as the authors' collate does (column ``j`` =
    the ``j``-th reference of every item, normalised together), and only the first ``min_i R_i`` columns
    exist."""
    idx = feats.ref_index
    n, r = idx.shape
    if layer_norm == "batch":
        per_item = (idx >= 0).sum(1)
        r = int(per_item.min()) if n else 0
        cols = [mix_layers(feats.refs.select(idx[:, j]), mix, layer_norm="batch") for j in range(r)]
        d = feats.refs.first.shape[-1]
        vecs = torch.stack(cols, 1) if cols else torch.zeros(n, 0, d)
        return vecs, torch.ones(n, r, dtype=torch.bool)
    every = mix_layers(feats.refs, mix, layer_norm="sentence")
    mask = idx >= 0
    return every[idx.clamp_min(0)] * mask[..., None], mask


def polos_head(feats: Features, head: PolosHead, *, layer_norm: str = "sentence") -> torch.Tensor:
    """Polos scores (N,) from extracted features: ``max_j σ(MLP(x_j))`` (module docstring); NaN for an
    item without references."""
    c_s = mix_layers(feats.cand, head.mix, layer_norm=layer_norm)  # (N, D)
    r_s, mask = reference_vectors(feats, head.mix, layer_norm=layer_norm)  # (N, R, D)
    r = r_s.shape[1]
    ref_idx = feats.ref_index[:, :r].clamp_min(0)
    r_v = feats.ref_clip[ref_idx]  # (N, R, E)
    v, c_v = feats.image[:, None, :].expand(-1, r, -1), feats.cand_clip[:, None, :].expand(-1, r, -1)
    c_s = c_s[:, None, :].expand(-1, r, -1)
    x = torch.cat([r_s, c_s, (c_s - r_s).abs(), c_s * r_s,
                   v, c_v, (v - c_v).abs(), v * c_v,
                   (r_v - c_v).abs(), r_v * c_v], dim=-1)  # (N, R, 4D + 6E)
    s = torch.sigmoid(mlp(x, head.linears, head.activation, head.final_activation)).squeeze(-1)  # (N, R)
    s = s.masked_fill(~mask, -math.inf)
    best = s.max(dim=1).values if r else torch.full((len(s),), -math.inf)
    return torch.where(torch.isinf(best), torch.full_like(best, math.nan), best)


# ------------------------------------------------------------------------------------ the released checkpoint
def activation(hparams: Mapping, key: str, default: str | None, where: str) -> str | None:
    value = hparams.get(key, default)
    if value in (None, False, "False", "false", ""):
        return None
    name = str(value).lower()
    if name not in ACTIVATIONS:
        raise CapscoreError(f"{where}: {key} {value!r} is not one capscore implements ({', '.join(ACTIVATIONS)})")
    return name


def check_hparams(hparams: Mapping, *, where: str) -> None:
    """The configuration the forward implements (``layer: mix``, ``pool: cls``, ``encoder_model: BERT``)."""
    for key, want in (("layer", "mix"), ("pool", "cls"), ("encoder_model", "BERT")):
        if key in hparams and str(hparams[key]) != want:
            raise CapscoreError(f"{where}: {key} is {hparams[key]!r}; capscore implements the released "
                                f"configuration ({key}: {want})")


def mix_part(n_layers: int) -> Part:
    """``scalar_mix.*``: one weight per layer, γ, and the dropout buffers (present when dropout > 0)."""
    shapes = {f"scalar_parameters.{k}": (1,) for k in range(n_layers)}
    shapes.update({"gamma": (1,), "dropout_mask": (n_layers,), "dropout_fill": (n_layers,)})
    return Part("scalar_mix.", shapes, optional=frozenset({"dropout_mask", "dropout_fill"}))


def mlp_part(prefix: str, sd: Mapping[str, torch.Tensor], in_dim: int, hidden: Sequence[int] | None, *,
             where: str) -> Part:
    """``FeedForward`` keys ``linear_1 … linear_K`` with shapes ``in_dim → hidden… → 1``; ``hidden`` from
    the hyper-parameters when given, else read from the file (and checked to chain)."""
    k = 1
    while f"{prefix}linear_{k}.weight" in sd:
        k += 1
    if hidden is None:
        if k < 2:
            raise CapscoreError(f"{where}: missing tensor {prefix + 'linear_1.weight'!r}")
        hidden = [int(sd[f"{prefix}linear_{i}.weight"].shape[0]) for i in range(1, k - 1)]
    sizes = [in_dim, *hidden, 1]
    shapes = {}
    for i in range(1, len(sizes)):
        shapes[f"linear_{i}.weight"] = (sizes[i], sizes[i - 1])
        shapes[f"linear_{i}.bias"] = (sizes[i],)
    return Part(prefix, shapes)


def hidden_sizes(hparams: Mapping) -> list[int] | None:
    value = hparams.get("hidden_sizes")
    if value is None:
        return None
    if isinstance(value, int):
        return [value]
    return [int(x) for x in str(value).split(",") if x.strip()]


def encoder_layers(sd: Mapping[str, torch.Tensor], prefix: str) -> int:
    """Hidden states the encoder gives: its transformer layers + the embedding layer."""
    return numbered({k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}, "encoder.layer") + 1


@dataclass
class PolosModel:
    """Polos ready to score: the head and the two extractors."""

    head: PolosHead
    sentence: SentenceEncoder
    clip: object  # capscore.backbones.base.Backbone
    source: str = ""


def open_checkpoint(path: str | Path, *, clip_prefix: str, metric: str) -> tuple[dict, dict, int, int, int]:
    """(state dict, hyper-parameters, encoder layers + 1, sentence width D, CLIP width E) of a Polos-family
    checkpoint (``encoder.model.*`` RoBERTa, a CLIP tower under ``clip_prefix``), its configuration checked."""
    sd, hparams = read_checkpoint(path)
    check_hparams(hparams, where=str(path))
    if "encoder.model.embeddings.word_embeddings.weight" not in sd or f"{clip_prefix}text_projection" not in sd:
        raise CapscoreError(f"{path}: not a {metric} checkpoint (no encoder.model.* or {clip_prefix}* tensors)")
    return (sd, hparams, encoder_layers(sd, "encoder.model."),
            int(sd["encoder.model.embeddings.word_embeddings.weight"].shape[1]),
            int(sd[f"{clip_prefix}text_projection"].shape[1]))


def read_polos(path: str | Path) -> tuple[PolosHead, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(head, sentence-encoder tensors, CLIP tensors) of a Polos checkpoint, its layout checked strictly.

    Layout (``PolosEstimator`` state dict): ``encoder.model.*`` (RoBERTa), ``scalar_mix.*`` (13 weights, γ,
    dropout buffers), ``ff.0.ff.linear_{1,2,3}.*`` (6144 → 2304 → 1152 → 1), ``clip.*`` (OpenAI CLIP
    ViT-B/32). Every tensor must be claimed by one of them."""
    where = str(path)
    sd, hparams, n_layers, d, e = open_checkpoint(path, clip_prefix="clip.", metric="Polos")
    ff = mlp_part("ff.0.ff.", sd, 4 * d + 6 * e, hidden_sizes(hparams), where=where)
    parts = take(sd, {"encoder": Part("encoder.model.", open=True), "clip": Part("clip.", open=True),
                      "mix": mix_part(n_layers), "ff": ff}, where=where)
    head = PolosHead(scalar_mix(parts["mix"], n_layers), linears(parts["ff"]),
                     activation(hparams, "activations", "Tanh", where) or "tanh",
                     activation(hparams, "final_activation", None, where))
    return head, parts["encoder"], parts["clip"]


def scalar_mix(part: Mapping[str, torch.Tensor], n_layers: int) -> ScalarMix:
    weights = torch.cat([part[f"scalar_parameters.{k}"].reshape(1) for k in range(n_layers)]).float()
    return ScalarMix(weights, part["gamma"].reshape(()).float())


def linears(part: Mapping[str, torch.Tensor]) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    k = len(part) // 2
    return tuple((part[f"linear_{i}.weight"].float(), part[f"linear_{i}.bias"].float()) for i in range(1, k + 1))


def load_polos(weights_dir: str | Path | None, *, device: str = "cpu", dtype: str = "fp32", clip=None,
               checkpoint: str | Path | None = None) -> PolosModel:
    """Polos from ``--metric-weights DIR`` (see :data:`CHECKPOINT`, :data:`SIMCSE`).

    ``clip``: a capscore backbone to use instead of the checkpoint's own CLIP tower (same weights, shared
    encoding); ``checkpoint``: a checkpoint file elsewhere than ``DIR/polos/``."""
    path = Path(checkpoint) if checkpoint else find_weights(weights_dir, CHECKPOINT, metric="polos")
    head, enc_sd, clip_sd = read_polos(path)
    folder = find_weights(weights_dir if weights_dir is not None else path.parent.parent, SIMCSE, metric="polos")
    sentence = load_sentence_encoder(enc_sd, folder, where=str(path), device=device, dtype=dtype)
    if clip is None:
        clip = backbone_from_state_dict(clip_sd, spec=f"polos:{path}#clip", where=f"{path} (clip.*)").to(device, dtype)
        clip.remember_weights_files([path], f"polos-clip|{dtype}")  # its hash (the cache key) read once per file
    return PolosModel(head, sentence, clip, str(path))


# ------------------------------------------------------------------------------------ end to end
def index_references(refs: Sequence[Sequence[str]]) -> tuple[list[str], torch.Tensor]:
    """Distinct reference strings and the (N, R) index of each item's references (-1 = none)."""
    uniq: dict[str, int] = {}
    r = max((len(x) for x in refs), default=0)
    idx = torch.full((len(refs), r), -1, dtype=torch.long)
    for i, item in enumerate(refs):
        for j, text in enumerate(item):
            idx[i, j] = uniq.setdefault(text, len(uniq))
    return list(uniq), idx


def extract(sentence: SentenceEncoder, clip, images: Sequence, captions: Sequence[str],
            refs: Sequence[Sequence[str]], *, clip_prefix: str, batch_size: int = 64) -> Features:
    """Run the two extractors (shared by Polos and DENEB): each distinct image once, each distinct text
    (candidate or reference) once per encoder. ``clip``: the CLIP tower (a Backbone) or an
    :class:`~capscore.embed.engine.Encoder` of it (its cache, shared with the run's other metrics);
    ``sentence``: a SentenceEncoder or a :class:`~capscore.embed.engine.CachedSentences` of one."""
    if not (len(images) == len(captions) == len(refs)):
        raise CapscoreError(f"{len(images)} images, {len(captions)} captions and {len(refs)} reference lists; "
                            "expected one of each per item")
    ref_texts, ref_index = index_references(refs)
    texts = list(dict.fromkeys(list(captions) + ref_texts))
    pos = {t: i for i, t in enumerate(texts)}
    encoder = clip if isinstance(clip, Encoder) else Encoder(clip, batch_size=batch_size)
    image = encoder.encode_images(list(images), raw=True)  # a bad image: InputError naming it, before any text
    sentences = sentence.encode(texts, batch_size=batch_size)
    clip_texts = encoder.encode_texts([clip_prefix + t for t in texts], raw=True)
    cand_rows = torch.tensor([pos[t] for t in captions], dtype=torch.long)
    ref_rows = torch.tensor([pos[t] for t in ref_texts], dtype=torch.long)
    return Features(
        cand=sentences.select(cand_rows), refs=sentences.select(ref_rows), ref_index=ref_index, image=image,
        cand_clip=clip_texts[cand_rows], ref_clip=clip_texts[ref_rows])


def subset(feats: Features, rows: slice) -> Features:
    """The features of items ``rows`` (references keep their shared table)."""
    return Features(feats.cand.select(rows), feats.refs, feats.ref_index[rows], feats.image[rows],
                         feats.cand_clip[rows], feats.ref_clip)


def run_head(head_fn, feats: Features, *, layer_norm: str, batch_size: int) -> list[float]:
    """Apply ``head_fn(features, layer_norm=...)`` to consecutive groups of ``batch_size`` items — the
    grouping matters only for ``layer_norm="batch"``, where a group is one authors' batch."""
    if layer_norm not in LAYER_NORMS:
        raise param_error("layer_norm", "run_head", f"one of {list(LAYER_NORMS)}", layer_norm)
    n = len(feats.cand)
    step = batch_size if layer_norm == "batch" else max(n, 1)
    out: list[float] = []
    for s in range(0, n, step):
        out += head_fn(subset(feats, slice(s, s + step)), layer_norm=layer_norm).tolist()
    return out


def score_polos(model: PolosModel, images: Sequence, captions: Sequence[str], refs: Sequence[Sequence[str]], *,
                layer_norm: str = "sentence", batch_size: int = 32, encode_batch_size: int = 64,
                clip=None, sentence=None) -> list[float]:
    """Polos for each (image, caption, references) item: features once for all items (encoders in batches
    of ``encode_batch_size``), then the head (in groups of ``batch_size`` for ``layer_norm="batch"``: the
    authors' batch). ``clip``: an Encoder of ``model.clip`` or of a backbone giving the same vectors (the
    run's; default: a new one in memory); ``sentence``: ``model.sentence`` through a cache
    (:class:`capscore.embed.engine.CachedSentences`; default: ``model.sentence`` itself)."""
    feats = extract(model.sentence if sentence is None else sentence, model.clip if clip is None else clip, images,
                    captions, refs, clip_prefix=CLIP_PREFIX, batch_size=encode_batch_size)
    return run_head(lambda f, layer_norm: polos_head(f, model.head, layer_norm=layer_norm), feats,
                    layer_norm=layer_norm, batch_size=batch_size)


__all__ = [
    "CHECKPOINT", "CITATION", "CLIP_PREFIX", "Features", "PolosHead", "PolosModel", "SIMCSE", "ScalarMix",
    "extract", "load_polos", "mix_layers", "mlp", "polos_head", "read_polos", "run_head", "score_polos",
]
