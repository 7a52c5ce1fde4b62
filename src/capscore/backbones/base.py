"""The backbone protocol: what every dual encoder offers the rest of capscore.

A backbone turns *prepared* inputs into vectors in the joint image-text space;
it never batches, caches or normalises on its own — that is the encoding
engine's job (:mod:`capscore.embed`). Trainers call the ``forward_*`` methods
directly, with gradients; evaluation goes through the engine.
"""
from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from weakref import WeakKeyDictionary

import numpy as np
import torch
from PIL import Image

from capscore.errors import CapscoreError, param_error
from capscore.backbones.hashcache import cached_hash, file_fingerprint, source_key
from capscore.backbones.lazy import LazyBackbone

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype

    if dtype not in DTYPES:
        raise param_error("dtype", "load_backbone", f"one of {sorted(DTYPES)}", dtype)
    return DTYPES[dtype]


def available_devices() -> list[str]:
    """The devices this machine can run on, as ``--device`` strings."""
    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        found.append("mps")
    return found


def resolve_device(device: str | torch.device) -> torch.device:
    """``--device`` string -> torch.device, checked against what this machine has.

    The one place every command's ``--device`` goes through (via ``load_backbone``
    and :meth:`Backbone.to`): ``cuda`` on a machine without CUDA, ``cuda:3`` with
    one GPU, or a name torch does not know fail with one line naming the device
    and what is available, instead of a traceback deep inside the first forward.
    """
    if isinstance(device, torch.device):
        dev = device
    else:
        try:
            dev = torch.device(str(device).strip().lower())
        except (RuntimeError, ValueError):
            dev = None
        if dev is None or dev.type not in ("cpu", "cuda", "mps"):
            raise CapscoreError(f"--device {device!r} is not a device name; available here: "
                                f"{', '.join(available_devices())}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this PyTorch was built without CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise CapscoreError(f"--device {device}: CUDA is not available ({why}); available here: "
                                f"{', '.join(available_devices())}")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise CapscoreError(f"--device {device}: there are {torch.cuda.device_count()} CUDA device(s); "
                                f"available here: {', '.join(available_devices())}")
    if dev.type == "mps" and "mps" not in available_devices():
        raise CapscoreError(f"--device {device}: MPS is not available; available here: {', '.join(available_devices())}")
    return dev


def pickle_refused(path: str | Path) -> CapscoreError:
    """The one message for a weights file holding Python objects (refused, never executed)."""
    return CapscoreError(
        f"{path}: holds pickled Python objects besides tensors; capscore loads checkpoints only with "
        "torch.load(weights_only=True) — re-save just the state dict (or use .safetensors)"
    )


def weights_files(folder: str | Path) -> str:
    """The pickle-format weight files of a model folder, for naming them in an error."""
    found = sorted(Path(folder).expanduser().glob("*.bin")) + sorted(Path(folder).expanduser().glob("*.pt*"))
    return ", ".join(str(f) for f in found) or str(folder)


def weights_hash(module: torch.nn.Module) -> str:
    """SHA-256 over every parameter and buffer (names, shapes, dtypes, bytes).

    Part of the backbone identity, hence of every cache key: two checkpoints
    with the same name but different weights never share cached vectors.
    """
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        h.update(memoryview(t.numpy()).cast("B") if t.numel() else b"")
    return h.hexdigest()[:16]


class Backbone(ABC):
    """A CLIP-style dual encoder seen through one interface.

    Attributes set by adapters:
      family          adapter name ("open_clip", "openai-ckpt", "hf", "mclip", ...)
      spec            the ``--model`` string it was loaded from
      context_length  the text tower's maximum number of tokens (77, 248, ...)
      embed_dim       width of the global vectors (the joint space of CLIP-S and every global score)
      token_dim       width of patch and word tokens (``forward_images(patches=True)``,
                      ``forward_texts(tokens=True)``): ``embed_dim`` except under a second-order
                      global read-out (:mod:`capscore.backbones.readout`), where it is √embed_dim
      eot_id, pad_id  token ids used when the engine pads and truncates
      pad_to_longest_exact
                      True when padding a batch to its longest caption gives
                      the same vectors as padding to ``context_length``
                      (causal text towers pooled at the end-of-text token).
      has_patch_tokens / has_token_features
                      whether ``forward_images(patches=True)`` and
                      ``forward_texts(tokens=True)`` are supported.
      supports_packed_text
                      whether ``forward_packed_texts`` is (causal towers whose blocks take
                      a per-row attention mask).
    """

    family: str = "?"
    spec: str = "?"
    context_length: int = 77
    embed_dim: int = 0
    eot_id: int = 0
    pad_id: int = 0
    pad_to_longest_exact: bool = True
    has_patch_tokens: bool = False
    has_token_features: bool = False
    model: torch.nn.Module
    device: torch.device = torch.device("cpu")
    dtype: torch.dtype = torch.float32

    # When images become RGB: "first" (capscore: on decode, then resize) or "after-crop" (the
    # clipscore.py / pacscore order: resize + crop in the file's own mode, then convert; PIL then
    # resizes palette images with nearest-neighbour). Part of the identity, hence of every cache key.
    rgb_order: str = "first"
    RGB_ORDERS = ("first", "after-crop")
    supports_rgb_after_crop: bool = False
    _identity: str | None = None
    # (key of capscore.backbones.hashcache) set by load_backbone when the weights came from known files
    _weights_source: str | None = None

    _token_dim: int | None = None

    @property
    def token_dim(self) -> int:
        return self._token_dim or self.embed_dim

    # --- identity -----------------------------------------------------------------
    @property
    @abstractmethod
    def preprocess_id(self) -> str:
        """A string that changes whenever image preprocessing changes."""

    @property
    def identity(self) -> str:
        """``family:spec|weights-hash|ctx|preprocess``: the cache key of every vector."""
        if self._identity is None:
            self._identity = (
                f"{self.family}:{self.spec}|w={self._weights_hash()}|ctx={self.context_length}"
                f"|pre={hashlib.sha1(self.preprocess_id.encode()).hexdigest()[:10]}"
            ) + ("" if self.rgb_order == "first" else f"|rgb={self.rgb_order}")
        return self._identity

    @property
    def weights_digest(self) -> str:
        """The weights hash of :attr:`identity` (computed with it, once)."""
        return self.identity.split("|w=", 1)[1].split("|", 1)[0]

    def set_rgb_order(self, order: str) -> None:
        """``"first"`` (default) or ``"after-crop"`` (the reference scripts' order; see ``rgb_order``)."""
        if order not in self.RGB_ORDERS:
            raise param_error("rgb_order", "load_backbone", f"one of {list(self.RGB_ORDERS)}", order)
        if order != "first" and not self.supports_rgb_after_crop:
            raise CapscoreError(f"{self.spec}: rgb_order 'after-crop' needs a torchvision-style transform that "
                                "converts to RGB after resizing (open_clip and ckpt: backbones); this backbone's "
                                "image processor converts first")
        self.rgb_order = order
        self.invalidate_identity()

    @property
    def image_size(self) -> int | None:
        """Side in pixels of the image tower's square input (None when the model does not say):
        open_clip's ``visual.image_size`` or a transformers ``config.vision_config.image_size``."""
        size = getattr(getattr(self.model, "visual", None), "image_size", None)
        if size is None:
            size = getattr(getattr(getattr(self.model, "config", None), "vision_config", None), "image_size", None)
        if isinstance(size, (tuple, list)):
            size = size[0]
        return int(size) if size else None

    def _weights_hash(self) -> str:
        """:func:`weights_hash`, remembered per weights file when the loader recorded one."""
        if self._weights_source is None:
            return weights_hash(self.model)

        return cached_hash(self._weights_source, lambda: weights_hash(self.model))

    def remember_weights_files(self, files, recipe: str) -> None:
        """Weights were loaded from ``files`` (as ``recipe`` says): their hash may come from the hash cache
        (:mod:`capscore.backbones.hashcache`), keyed by each file's path, size and mtime."""
        fp = file_fingerprint(files)
        self._weights_source = None if fp is None else source_key(fp, f"{type(self).__name__}|{recipe}")
        self._identity = None

    def invalidate_identity(self) -> None:
        """Call after changing weights in place (training)."""
        self._identity = None
        self._weights_source = None  # the weights may no longer be the file's

    # --- inputs ---------------------------------------------------------------------
    @abstractmethod
    def preprocess(self, image: Image.Image) -> torch.Tensor:
        """PIL image -> (C, H, W) float tensor."""

    @abstractmethod
    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Full token ids with start/end tokens, *not* truncated (the engine truncates)."""

    def truncate(self, ids: list[int]) -> list[int]:
        """Fit ``ids`` into the context, keeping the end-of-text token.

        torchmetrics' CLIPScore cuts the end-of-text token off long captions
        (its issue #2883) and then pools a content token; we never do.
        """
        if len(ids) <= self.context_length:
            return ids
        return ids[: self.context_length - 1] + [ids[-1]]

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """Human-readable token strings (for explanations); adapters may override."""
        return [str(i) for i in ids]

    # --- forward passes (joint space, not normalised) ---------------------------------
    @abstractmethod
    def forward_images(
        self, pixels: torch.Tensor, *, patches: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, C, H, W) -> global (B, D) and, if asked, patch tokens (B, N, D)."""

    @abstractmethod
    def forward_texts(
        self, ids: torch.Tensor, lengths: torch.Tensor, *, tokens: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Padded ids (B, L) with true lengths (B,) -> global (B, D) and, if asked, tokens (B, L, D)."""

    # Packed short texts (Encoder.masked_text_tokens; ABE-CLIP's phrases): several texts that share a prefix in one row.
    supports_packed_text: bool = False

    def forward_packed_texts(
        self, ids: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor
    ) -> torch.Tensor:
        """Token features (B, L, token_dim) of packed rows, not normalised.

        ``ids`` (B, L) token ids, ``positions`` (B, L) each token's position in its own text,
        ``allowed`` (B, L, L) bool: query j may attend key i. Only causal text towers whose
        per-token features depend on nothing but the tokens a token attends to can pack
        (``supports_packed_text``); the caller builds masks that reproduce each text's own
        causal view, so every feature equals the one of the text encoded alone."""
        raise NotImplementedError

    @property
    def logit_scale(self) -> torch.Tensor:
        scale = getattr(self.model, "logit_scale", None)
        return scale if scale is not None else torch.tensor(np.log(100.0))

    def to(self, device: str | torch.device | None = None, dtype: str | torch.dtype | None = None) -> "Backbone":
        if device is not None:
            self.device = resolve_device(device)
        if dtype is not None:
            self.dtype = resolve_dtype(dtype)
        self.model.to(device=self.device, dtype=self.dtype)
        self.invalidate_identity()  # reduced precision changes the vectors
        return self

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.spec} ctx={self.context_length} dim={self.embed_dim}>"


_PROBE_TEXTS = ("A photo depicts a red bus, parked; two dogs!", "x")
_PROBED: WeakKeyDictionary = WeakKeyDictionary()  # a -> {b: whether the probe gave the same vectors}


def same_vectors(a, b) -> bool:
    """Whether backbones ``a`` and ``b`` give the same vectors for every input, so that one encoder (and its
    cache) can serve both: the same width, context, padding rule and RGB order, device and dtype, the same
    weights (:attr:`Backbone.weights_digest`), and — which the weights alone do not settle (a QuickGELU and a
    GELU tower share one state dict; an image transform is not in it) — the same token ids, preprocessed
    pixels and forward outputs on a probe image and two probe texts (once per pair of backbones). Cheap
    facts first: a backbone of another width or weights is told apart without building a lazy one."""
    if a is b:
        return True
    facts = ("embed_dim", "context_length", "rgb_order", "pad_to_longest_exact")
    if any(getattr(a, f) != getattr(b, f) for f in facts) or a.weights_digest != b.weights_digest:
        return False
    if a.device != b.device or a.dtype != b.dtype or a.pad_id != b.pad_id:
        return False
    probed = _PROBED.setdefault(a, WeakKeyDictionary())
    if b not in probed:  # the facts above are read every call; the probe's forwards run once per pair
        probed[b] = _probe(a, b)
    return probed[b]


def _probe(a, b) -> bool:
    """Equal token ids, preprocessed pixels and forwards of ``a`` and ``b`` on a probe image and two texts."""
    grid = np.linspace(0, 255, 61 * 47 * 3).reshape(47, 61, 3)
    image = Image.fromarray(((grid * 7.3) % 256).astype(np.uint8))
    pa, pb = a.preprocess(image), b.preprocess(image)
    if pa.shape != pb.shape or not torch.equal(pa, pb):
        return False
    ids = a.tokenize(list(_PROBE_TEXTS))
    if ids != b.tokenize(list(_PROBE_TEXTS)):
        return False
    width = max(len(r) for r in ids) if a.pad_to_longest_exact else a.context_length
    x = torch.full((len(ids), width), a.pad_id, dtype=torch.long)
    for j, r in enumerate(ids):
        x[j, : len(r)] = torch.tensor(r[:width], dtype=torch.long)
    lengths = torch.tensor([min(len(r), width) for r in ids])
    with torch.inference_mode():
        outs = [(bb.forward_images(pa[None].to(bb.device, bb.dtype))[0].float().cpu(),
                 bb.forward_texts(x.to(bb.device), lengths)[0].float().cpu()) for bb in (a, b)]
    return all(torch.allclose(u, v, rtol=1e-5, atol=1e-6) for u, v in zip(*outs))


def _register_stand_in() -> None:
    Backbone.register(LazyBackbone)  # the warm-run stand-in forwards everything to a real Backbone


_register_stand_in()
