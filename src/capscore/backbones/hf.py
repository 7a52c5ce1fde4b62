"""Adapter for Hugging Face transformers ``CLIPModel`` and ``SiglipModel``.

``hf:ID_OR_DIR``: a local folder (``config.json`` + weights + processor files)
or a hub id. Hub ids resolve from the local HF cache only when
``HF_HUB_OFFLINE=1`` (or no network); ``trust_remote_code`` is passed to
transformers only when the user gave the flag.

Features (joint space, not normalised; the engine normalises):

* global image/text: the projected embeddings, ``get_image_features`` /
  ``get_text_features`` (transformers 5 returns an output object whose
  ``pooler_output`` is the projection; older versions return the tensor — both
  are accepted);
* CLIP patch tokens: vision ``last_hidden_state`` without the class token ->
  ``post_layernorm`` -> ``visual_projection`` (the same path the class token
  takes, as open_clip's patch tokens do);
* CLIP per-token text features: text ``last_hidden_state`` (already after the
  final layer norm) -> ``text_projection``.

CLIP's text tower is causal and pooled at the end-of-text token, so a batch
padded to its longest caption gives the vectors of a batch padded to the
context (``pad_to_longest_exact=True``). SigLIP pools the *last* position of a
fixed-length sequence, so it is padded to its context length with the
tokenizer's pad token (``pad_to_longest_exact=False``).

SigLIP patch tokens: its image embedding is an attention-pooling head (a learned
probe attends over the post-layernorm patch states, then ``x + MLP(LN(x))``), so
the patch states are not in the joint space themselves. capscore maps each patch
through the head *as if the probe attended to that patch alone* — the value path
``out_proj(W_v x_j + b_v)``, then the head's residual MLP — the attention-pooling
analogue of MaskCLIP's dense features. For a one-patch image this is exactly the
pooled embedding. SigLIP exposes no per-token text features here: its text tower is
bidirectional over a padded sequence and has no start token, which ABE-CLIP's token
selection assumes.
"""
from __future__ import annotations

import pickle

import json
import contextlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from PIL import Image

from capscore._optional import require
from capscore.backbones.base import Backbone, pickle_refused, resolve_dtype, weights_files
from capscore.errors import CapscoreError
from capscore.backbones.offline import require_hf_repo

SUPPORTED = {"clip": "CLIPModel", "siglip": "SiglipModel"}


def _pooled(out) -> torch.Tensor:
    """Features from ``get_*_features``: a tensor (transformers < 5) or an output object (5)."""
    if isinstance(out, torch.Tensor):
        return out
    pooled = getattr(out, "pooler_output", None)
    if pooled is None:
        pooled = out[0] if isinstance(out, (tuple, list)) else out["pooler_output"]
    return pooled


def siglip_patch_tokens(head, states: torch.Tensor) -> torch.Tensor:
    """SigLIP's attention-pooling head applied to every patch alone: (B, N, W) -> (B, N, D).

    With all of the probe's attention on patch j the head returns
    ``h_j + MLP(LN(h_j))``, ``h_j = out_proj(W_v x_j + b_v)`` (see the module docstring).
    """
    att = head.attention  # torch.nn.MultiheadAttention, fused in_proj (q, k, v)
    width = states.shape[-1]
    w_v, b_v = att.in_proj_weight[2 * width :], att.in_proj_bias[2 * width :]
    h = torch.nn.functional.linear(torch.nn.functional.linear(states, w_v, b_v), att.out_proj.weight, att.out_proj.bias)
    return h + head.mlp(head.layernorm(h))


class HFBackbone(Backbone):
    family = "hf"

    def __init__(self, model, tokenizer, image_processor, *, spec: str, context_length: int | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.spec = spec
        self.kind = getattr(model.config, "model_type", "?")
        text_cfg = getattr(model.config, "text_config", model.config)
        max_pos = int(getattr(text_cfg, "max_position_embeddings", 77))
        if context_length is not None and context_length > max_pos:
            raise CapscoreError(
                f"hf:{spec}: the text tower has {max_pos} positions; cannot use a context of {context_length}"
            )
        self.context_length = int(context_length or max_pos)
        self.is_clip = self.kind == "clip"
        self.eot_id = int(tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.eot_id)
        self.pad_to_longest_exact = self.is_clip
        vision = getattr(model, "vision_model", None)
        self.has_patch_tokens = self.is_clip or (self.kind == "siglip" and hasattr(vision, "head"))
        self.has_token_features = self.is_clip
        self.embed_dim = int(
            getattr(model.config, "projection_dim", 0) or getattr(text_cfg, "projection_size", 0) or text_cfg.hidden_size
        )
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype

    @property
    def preprocess_id(self) -> str:
        return json.dumps(self.image_processor.to_dict(), sort_keys=True, default=str)

    def preprocess(self, image: Image.Image) -> torch.Tensor:
        return self.image_processor(images=image.convert("RGB"), return_tensors="pt")["pixel_values"][0]

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        level = logging.getLogger("transformers.tokenization_utils_base").level
        logging.getLogger("transformers.tokenization_utils_base").setLevel(logging.ERROR)  # "longer than max" notice
        try:
            enc = self.tokenizer(list(texts), add_special_tokens=True, truncation=False, padding=False)
        finally:
            logging.getLogger("transformers.tokenization_utils_base").setLevel(level)
        return [list(map(int, row)) for row in enc["input_ids"]]

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        return [t.replace("</w>", "") for t in self.tokenizer.convert_ids_to_tokens(list(ids))]

    def forward_images(self, pixels, *, patches=False):
        pixels = pixels.to(self.device, self.dtype)
        if not patches:
            return _pooled(self.model.get_image_features(pixel_values=pixels)), None
        if not self.has_patch_tokens:
            raise NotImplementedError
        vm = self.model.vision_model
        out = vm(pixel_values=pixels)
        if not self.is_clip:
            return out.pooler_output, siglip_patch_tokens(vm.head, out.last_hidden_state)
        pooled = self.model.visual_projection(out.pooler_output)
        tokens = self.model.visual_projection(vm.post_layernorm(out.last_hidden_state[:, 1:]))  # (B, N, D)
        return pooled, tokens

    def forward_texts(self, ids, lengths, *, tokens=False):
        ids = ids.to(self.device)
        if not tokens:
            return _pooled(self.model.get_text_features(input_ids=ids)), None
        if not self.has_token_features:
            raise NotImplementedError
        out = self.model.text_model(input_ids=ids)
        proj = self.model.text_projection
        return proj(out.pooler_output), proj(out.last_hidden_state)  # (B, D), (B, L, D)


def _resolve(rest: str) -> tuple[str, bool]:
    """-> (what to pass to from_pretrained, is it a local folder). Errors name the folder.

    A hub id is ``NAME`` or ``ORG/NAME``; anything starting with ``.``, ``/`` or
    ``~``, with more than one ``/``, or existing on disk is a local path.
    """
    p = Path(rest).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise CapscoreError(f"{p}: not a Hugging Face model folder (no config.json)")
        return str(p), True
    if p.exists():
        raise CapscoreError(f"{p}: is a file; hf: expects a model folder or a hub id (for a .pt state dict use ckpt:{rest})")
    if rest.startswith((".", "/", "~")) or rest.count("/") > 1 or "\\" in rest:
        raise CapscoreError(f"{p}: Hugging Face model folder not found")
    return rest, False


@contextlib.contextmanager
def quiet_transformers():
    """Silence transformers' info logs and per-tensor progress bars while loading or saving; restore after."""
    transformers = require("transformers", purpose="Hugging Face models")

    logger = logging.getLogger("transformers")
    level, bars = logger.level, transformers.utils.logging.is_progress_bar_enabled()
    logger.setLevel(logging.ERROR)
    transformers.utils.logging.disable_progress_bar()
    try:
        yield
    finally:
        logger.setLevel(level)
        if bars:
            transformers.utils.logging.enable_progress_bar()


def load_hf(
    rest: str,
    *,
    spec: str,
    device: str = "cpu",
    dtype: str = "fp32",
    seed: int = 0,
    context_length: int | None = None,
    trust_remote_code: bool = False,
) -> HFBackbone:
    """``hf:ID_OR_DIR`` -> :class:`HFBackbone` (``CLIPModel`` or ``SiglipModel``). ``seed`` is unused."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    transformers = require("transformers", purpose="--model hf:ID_OR_DIR")
    from huggingface_hub.utils import HfHubHTTPError

    name, local = _resolve(rest)
    offline = local or os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false")
    if not local:
        require_hf_repo(spec, name, ("config.json",))  # not cached and no network: one line, no retries
    kw = dict(local_files_only=offline, trust_remote_code=trust_remote_code)
    try:
        with quiet_transformers():
            config = transformers.AutoConfig.from_pretrained(name, **kw)
    except (OSError, ValueError, HfHubHTTPError) as e:
        where = name if local else f"hf:{name}"
        why = "not in the local Hugging Face cache (offline)" if offline and not local else str(e).splitlines()[0][:120]
        raise CapscoreError(f"{where}: cannot load the model config ({why})") from None
    kind = getattr(config, "model_type", "?")
    if kind in SUPPORTED:
        model_cls = getattr(transformers, SUPPORTED[kind])
    elif trust_remote_code:
        model_cls = transformers.AutoModel
    else:
        raise CapscoreError(
            f"{name}: model type {kind!r} is not supported by hf: (supported: {', '.join(SUPPORTED)}); "
            "models with their own code need --trust-remote-code"
        )
    try:
        with quiet_transformers():
            model = model_cls.from_pretrained(name, dtype=torch.float32, **kw)
            tokenizer = transformers.AutoTokenizer.from_pretrained(name, **kw)
            image_processor = transformers.AutoImageProcessor.from_pretrained(name, **kw)
    except pickle.UnpicklingError:
        raise pickle_refused(weights_files(name) if local else f"hf:{name}") from None
    except (OSError, ValueError, HfHubHTTPError) as e:
        raise CapscoreError(f"{name}: cannot load the model, tokenizer or image processor ({str(e).splitlines()[0][:160]})") from None
    if not (hasattr(model, "get_image_features") and hasattr(model, "get_text_features")):
        raise CapscoreError(f"{name}: {type(model).__name__} has no get_image_features/get_text_features")
    bb = HFBackbone(model, tokenizer, image_processor, spec=spec, context_length=context_length)
    return bb.to(device, resolve_dtype(dtype))
