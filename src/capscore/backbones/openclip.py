"""Adapter for open_clip models: pretrained tags, random init, custom configs.

Everything that is an ``open_clip.CLIP`` (OpenAI-format checkpoints, PAC-S and
LongCLIP weights, capscore's own scenes-tiny) ends up in :class:`OpenClipBackbone`.

Text is run through the tower with the positional embedding and causal mask
sliced to the batch length, so a batch padded to its longest caption gives the
same vectors as one padded to the full context (CLIP's causal mask means no
real token ever attends to a pad; pooling reads the end-of-text position).

``$CAPSCORE_MODEL_CONFIGS`` (folders or files of open_clip JSON configs, separated like ``PATH``) adds
architectures by name; the tests register their random-init ``capscore-test-tiny`` this way.
"""
from __future__ import annotations

import contextlib
import logging
import os
import pickle
from collections.abc import Sequence
from pathlib import Path

import open_clip
import torch
from PIL import Image

from capscore._log import warn
from capscore.errors import CapscoreError
from capscore.backbones.base import Backbone, pickle_refused, resolve_dtype, weights_files
from capscore.backbones.convstem import CONV_STEMS, add_conv_stem
from capscore.backbones.readout import READOUTS, readout_of, second_order_pool, word_mask
from capscore.backbones.longclip import resize_text_positions

CONFIG_DIR = Path(__file__).parent / "configs"
open_clip.add_model_config(CONFIG_DIR)  # capscore's own architectures (scenes-tiny-v1 ... v4)
# more open_clip JSON configs, one folder or file per os.pathsep-separated entry (the tests' capscore-test-tiny)
for _extra in filter(None, os.environ.get("CAPSCORE_MODEL_CONFIGS", "").split(os.pathsep)):
    open_clip.add_model_config(Path(_extra).expanduser())


class OpenClipBackbone(Backbone):
    family = "open_clip"

    def __init__(self, model: torch.nn.Module, preprocess, tokenizer, *, spec: str, family: str | None = None,
                 readout: str = "class"):
        self.model = model.eval()
        self._preprocess = preprocess
        self.tokenizer = tokenizer
        self.spec = spec
        if family:
            self.family = family
        text = getattr(model, "text", model)  # CustomTextCLIP keeps the tower in .text
        self._text = text
        self.context_length = int(text.positional_embedding.shape[0]) if hasattr(text, "positional_embedding") else int(
            getattr(tokenizer, "context_length", 77)
        )
        inner = getattr(tokenizer, "tokenizer", tokenizer)
        self.eot_id = int(getattr(inner, "eot_token_id", 49407))
        self.sot_id = getattr(inner, "sot_token_id", None)
        self.pad_id = 0
        # Fast exact path: classic causal CLIP text tower pooled at the end-of-text token.
        pool = getattr(text, "text_pool_type", getattr(text, "pool_type", "argmax"))
        self._fast_text = (
            isinstance(tokenizer, open_clip.tokenizer.SimpleTokenizer)
            and hasattr(text, "token_embedding")
            and getattr(text, "attn_mask", None) is not None
            and pool in ("argmax", "eos")
            and getattr(text, "cls_emb", None) is None
        )
        self.pad_to_longest_exact = self._fast_text
        self.has_token_features = self._fast_text
        # Packing (forward_packed_texts) hands open_clip's own blocks a per-row mask: their
        # nn.MultiheadAttention takes one of shape (B * heads, L, L).
        blocks = getattr(getattr(text, "transformer", None), "resblocks", None)
        self.supports_packed_text = bool(
            self._fast_text and blocks and isinstance(text.transformer, open_clip.transformer.Transformer)
            and all(type(b) is open_clip.transformer.ResidualAttentionBlock
                    and isinstance(b.attn, torch.nn.MultiheadAttention) for b in blocks)
        )
        visual = model.visual
        self.has_patch_tokens = hasattr(visual, "output_tokens") and getattr(visual, "proj", None) is not None and getattr(
            visual, "pool_type", "tok"
        ) == "tok" and getattr(visual, "attn_pool", None) is None
        with torch.no_grad():
            self.embed_dim = int(self._project_text(torch.zeros(1, self._text_width())).shape[-1])
        self.set_readout(readout)  # sets self.readout, embed_dim and token_dim
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        # open_clip's eval transform is Resize, CenterCrop, convert-to-RGB, ...: given the file's own mode it
        # reproduces the reference scripts' order (capscore.backbones.base: rgb_order).
        steps = [type(t).__name__ if type(t).__name__ != "function" else t.__name__
                 for t in getattr(preprocess, "transforms", [])]
        converts = [i for i, n in enumerate(steps) if n == "MaybeConvertMode" or "convert" in n.lower()]
        self.supports_rgb_after_crop = "Resize" in steps and bool(converts) and steps.index("Resize") < converts[0]

    def set_readout(self, readout: str) -> None:
        """The global read-out (:mod:`capscore.backbones.readout`): CLIP's ``"class"`` token, or
        ``"second-order"`` pooled tokens (``embed_dim`` becomes the token width squared)."""
        if readout not in READOUTS:
            raise CapscoreError(f"{self.spec}: unknown global read-out {readout!r}; expected one of {', '.join(READOUTS)}")
        if readout != "class" and not (self.has_patch_tokens and self._fast_text):
            raise CapscoreError(f"{self.spec}: a {readout} read-out pools patch and word tokens; this model does "
                                "not expose both in the joint space")
        width = self.token_dim  # of the patch and word tokens, whatever the read-out
        self._token_dim = None if readout == "class" else width
        self.embed_dim = width ** 2 if readout == "second-order" else width
        self.readout = readout
        self.invalidate_identity()

    def set_context_length(self, context_length: int) -> None:
        """77 -> 248 by LongCLIP's knowledge-preserved stretch, or a shorter slice (see
        :func:`capscore.backbones.longclip.resize_text_positions`)."""
        if not self._fast_text:
            raise CapscoreError(f"{self.spec}: changing the context length needs a causal CLIP text tower")
        resize_text_positions(self._text, context_length)
        self.context_length = int(self._text.positional_embedding.shape[0])
        self.invalidate_identity()

    # ------------------------------------------------------------------------------
    def _text_width(self) -> int:
        ln = getattr(self._text, "ln_final", None)
        return int(ln.normalized_shape[0]) if ln is not None else int(self._text.token_embedding.weight.shape[1])

    def _project_text(self, x: torch.Tensor) -> torch.Tensor:
        proj = getattr(self._text, "text_projection", None)
        if proj is None:
            return x
        if isinstance(proj, torch.nn.Linear):
            return proj(x.to(proj.weight.dtype))
        return x.to(proj.dtype) @ proj

    @property
    def preprocess_id(self) -> str:
        return repr(self._preprocess)

    @property
    def identity(self) -> str:
        base = super().identity
        return base if self.readout == "class" else f"{base}|readout={self.readout}"

    def preprocess(self, image: Image.Image) -> torch.Tensor:
        return self._preprocess(image)

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        tok = self.tokenizer
        if isinstance(tok, open_clip.tokenizer.SimpleTokenizer):
            return [[tok.sot_token_id, *tok.encode(t), tok.eot_token_id] for t in texts]
        # Other open_clip tokenizers (HF-backed) only give padded tensors: strip the padding.
        out = []
        for row in tok(list(texts)).tolist():
            while row and row[-1] == self.pad_id:
                row.pop()
            out.append(row)
        return out

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        tok = self.tokenizer
        if isinstance(tok, open_clip.tokenizer.SimpleTokenizer):
            return [tok.decoder.get(i, "?").replace("</w>", "") for i in ids]
        return super().token_strings(ids)

    # ------------------------------------------------------------------------------
    def forward_images(self, pixels, *, patches=False):
        visual = self.model.visual
        pixels = pixels.to(self.device, self.dtype)
        if not patches and self.readout == "class":
            return self.model.encode_image(pixels), None
        if not self.has_patch_tokens:
            raise NotImplementedError
        old = visual.output_tokens
        visual.output_tokens = True
        try:
            pooled, tokens = visual(pixels)  # tokens: after ln_post, before proj; (B, N, width)
        finally:
            visual.output_tokens = old
        tokens = tokens @ visual.proj  # (B, N, D)
        if self.readout == "second-order":  # every patch token (the class token is not among them)
            pooled = second_order_pool(tokens, torch.ones(tokens.shape[:2], device=tokens.device))
        return pooled, (tokens if patches else None)

    def forward_texts(self, ids, lengths, *, tokens=False):
        ids = ids.to(self.device)
        if not self._fast_text:
            if tokens:
                raise NotImplementedError
            full = torch.full((ids.shape[0], self.context_length), self.pad_id, dtype=ids.dtype, device=ids.device)
            full[:, : ids.shape[1]] = ids
            return self.model.encode_text(full), None
        t = self._text
        L = ids.shape[1]
        cast = t.transformer.get_cast_dtype() if hasattr(t.transformer, "get_cast_dtype") else self.dtype
        x = t.token_embedding(ids).to(cast)  # (B, L, W)
        x = x + t.positional_embedding[:L].to(cast)
        x = t.transformer(x, attn_mask=t.attn_mask[:L, :L])
        x = t.ln_final(x)
        lengths = lengths.to(ids.device)
        if self.readout == "second-order":  # the word tokens: start and end of text dropped
            toks = self._project_text(x)
            return second_order_pool(toks, word_mask(lengths, L)), (toks if tokens else None)
        eot = (lengths - 1).clamp(min=0)
        pooled = self._project_text(x[torch.arange(x.shape[0], device=x.device), eot])
        return pooled, (self._project_text(x) if tokens else None)


    def forward_packed_texts(self, ids, positions, allowed):
        t = self._text
        ids, positions = ids.to(self.device), positions.to(self.device)
        cast = t.transformer.get_cast_dtype() if hasattr(t.transformer, "get_cast_dtype") else self.dtype
        x = t.token_embedding(ids).to(cast)  # the same steps as forward_texts, positions per text
        x = x + t.positional_embedding[positions].to(cast)
        heads = t.transformer.resblocks[0].attn.num_heads
        mask = torch.zeros(allowed.shape, dtype=cast, device=self.device)
        mask.masked_fill_(~allowed.to(self.device), float("-inf"))
        x = t.transformer(x, attn_mask=mask.repeat_interleave(heads, dim=0))
        return self._project_text(t.ln_final(x))

@contextlib.contextmanager
def quiet_open_clip_log():
    """Hide open_clip's root-logger warnings while building a model ("No pretrained weights loaded for
    model ... Model initialized randomly."): capscore builds towers with ``pretrained=None`` and then loads
    the weights itself (``ckpt:``, the bundled model), or warns about random weights in its own words."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def _seeded_create(arch: str, *, pretrained: str | None, seed: int, **kwargs):
    stem = CONV_STEMS.get(arch)
    if stem is not None and pretrained is not None and not Path(pretrained).expanduser().is_file():
        raise CapscoreError(f"{arch}/{pretrained}: {arch} has a convolutional stem and no pretrained tags; "
                            f"give a weights file ({arch}/PATH or ckpt:PATH)")
    with torch.random.fork_rng(devices=[]), quiet_open_clip_log():
        torch.manual_seed(seed)
        # capscore's conv-stem ViTs: open_clip builds the patchify tower, the stem replaces its conv1, then
        # the file is loaded (open_clip would load it into the patchify tower and fail)
        model, _, preprocess = open_clip.create_model_and_transforms(
            arch, pretrained=None if stem is not None else pretrained, **kwargs)
        if stem is not None:
            add_conv_stem(model, stem, where=arch)
            if pretrained is not None:
                open_clip.load_checkpoint(model, str(Path(pretrained).expanduser()), weights_only=True)
    return model, preprocess


def load_open_clip(
    arch: str,
    tag: str | None,
    *,
    spec: str,
    device: str = "cpu",
    dtype: str = "fp32",
    seed: int = 0,
    context_length: int | None = None,
) -> OpenClipBackbone:
    """``ARCH/TAG`` -> pretrained weights (tag or local file); ``ARCH`` alone -> random weights from ``seed``."""
    if tag == "schema":  # hf-hub:/local-dir: carry their own weights
        tag = None
        has_weights = True
    else:
        has_weights = tag is not None
    if not has_weights:
        warn(f"{arch}: no pretrained tag given; using RANDOM weights (seed={seed}) — for tests and benchmarks only")
    try:  # open_clip's own 'No pretrained weights...' is hidden (_seeded_create): we warned already
        model, preprocess = _seeded_create(arch, pretrained=tag, seed=seed)
    except pickle.UnpicklingError:  # torch.load(weights_only=True) refused Python objects in the file

        raise pickle_refused(tag or weights_files(arch.split(":", 1)[1]) if arch.startswith("local-dir:")
                             else tag or arch) from None
    except RuntimeError as e:
        if "state_dict" not in str(e) and "size mismatch" not in str(e):
            raise
        raise CapscoreError(f"{tag or arch}: the weights do not fit the {arch} architecture "
                            f"({' '.join(str(e).split())[:160]})") from None
    tokenizer = open_clip.get_tokenizer(arch)
    bb = OpenClipBackbone(model, preprocess, tokenizer, spec=spec if has_weights else f"{spec}#seed={seed}",
                          readout=readout_of(arch))
    if context_length is not None:
        bb.set_context_length(context_length)
    return bb.to(device, resolve_dtype(dtype))
