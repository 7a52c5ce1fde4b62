"""OpenAI-format CLIP checkpoints: OpenAI CLIP state dicts, PAC-S, PAC++ and LongCLIP.

``ckpt:PATH`` (or a bare ``PATH.pt|.pth|.bin|.safetensors``) loads a state dict
in the OpenAI CLIP key layout (``visual.conv1.weight``, ``transformer.resblocks.*``,
``token_embedding.weight``, ``positional_embedding``, ``text_projection`` ...),
builds the matching ``open_clip.CLIP`` in float32 and wraps it in
:class:`~capscore.backbones.openclip.OpenClipBackbone` (family ``openai-ckpt``),
so patch tokens, per-token features and pad-to-longest batching all work.

How the checkpoints we target are written (read from the reference code):

* PAC-S (aimagelab/pacscore, ``compute_metrics.py``): reads ``['state_dict']`` from the loaded file
  loaded into OpenAI's ``clip`` model (ViT-B/32) or into open_clip's ViT-L-14 —
  both use this key layout. Its open_clip ViT-L-14 is a LAION model trained with
  plain GELU, so load it with ``#arch=ViT-L-14`` (see below).
* PAC++ (same repository, ``models/clip_lora`` + ``models/custom_loralib``,
  loaded by ``compute_correlations_pac++.py``): the same wrapper, plus LoRA
  factors (rank ``r = 4``) beside their weights: ``attn.in_proj_weight_lora_A/B``
  (fused q/k/v), ``attn.out_proj.lora_A/B``, ``mlp.c_fc.lora_A/B``,
  ``mlp.c_proj.lora_A/B`` in both towers, and ``visual.conv1.lora_A/B`` beside the
  4-D patch-embedding ``visual.conv1.weight``. What pacscore's *forward* uses is
  what we reproduce (see :func:`merge_lora` for the reasoning): attention and
  conv factors are added as ``W + (B @ A) · lora_alpha / r`` (conv: the product
  reshaped to the kernel), ``lora_alpha = 1``; the MLP factors are not applied.
  ``#lora_mlp=merge`` applies them too (loralib's training-time forward).
* LongCLIP (beichenzbc/Long-CLIP, ``model/longclip.py``): a plain state dict
  whose ``positional_embedding`` and ``positional_embedding_res`` both have 248
  rows; the text tower reads rows < 20 from the first and rows >= 20 from the
  second. We merge them with :func:`capscore.backbones.longclip.merge_long_positional`.
* Training wrappers we tolerate: ``{'state_dict': ...}``, ``{'model': ...}``,
  ``{'model_state_dict': ...}``, ``{'module': ...}``, and key prefixes
  ``module.`` (DistributedDataParallel), ``_orig_mod.`` (torch.compile) and
  ``model.`` when every key carries them.

Loading is safe by construction: ``torch.load(weights_only=True)`` or
safetensors only. OpenAI's original TorchScript ``.pt`` archives need
``torch.jit.load`` and are refused with a hint (use ``ViT-B-32/openai``).

Architecture choices the state dict cannot tell us:

* attention heads: taken from a registered open_clip architecture with exactly
  these shapes when one exists (e.g. ``capscore-test-tiny``), else OpenAI's
  rule ``width // 64`` (what OpenAI's, PAC-S' and LongCLIP's ``build_model`` use);
* activation: recorded in the safetensors metadata of files capscore writes
  (``capscore.quick_gelu``); else that of the registered architectures with
  these shapes when they all agree (``scenes-tiny`` is GELU); else QuickGELU
  (OpenAI CLIP and everything fine-tuned from it, PAC-S, LongCLIP).
  Override both with spec options after ``#``:
  ``ckpt:PATH#arch=ViT-L-14`` builds that open_clip architecture (its heads,
  activation and all) and loads the weights into it strictly;
  ``ckpt:PATH#quick_gelu=0`` switches the activation only (with ``arch``,
  ``quick_gelu=1`` forces QuickGELU; otherwise the architecture's own applies).

Context length comes from ``positional_embedding`` (77, or 248 for LongCLIP).
``context_length=248`` on a 77-position model applies LongCLIP's
knowledge-preserved stretch (:func:`~capscore.backbones.longclip.stretch_positional_embedding`),
not plain interpolation; a shorter context slices the table (exact for
captions that fit, CLIP's text mask is causal).

Why not open_clip's ``build_model_from_openai_state_dict``: it is the same
shape inference, but (open_clip 3; docs/backbones.md) it casts the model to
float16 *before* loading, so an fp32 checkpoint (PAC-S, capscore's own
training output) loses precision; it fixes heads to ``width // 64`` (fails on narrow towers such as
``capscore-test-tiny``: 0 heads, and silently mis-builds registered
architectures with another head width); it assumes an MLP ratio of 4; and it
knows neither LongCLIP's ``positional_embedding_res`` nor the 77 → 248
stretch. :func:`build_clip` keeps those, and loads exactly (strict, fp32).

Images are preprocessed as OpenAI CLIP does: bicubic resize of the short side
to the checkpoint's resolution, center crop, OpenAI mean/std.
"""
from __future__ import annotations

import pickle
import re
from pathlib import Path

import torch
import open_clip
import warnings
from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD
from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg
from open_clip.transform import image_transform
from open_clip.transformer import QuickGELU
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from capscore.backbones.base import pickle_refused, resolve_dtype
from capscore.backbones.longclip import (
    merge_long_positional, split_long_positional, stretch_positional_embedding, stretched_length,
)
from capscore.errors import CapscoreError, param_error, unknown_name
import capscore.backbones.openclip  # noqa: F401  (registers capscore's configs with open_clip)
from capscore.backbones.convstem import add_conv_stem, stem_from_state_dict
from capscore.backbones.openclip import OpenClipBackbone, quiet_open_clip_log
from capscore.backbones.readout import readout_of

FAMILY = "openai-ckpt"
WRAPPER_KEYS = ("state_dict", "model_state_dict", "model", "module")
STRIP_PREFIXES = ("module.", "_orig_mod.", "model.")
# Keys a CLIP state dict may carry that are not parameters of open_clip's CLIP.
EXTRA_KEYS = ("input_resolution", "context_length", "vocab_size", "attn_mask")
SPEC_OPTIONS = ("arch", "quick_gelu", "lora_mlp")
# LoRA factors pacscore's PAC++ forward never applies (see merge_lora).
PACPP_UNAPPLIED = ("mlp.c_fc.", "mlp.c_proj.")
LORA_MLP = ("ignore", "merge")


# --------------------------------------------------------------------------- reading
def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a checkpoint file into a flat ``{key: tensor}`` dict (wrappers and prefixes removed).

    Only tensors are accepted: ``torch.load(weights_only=True)`` or safetensors.
    Raises :class:`CapscoreError` naming the file when it is missing, not a
    checkpoint, or holds something other than a state dict.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise CapscoreError(f"{p}: checkpoint file not found")
    if p.is_dir():
        raise CapscoreError(f"{p}: is a folder, not a checkpoint file (for a Hugging Face folder use hf:{p})")
    obj = read_safetensors(p) if p.suffix == ".safetensors" else _torch_load(p)
    return unwrap_state_dict(obj, where=str(p))


def read_safetensors(p: Path) -> dict[str, torch.Tensor]:
    """A ``.safetensors`` file's tensors; a file that is not one is a one-line error naming it."""
    try:
        return load_file(str(p))
    except (SafetensorError, OSError, ValueError) as e:
        raise CapscoreError(f"{p}: not a readable safetensors file ({_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:120] if text else type(e).__name__


def _torch_load(p: Path):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TorchScript dispatch warning; we refuse those below
            return torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        msg = str(e)
        if "Weights only load failed" in msg or "weights_only" in msg:
            raise pickle_refused(p) from None
        raise CapscoreError(f"{p}: not a PyTorch checkpoint ({_first_line(e)})") from None
    except RuntimeError as e:
        if "TorchScript" in str(e):
            raise CapscoreError(
                f"{p}: is a TorchScript archive (OpenAI's original JIT file), which cannot be loaded safely; "
                "use the open_clip tag instead, e.g. --model ViT-B-32/openai"
            ) from None
        raise CapscoreError(f"{p}: not a PyTorch checkpoint ({_first_line(e)})") from None
    except Exception as e:  # noqa: BLE001  (a garbled file fails anywhere inside the unpickler)
        raise CapscoreError(f"{p}: not a PyTorch checkpoint ({type(e).__name__}: {_first_line(e)})") from None


def unwrap_state_dict(obj: object, *, where: str) -> dict[str, torch.Tensor]:
    """Peel training wrappers (``{'state_dict': ...}`` etc.) and whole-dict key prefixes."""
    for _ in range(3):  # e.g. {'model': {'state_dict': ...}}
        if isinstance(obj, dict) and not _looks_like_state_dict(obj):
            inner = next((obj[k] for k in WRAPPER_KEYS if isinstance(obj.get(k), dict)), None)
            if inner is None:
                break
            obj = inner
    if not isinstance(obj, dict) or not obj:
        raise CapscoreError(f"{where}: not a state dict; expected a dict of tensors, got {type(obj).__name__}")
    sd = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not sd:
        keys = ", ".join(list(map(str, obj))[:5])
        raise CapscoreError(f"{where}: holds no tensors; top-level keys: {keys}")
    changed = True
    while changed:
        changed = False
        for prefix in STRIP_PREFIXES:
            if all(k.startswith(prefix) for k in sd):
                sd = {k[len(prefix):]: v for k, v in sd.items()}
                changed = True
    return sd


def _looks_like_state_dict(d: dict) -> bool:
    return bool(d) and sum(isinstance(v, torch.Tensor) for v in d.values()) >= max(1, len(d) // 2)


# --------------------------------------------------------------------------- surgery
def merge_lora(
    state_dict: dict[str, torch.Tensor], *, lora_alpha: float = 1.0, mlp: str = "ignore"
) -> dict[str, torch.Tensor]:
    """Fold LoRA factors into their weights as pacscore's PAC++ forward applies them.

    Formula (loralib, ``scaling = lora_alpha / r``)::

        W_eff = W + (B @ A) · lora_alpha / r

    Layouts recognised:

    * ``X.lora_A`` / ``X.lora_B`` beside a 2-D ``X.weight`` (Linear; ``r = A.shape[0]``;
      loralib's Embedding stores the product transposed, which is detected by shape);
    * ``X.in_proj_weight_lora_A/B`` beside ``X.in_proj_weight`` (PAC++'s fused q/k/v);
    * ``X.lora_A`` / ``X.lora_B`` beside a 4-D ``X.weight`` (PAC++'s ``lora_layers.Conv2d``,
      e.g. ``visual.conv1``): A is (r·k, C_in·k), B is (C_out·k, r·k), k the kernel size, so
      ``r = A.shape[0] / k`` and the product is reshaped to the kernel:
      ``W + (B @ A).view(W.shape) / r`` (pacscore's ``Conv2d.forward``);
    * ``X.lora_A`` / ``X.lora_B`` beside ``X.conv.weight`` (upstream loralib's ConvLoRA).

    **The MLP factors** (``mlp.c_fc``, ``mlp.c_proj``) are dropped, not merged, by default
    (``mlp="ignore"``), because pacscore's PAC++ forward never applies them. Reading
    ``models/custom_loralib/layers.py`` and ``compute_correlations_pac++.py``:
    ``clip_lora.load(..., lora=4)`` builds the model (c_fc/c_proj are ``lora_layers.Linear``
    with ``merge_weights=True`` and ``lora_B`` initialised to zero) and returns
    ``model.eval()``; ``Linear.train(False)`` then "merges" the zero product into the
    weight and sets ``merged = True``. The script then loads the PAC++ state dict (the
    trained, non-zero factors) and calls ``eval()`` again, which does nothing because the
    layer is already marked merged; ``Linear.forward`` with ``merged = True`` is
    ``F.linear(x, W)``. So the published PAC++ numbers use the stored c_fc/c_proj weights
    alone. The other factors *are* used: the attention's in_proj and out_proj factors are
    added inside pacscore's ``multi_head_attention_forward`` on every call (out_proj is a
    Linear with ``merge_weights=False``), and ``lora_layers.Conv2d`` only merges in its own
    ``eval()`` method, which ``Module.eval()`` never calls (it calls ``train(False)``), so its
    forward adds ``(B @ A).view(W.shape) · scaling`` every time. ``mlp="merge"`` applies the
    MLP factors too (loralib's forward in training mode); use it only for checkpoints saved
    from a model whose MLP factors were meant to be used.

    A state dict without LoRA keys is returned unchanged.
    """
    if mlp not in LORA_MLP:
        raise param_error("mlp", "merge_lora", "'ignore' or 'merge'", mlp)
    if not any(k.endswith(("lora_A", "lora_B")) for k in state_dict):
        return state_dict
    sd = dict(state_dict)
    for key_a in [k for k in sd if k.endswith("lora_A")]:
        key_b = key_a[:-1] + "B"
        if key_b not in sd:
            raise CapscoreError(f"LoRA factor {key_a} has no matching {key_b}")
        a, b = sd.pop(key_a).float(), sd.pop(key_b).float()
        stem = key_a[: -len("lora_A")]  # "X." or "X.in_proj_weight_"
        if stem.endswith("_"):
            target = stem[:-1]  # X.in_proj_weight
        elif stem + "conv.weight" in sd:
            target = stem + "conv.weight"
        else:
            target = stem + "weight"
        if target not in sd:
            raise CapscoreError(f"LoRA factor {key_a} has no base weight {target}")
        if mlp == "ignore" and stem.endswith(PACPP_UNAPPLIED):
            continue  # pacscore's forward never applies these (see above): the stored W stands
        w = sd[target]
        delta = b @ a
        if w.ndim == 4:  # convolution kernel (C_out, C_in, k, k): A (r·k, C_in·k), B (C_out·k, r·k)
            k = w.shape[-1]
            if a.shape[0] % k or delta.numel() != w.numel():
                raise CapscoreError(f"LoRA factors {key_a} {tuple(a.shape)} / {key_b} {tuple(b.shape)} "
                                    f"do not fit the {tuple(w.shape)} kernel {target}")
            r = a.shape[0] // k
            delta = delta.view(w.shape)
        else:
            r = a.shape[0]
            if delta.shape != w.shape and delta.T.shape == w.shape:
                delta = delta.T  # loralib's Embedding stores A (r, num) and B (dim, r)
        if delta.shape != w.shape:
            raise CapscoreError(f"LoRA factors {key_a} give shape {tuple(delta.shape)}, weight {target} is {tuple(w.shape)}")
        merged = (w.float() + delta * (lora_alpha / r)).to(w.dtype)
        if target.endswith("conv.weight"):
            del sd[target]
            target = target[: -len("conv.weight")] + "weight"
        sd[target] = merged
    return sd


def _check_openai_layout(sd: dict, where: str) -> None:
    required = ("positional_embedding", "token_embedding.weight", "ln_final.weight", "text_projection")
    missing = [k for k in required if k not in sd]
    if not missing and any(k.startswith("visual.") for k in sd):
        return
    if any(k.startswith(("text_model.", "vision_model.")) for k in sd):
        hint = "; it looks like Hugging Face CLIPModel weights: load their folder with hf:DIR"
    else:
        hint = "; first keys: " + ", ".join(list(sd)[:4])
    raise CapscoreError(f"{where}: not an OpenAI-format CLIP state dict (missing {missing[0] if missing else 'visual.*'}){hint}")


def infer_config(sd: dict[str, torch.Tensor]) -> dict:
    """Architecture from tensor shapes, following OpenAI's ``build_model`` (heads left to the caller)."""
    stem = stem_from_state_dict(sd)
    if "visual.proj" in sd:
        layers = len({k.split(".")[3] for k in sd if k.startswith("visual.transformer.resblocks.")})
        if stem is None:
            width, patch = sd["visual.conv1.weight"].shape[0], sd["visual.conv1.weight"].shape[-1]
        else:  # capscore's convolutional stem (capscore.backbones.convstem): 2 ** n stride-2 convs
            width, patch = sd["visual.class_embedding"].shape[0], 2 ** len(stem)
        grid = round((sd["visual.positional_embedding"].shape[0] - 1) ** 0.5)
        mlp = sd["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0] / width
        vision = dict(layers=layers, width=width, patch_size=patch, image_size=patch * grid, mlp_ratio=mlp)
    else:
        counts = [len({k.split(".")[2] for k in sd if k.startswith(f"visual.layer{b}.")}) for b in (1, 2, 3, 4)]
        if not all(counts):
            raise CapscoreError("state dict has neither a ViT (visual.proj) nor a ModifiedResNet (visual.layer1..4) image tower")
        out = round((sd["visual.attnpool.positional_embedding"].shape[0] - 1) ** 0.5)
        vision = dict(layers=tuple(counts), width=sd["visual.layer1.0.conv1.weight"].shape[0], image_size=out * 32)
    text_width = sd["ln_final.weight"].shape[0]
    text = dict(
        context_length=sd["positional_embedding"].shape[0],
        vocab_size=sd["token_embedding.weight"].shape[0],
        width=text_width,
        layers=len({k.split(".")[2] for k in sd if k.startswith("transformer.resblocks.")}),
        mlp_ratio=sd["transformer.resblocks.0.mlp.c_fc.weight"].shape[0] / text_width,
    )
    return dict(embed_dim=sd["text_projection"].shape[1], vision_cfg=vision, text_cfg=text, conv_stem=stem)


def _registered_match(cfg: dict) -> tuple[tuple[int, int] | None, bool | None]:
    """(heads, quick_gelu) of registered open_clip architectures with exactly these shapes.

    Heads are returned when every matching architecture agrees on them; the
    activation likewise (e.g. ``scenes-tiny`` is GELU, ``capscore-test-tiny``
    QuickGELU, while ``ViT-B-32`` and ``ViT-B-32-quickgelu`` disagree, so the
    caller falls back to OpenAI's QuickGELU). ``None`` where nothing decides.
    """
    heads, acts = set(), set()
    for name in open_clip.list_models():
        c = open_clip.get_model_config(name) or {}
        v, t = c.get("vision_cfg", {}), c.get("text_cfg", {})
        if "timm_model_name" in v or "hf_model_name" in t or c.get("embed_dim") != cfg["embed_dim"]:
            continue
        mine_v, mine_t = cfg["vision_cfg"], cfg["text_cfg"]
        same_v = all(v.get(k, d) == mine_v.get(k) for k, d in
                     [("layers", 12), ("width", 768), ("patch_size", 16), ("image_size", 224)] if k in mine_v)
        same_t = all(t.get(k, d) == mine_t[k] for k, d in [("width", 512), ("layers", 12), ("vocab_size", 49408)])
        if same_v and same_t:
            heads.add((mine_v["width"] // v.get("head_width", 64), t.get("heads", 8)))
            acts.add(bool(c.get("quick_gelu", False)))
    return (heads.pop() if len(heads) == 1 else None), (acts.pop() if len(acts) == 1 else None)


def build_clip(
    sd: dict[str, torch.Tensor],
    *,
    where: str,
    arch: str | None = None,
    quick_gelu: bool | None = None,
    context_length: int | None = None,
) -> torch.nn.Module:
    """An ``open_clip.CLIP`` in float32 holding exactly the weights of ``sd`` (strict load).

    ``context_length`` must be the checkpoint's own, LongCLIP's stretch of it
    (77 -> 248), or anything shorter (the table is sliced).
    """
    sd = merge_long_positional(sd)
    sd = {k: v.float() if v.is_floating_point() else v for k, v in sd.items() if k not in EXTRA_KEYS}
    n = sd["positional_embedding"].shape[0]
    ctx = n if context_length is None else int(context_length)
    if ctx != n:
        if ctx == stretched_length(n):
            sd["positional_embedding"] = stretch_positional_embedding(sd["positional_embedding"])
        elif 2 <= ctx < n:
            sd["positional_embedding"] = sd["positional_embedding"][:ctx].clone()
        else:
            raise CapscoreError(
                f"{where}: cannot give a {n}-position text tower a context of {ctx}; "
                f"use {n}, less, or {stretched_length(n)} (LongCLIP's knowledge-preserved stretch)"
            )
    cfg = infer_config(sd)
    stem = cfg.pop("conv_stem")

    # construction draws random init we overwrite: keep callers' RNG intact, and open_clip quiet about it
    with torch.random.fork_rng(devices=[]), quiet_open_clip_log():
        if arch is not None:
            if arch not in open_clip.list_models():
                raise unknown_name("open_clip architecture", arch, open_clip.list_models())
            model = open_clip.create_model(arch, pretrained=None, force_context_length=ctx,
                                           **({} if quick_gelu is None else {"force_quick_gelu": quick_gelu}))
        else:
            heads, registered_act = _registered_match(cfg)
            if quick_gelu is None:
                quick_gelu = registered_act
            v, t = cfg["vision_cfg"], cfg["text_cfg"]
            if heads is None:
                heads = (max(1, v["width"] // 64), max(1, t["width"] // 64))  # OpenAI's rule
            if isinstance(v["layers"], int):
                v["head_width"] = v["width"] // heads[0]
            t["heads"] = heads[1]
            model = CLIP(cfg["embed_dim"], vision_cfg=CLIPVisionCfg(**v), text_cfg=CLIPTextCfg(**t),
                         quick_gelu=True if quick_gelu is None else quick_gelu)
        if stem is not None:  # add_conv_stem refuses a tower without a patchify conv1, in one line

            add_conv_stem(model, stem, where=where)
    model = model.float()
    try:
        missing, unexpected = model.load_state_dict(sd, strict=False)
    except RuntimeError as e:
        shapes = re.findall(r"size mismatch for ([\w.]+)", str(e))
        raise CapscoreError(f"{where}: weights do not fit the architecture (size mismatch for {', '.join(shapes[:3])})") from None
    missing = [k for k in missing if k != "logit_bias"]
    if missing or unexpected:
        what = f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}"
        raise CapscoreError(f"{where}: weights do not fit the architecture ({what})")
    return model.eval()


def openai_preprocess(image_size: int, *, mean_std: tuple | None = None):
    """OpenAI CLIP's eval transform: bicubic resize (short side), center crop, RGB, OpenAI mean/std
    (or ``mean_std = (mean, std)``)."""
    mean, std = mean_std or (OPENAI_DATASET_MEAN, OPENAI_DATASET_STD)
    return image_transform(image_size, is_train=False, mean=mean, std=std,
                           resize_mode="shortest", interpolation="bicubic")


def parse_spec_options(rest: str) -> tuple[str, dict[str, str]]:
    """``PATH#key=value,key=value`` -> (PATH, options). Keys: ``arch``, ``quick_gelu``, ``lora_mlp``."""
    path, sep, tail = rest.rpartition("#") if "#" in rest else (rest, "", "")
    opts: dict[str, str] = {}
    if sep:
        for item in filter(None, tail.split(",")):
            key, eq, value = item.partition("=")
            if not eq:
                raise CapscoreError(f"ckpt option {item!r} must look like key=value (after '#' in {rest!r})")
            if key not in SPEC_OPTIONS:
                raise unknown_name("ckpt option", key, SPEC_OPTIONS)
            opts[key] = value
    return path, opts


def _bool(value: str, name: str) -> bool:
    if value.lower() in ("1", "true", "yes"):
        return True
    if value.lower() in ("0", "false", "no"):
        return False
    raise CapscoreError(f"ckpt option {name} must be 0 or 1; got {value!r}")


# --------------------------------------------------------------------------- the adapter
def load_openai_checkpoint(
    rest: str,
    *,
    spec: str,
    device: str = "cpu",
    dtype: str = "fp32",
    seed: int = 0,
    context_length: int | None = None,
    arch: str | None = None,
    quick_gelu: bool | None = None,
    lora_alpha: float = 1.0,
    lora_mlp: str = "ignore",
):
    """``ckpt:PATH[#arch=NAME,quick_gelu=0|1,lora_mlp=ignore|merge]`` -> :class:`OpenClipBackbone` (family ``openai-ckpt``).

    ``seed`` is unused (all weights come from the file); it is accepted for the
    registry's uniform call. See the module docstring for every choice made.
    """
    path, opts = parse_spec_options(rest)
    arch = opts.get("arch", arch)
    if "quick_gelu" in opts:
        quick_gelu = _bool(opts["quick_gelu"], "quick_gelu")
    lora_mlp = opts.get("lora_mlp", lora_mlp)
    if lora_mlp not in LORA_MLP:
        raise CapscoreError(f"ckpt option lora_mlp must be one of {', '.join(LORA_MLP)}; got {lora_mlp!r}")
    where = str(Path(path).expanduser())
    sd = read_state_dict(path)
    saved = _saved_metadata(Path(where))  # what capscore recorded on saving ({} for other files)
    if quick_gelu is None and arch is None and "capscore.quick_gelu" in saved:
        quick_gelu = saved["capscore.quick_gelu"] == "1"
    sd = merge_lora(sd, lora_alpha=lora_alpha, mlp=lora_mlp)
    # the global read-out: the architecture's when #arch= names one, else what capscore recorded on saving
    # (a file trained with scenes-tiny-v4's read-out, capscore.backbones.readout: "capscore.readout" in a
    # `capscore train` export, the architecture "arch" in a bundled-format file such as a scenes-tiny run's
    # scenes-tiny.safetensors), else CLIP's class token
    readout = readout_of(arch) if arch else (saved.get("capscore.readout") or readout_of(saved.get("arch")))
    bb = backbone_from_state_dict(sd, spec=spec, where=where, arch=arch, quick_gelu=quick_gelu,
                                  context_length=context_length, readout=readout)
    return bb.to(device, resolve_dtype(dtype))


def backbone_from_state_dict(sd: dict[str, torch.Tensor], *, spec: str, where: str, arch: str | None = None,
                             quick_gelu: bool | None = None, context_length: int | None = None,
                             readout: str = "class", mean_std: tuple | None = None):
    """An OpenAI-layout state dict already in memory -> :class:`OpenClipBackbone` (family ``openai-ckpt``).

    Used by ``ckpt:`` files and by metrics whose released checkpoint carries a CLIP tower (Polos' ``clip.*``,
    DENEB's ``pacs_clip.*``). ``mean_std``: the normalisation of the image transform (default OpenAI's;
    DENEB's open_clip ViT-L-14 ``laion2b_s32b_b82k`` transform uses (0.5, 0.5, 0.5) for both).
    """
    _check_openai_layout(sd, where)
    model = build_clip(sd, where=where, arch=arch, quick_gelu=quick_gelu, context_length=context_length)
    ctx = int(model.positional_embedding.shape[0])
    image_size = model.visual.image_size
    image_size = image_size[0] if isinstance(image_size, (tuple, list)) else int(image_size)
    tokenizer = open_clip.tokenizer.SimpleTokenizer(context_length=ctx)
    return OpenClipBackbone(model, openai_preprocess(image_size, mean_std=mean_std), tokenizer, spec=spec,
                            family=FAMILY, readout=readout)


# --------------------------------------------------------------------------- writing
def _uses_quick_gelu(model: torch.nn.Module) -> bool | None:
    kinds = {isinstance(m, QuickGELU) for m in model.modules() if isinstance(m, (QuickGELU, torch.nn.GELU))}
    return kinds.pop() if len(kinds) == 1 else None


def _saved_metadata(path: Path) -> dict[str, str]:
    """A safetensors file's metadata, where capscore records what it saved ({}: none, or not safetensors)."""
    if path.suffix != ".safetensors":
        return {}

    try:
        with safe_open(str(path), framework="pt") as f:
            return f.metadata() or {}
    except Exception:  # unreadable files are reported by read_state_dict
        return {}


def save_openai_checkpoint(backbone, path: str | Path, *, layout: str = "plain") -> Path:
    """Write a backbone's open_clip CLIP as an OpenAI-format state dict (float32).

    ``layout``: ``"plain"`` (the bare state dict, as LongCLIP and OpenAI CLIP
    fine-tunes save it), ``"pacs"`` (``{'state_dict': ...}``, as PAC-S loads it)
    or ``"longclip"`` (also splits the positional table into
    ``positional_embedding`` / ``positional_embedding_res``). ``.safetensors``
    paths are written with safetensors (``pacs`` layout is not possible there).
    Reloads with ``ckpt:PATH`` to the same vectors: a global read-out other than CLIP's
    (``scenes-tiny-v4``'s, :mod:`capscore.backbones.readout`) is recorded in the safetensors metadata
    (``capscore.readout``), and refused for a .pt/.pth file, which has nowhere to record it.
    """
    if layout not in ("plain", "pacs", "longclip"):
        raise param_error("layout", "save_openai_checkpoint", "one of 'plain', 'pacs', 'longclip'", layout)
    model = backbone.model
    readout = getattr(backbone, "readout", "class")
    if not hasattr(model, "positional_embedding") or not hasattr(model, "visual"):
        raise CapscoreError(f"{backbone.spec}: only open_clip CLIP models (standard text tower) can be saved in OpenAI format")
    sd = {k: v.detach().float().cpu().contiguous() if v.is_floating_point() else v.detach().cpu().contiguous()
          for k, v in model.state_dict().items() if k != "logit_bias"}
    if layout == "longclip":
        sd = split_long_positional(sd)
    p = Path(path).expanduser()
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.suffix == ".safetensors":
        if layout == "pacs":
            raise CapscoreError(f"{p}: the 'pacs' layout wraps the dict and needs a .pt/.pth file")

        # Record the activation: the state dict cannot tell GELU from QuickGELU (see build_clip); and a
        # global read-out other than CLIP's, which the state dict cannot tell either (backbones/readout.py).
        act = _uses_quick_gelu(model)
        meta = {} if act is None else {"capscore.quick_gelu": str(int(act))}
        if readout != "class":
            meta["capscore.readout"] = readout
        save_file(sd, str(p), metadata=meta or None)
    else:
        if readout != "class":
            raise CapscoreError(f"{p}: {backbone.spec} has a {readout} global read-out, which only a .safetensors "
                                "file records; save to .safetensors (or reload with ckpt:PATH#arch=NAME)")
        torch.save({"state_dict": sd} if layout == "pacs" else sd, p)
    return p
