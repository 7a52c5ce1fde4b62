"""Multilingual text student + CLIP image tower (M-CLIP, Carlsson et al. LREC 2022; PR-MCS shape).

``mclip:DIR`` where DIR holds

* a transformers text encoder (``config.json`` + weights, loaded with ``AutoModel``)
  and its tokenizer files (``AutoTokenizer``);
* ``projection.safetensors``: the linear map into the CLIP joint space,
  ``weight`` (D, H) and optionally ``bias`` (D,) — M-CLIP's ``LinearTransformation``;
* ``capscore_mclip.json``: ``{"image_spec": "ViT-B-32/openai", "pooling": "mean",
  "embed_dim": 512, "image_seed": 0}`` — the ``--model`` spec of the CLIP image
  tower whose space the student was distilled into, how token states are pooled,
  and the joint width (checked against the projection and the image tower).

Text vector = projection(pool(last_hidden_state)). ``pooling="mean"`` (the
default, as M-CLIP) averages the hidden states of the real tokens, special
tokens included, weighted by the attention mask:
``sum_i m_i h_i / sum_i m_i``. Because padded positions are masked out of
attention *and* of the average, a batch padded to its longest caption gives
the vectors of unpadded captions (``pad_to_longest_exact=True``).
``pooling="cls"`` takes the first token's state instead.

Images go through the named image tower unchanged (its preprocessing, its
patch tokens). Per-token text features are not offered.

A relative path inside ``image_spec`` (``ckpt:teacher.pt``) is resolved
against DIR when such a file exists there, so the folder can be moved whole.
"""
from __future__ import annotations

import pickle

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from capscore._optional import require
from capscore.backbones.base import Backbone, pickle_refused, resolve_dtype, weights_files
from capscore.errors import CapscoreError, param_error
from capscore.backbones.hf import quiet_transformers
from capscore.backbones.registry import load_backbone

CONFIG_NAME = "capscore_mclip.json"
PROJECTION_NAME = "projection.safetensors"
POOLINGS = ("mean", "cls")


def masked_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, L, H) states, (B, L) 0/1 mask -> (B, H) mean over the unmasked positions."""
    m = mask.to(hidden.dtype).unsqueeze(-1)  # (B, L, 1)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)


class MultilingualBackbone(Backbone):
    family = "mclip"

    def __init__(self, text_model, tokenizer, projection: torch.nn.Linear, image: Backbone, *, spec: str,
                 pooling: str = "mean", context_length: int | None = None):
        if pooling not in POOLINGS:
            raise param_error("pooling", "MultilingualBackbone", f"one of {POOLINGS}", pooling)
        self.text_model = text_model.eval()
        self.tokenizer = tokenizer
        self.projection = projection.eval()
        self.image = image
        self.pooling = pooling
        self.spec = spec
        self.model = torch.nn.ModuleDict({"text": self.text_model, "projection": self.projection, "image": image.model})
        limits = [int(getattr(text_model.config, "max_position_embeddings", 512))]
        if 0 < int(getattr(tokenizer, "model_max_length", 0) or 0) < 100_000:
            limits.append(int(tokenizer.model_max_length))
        max_len = min(limits)
        if context_length is not None and context_length > max_len:
            raise CapscoreError(f"{spec}: the text encoder takes at most {max_len} tokens; cannot use a context of {context_length}")
        self.context_length = int(context_length or max_len)
        end = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
        self.eot_id = int(end if end is not None else 0)
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self.pad_to_longest_exact = True
        self.has_patch_tokens = image.has_patch_tokens
        self.has_token_features = False
        self.embed_dim = int(projection.out_features)
        p = next(text_model.parameters())
        self.device, self.dtype = p.device, p.dtype

    @property
    def preprocess_id(self) -> str:
        return "mclip|" + self.image.preprocess_id

    def preprocess(self, image: Image.Image) -> torch.Tensor:
        return self.image.preprocess(image)

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        log = logging.getLogger("transformers.tokenization_utils_base")
        level = log.level
        log.setLevel(logging.ERROR)
        try:
            enc = self.tokenizer(list(texts), add_special_tokens=True, truncation=False, padding=False)
        finally:
            log.setLevel(level)
        return [list(map(int, row)) for row in enc["input_ids"]]

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        return list(self.tokenizer.convert_ids_to_tokens(list(ids)))

    def forward_images(self, pixels, *, patches=False):
        return self.image.forward_images(pixels, patches=patches)

    def forward_texts(self, ids, lengths, *, tokens=False):
        if tokens:
            raise NotImplementedError
        ids = ids.to(self.device)
        mask = (torch.arange(ids.shape[1], device=ids.device)[None, :] < lengths.to(ids.device)[:, None]).long()
        hidden = self.text_model(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, L, H)
        pooled = masked_mean(hidden, mask) if self.pooling == "mean" else hidden[:, 0]
        return self.projection(pooled), None

    @property
    def logit_scale(self) -> torch.Tensor:
        return self.image.logit_scale

    def to(self, device=None, dtype=None):
        super().to(device, dtype)
        self.image.device, self.image.dtype = self.device, self.dtype
        self.image.invalidate_identity()
        return self


_LOADING: set[str] = set()  # mclip folders being loaded (detects an image_spec loop)


def _resolve_image_spec(image_spec: str, folder: Path) -> str:
    head, sep, rest = image_spec.partition(":")
    prefixed = bool(sep) and head in ("ckpt", "mclip")
    candidate = rest if prefixed else image_spec
    path = Path(candidate.split("#")[0]).expanduser()
    if not path.is_absolute() and (folder / path).exists():
        resolved = str(folder / candidate)
        return f"{head}:{resolved}" if prefixed else resolved
    return image_spec


def load_multilingual(
    rest: str,
    *,
    spec: str,
    device: str = "cpu",
    dtype: str = "fp32",
    seed: int = 0,
    context_length: int | None = None,
    trust_remote_code: bool = False,
) -> MultilingualBackbone:
    """``mclip:DIR`` -> :class:`MultilingualBackbone` (see the module docstring for the folder layout)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    transformers = require("transformers", purpose="--model mclip:DIR")

    folder = Path(rest).expanduser()
    if not folder.is_dir():
        raise CapscoreError(f"{folder}: multilingual model folder not found")
    cfg_path = folder / CONFIG_NAME
    if not cfg_path.is_file():
        raise CapscoreError(f"{folder}: not a capscore multilingual folder (no {CONFIG_NAME})")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CapscoreError(f"{cfg_path}:{e.lineno}: invalid JSON ({e.msg})") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("image_spec"), str):
        raise CapscoreError(f"{cfg_path}: needs a string 'image_spec' (the image tower's --model spec)")
    pooling = cfg.get("pooling", "mean")
    if pooling not in POOLINGS:
        raise CapscoreError(f"{cfg_path}: pooling must be one of {', '.join(POOLINGS)}; got {pooling!r}")
    proj_path = folder / PROJECTION_NAME
    if not proj_path.is_file():
        raise CapscoreError(f"{folder}: missing {PROJECTION_NAME} (the linear map into the CLIP space)")
    try:
        tensors = load_file(str(proj_path))
    except Exception as e:  # noqa: BLE001  (safetensors raises several types on a bad file)
        raise CapscoreError(f"{proj_path}: not a readable safetensors file ({str(e).splitlines()[0][:100]})") from None
    if "weight" not in tensors or tensors["weight"].ndim != 2:
        raise CapscoreError(f"{proj_path}: needs a 2-D 'weight' tensor (D, H); found {sorted(tensors)}")
    weight = tensors["weight"].float()
    bias = tensors.get("bias")
    projection = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    with torch.no_grad():
        projection.weight.copy_(weight)
        if bias is not None:
            projection.bias.copy_(bias.float())

    kw = dict(local_files_only=True, trust_remote_code=trust_remote_code)
    try:
        with quiet_transformers():
            text_model, info = transformers.AutoModel.from_pretrained(
                str(folder), dtype=torch.float32, output_loading_info=True, **kw
            )
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), **kw)
    except pickle.UnpicklingError:
        raise pickle_refused(weights_files(folder)) from None
    except (OSError, ValueError) as e:
        raise CapscoreError(f"{folder}: cannot load the text encoder or tokenizer ({str(e).splitlines()[0][:160]})") from None
    # Weights absent from the folder are randomly initialised by transformers on every load.
    # A pooler head (e.g. BERT's, saved without it) is unused by mean/CLS pooling: drop it, so it
    # neither changes between loads nor enters the weights hash (the cache key). Anything else
    # missing would make the vectors random: refuse.
    missing = [k for k in info.get("missing_keys", []) if not k.startswith("pooler.")]
    if missing:
        raise CapscoreError(f"{folder}: the text encoder's weights lack {len(missing)} tensors (e.g. {missing[0]!r})")
    if any(k.startswith("pooler.") for k in info.get("missing_keys", [])) and hasattr(text_model, "pooler"):
        text_model.pooler = None
    hidden = int(getattr(text_model.config, "hidden_size", weight.shape[1]))
    if weight.shape[1] != hidden:
        raise CapscoreError(f"{proj_path}: projection takes {weight.shape[1]} inputs but the text encoder gives {hidden}")

    try:
        image_seed = int(cfg.get("image_seed", seed))
    except (TypeError, ValueError):
        raise CapscoreError(f"{cfg_path}: 'image_seed' must be an integer; got {cfg.get('image_seed')!r}") from None
    key = str(folder.resolve())
    if key in _LOADING:  # an image_spec that leads back here would recurse until Python gives up
        raise CapscoreError(f"{cfg_path}: image_spec {cfg['image_spec']!r} leads back to {folder} (a loop); "
                            "it must name a CLIP image tower, e.g. ViT-B-32/openai")
    _LOADING.add(key)
    try:
        image = load_backbone(_resolve_image_spec(cfg["image_spec"], folder), device="cpu", dtype="fp32",
                              seed=image_seed, trust_remote_code=trust_remote_code)
    finally:
        _LOADING.discard(key)
    dims = {"projection": weight.shape[0], "image tower": image.embed_dim}
    if "embed_dim" in cfg:
        dims[CONFIG_NAME] = int(cfg["embed_dim"])
    if len(set(dims.values())) != 1:
        raise CapscoreError(f"{folder}: joint-space widths disagree: " + ", ".join(f"{k} {v}" for k, v in dims.items()))
    bb = MultilingualBackbone(text_model, tokenizer, projection, image, spec=spec, pooling=pooling,
                              context_length=context_length)
    return bb.to(device, resolve_dtype(dtype))


def save_multilingual(
    folder: str | Path,
    *,
    text_model,
    tokenizer,
    projection: torch.nn.Linear | torch.Tensor,
    image_spec: str,
    pooling: str = "mean",
    image_seed: int = 0,
) -> Path:
    """Write a distilled student so that ``mclip:FOLDER`` loads it (see the module docstring).

    ``projection`` is an ``nn.Linear(H, D)`` or a (D, H) weight tensor (no bias).
    ``image_seed`` only matters for random-init image towers (tests).
    """
    if pooling not in POOLINGS:
        raise param_error("pooling", "save_multilingual", f"one of {POOLINGS}", pooling)

    out = Path(folder).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    text_model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if isinstance(projection, torch.nn.Linear):
        tensors = {"weight": projection.weight.detach().float().cpu().contiguous()}
        if projection.bias is not None:
            tensors["bias"] = projection.bias.detach().float().cpu().contiguous()
    else:
        if projection.ndim != 2:
            raise param_error("projection", "save_multilingual", "an nn.Linear or a 2-D (D, H) tensor", tuple(projection.shape))
        tensors = {"weight": projection.detach().float().cpu().contiguous()}
    save_file(tensors, str(out / PROJECTION_NAME))
    cfg = {"image_spec": image_spec, "pooling": pooling, "embed_dim": int(tensors["weight"].shape[0]),
           "image_seed": int(image_seed)}
    (out / CONFIG_NAME).write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    return out
