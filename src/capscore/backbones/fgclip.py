"""FG-CLIP (Xie et al., 2025, "FG-CLIP: Fine-Grained Visual and Textual Alignment") without remote code.

``fgclip:DIR`` loads a folder in the layout of the public FG-CLIP checkpoints
(``qihoo360/fg-clip-base`` / ``-large``: ``config.json`` + ``model.safetensors`` or
``pytorch_model.bin`` + CLIP tokenizer and image-processor files). Those checkpoints
ship their own modelling code (``FGCLIPModel``, which upstream loads as remote
code); capscore never runs it. Reading that code
(360CVGroup/FG-CLIP, ``fgclip/model/clip_strc/fgclip.py`` and its ``modeling_clip.py``),
the model is transformers' ``CLIPModel`` plus four extra tensors, so it maps onto
``transformers.CLIPModel`` exactly:

=====================================================  ==========================================
checkpoint key                                         what it is / where capscore puts it
=====================================================  ==========================================
``text_model.*``, ``vision_model.*``,                  standard CLIP (pre-LN blocks, QuickGELU per
``visual_projection.weight``, ``text_projection``      the config); loaded as is
``text_model.embeddings.position_embedding.weight``    short table (77 rows): ``walk_short_pos=True``
``...embeddings.position_embedding_ori.weight`` (248)  long table: rows < 20 from ``_ori``
``...embeddings.position_embedding_res.weight`` (248)  (``mask1``) and rows >= 20 from ``_res``
                                                       (``mask2``), added to the token embedding
``text_filip_projection.weight``                       text projection of the long path
``logit_scale_finegraind``, ``logit_scale_hardneg``    training-only temperatures; not used
=====================================================  ==========================================

Two text paths, chosen by the context length (as FG-CLIP's own evaluation does:
``walk_short_pos = max_length <= 100``):

* **short** (default, ``context_length`` <= the short table, 77): the short position
  table and ``text_projection`` — FG-CLIP's README path for short captions, and the
  natural one for ABE-CLIP's benchmarks (ARO-A, SugarCrepe and ABC-6K captions are short);
* **long** (``--context-length 248``): position table ``ori[:20] ++ res[20:]`` and
  ``text_filip_projection``, placed in a 248-position ``CLIPModel``.

Text pooling is FG-CLIP's: ``FGCLIPModel.__init__`` sets ``eos_token_id = 49407``, so the
pooled state is the first end-of-text position (pads are end-of-text tokens too).

**Patch tokens** are FG-CLIP's dense features (``get_image_dense_features``): the input
of the last vision block (``hidden_states[-2]``) goes through that block with its
attention replaced by the value path (``out_proj(v_proj(LN1(x)))``, no query–key
softmax) plus the residual and the MLP, then the class token is dropped and the rest
goes through ``post_layernorm`` and ``visual_projection``. The global image vector is
the usual class token (``get_image_features``). Per-token text features are the
final-layer-norm states through the path's projection (what ABE-CLIP aligns).

Images use the folder's image processor (CLIP's: bicubic short-side resize, centre
crop). FG-CLIP's README example additionally squashes images to 224×224 before the
processor; capscore does not (that is an example script, not the model).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from capscore._optional import require
from capscore.backbones.base import resolve_dtype
from capscore.backbones.hf import HFBackbone, quiet_transformers
from capscore.errors import CapscoreError
from capscore.backbones.openai_ckpt import read_state_dict

FAMILY = "fgclip"
KEEP_LEN = 20  # FG-CLIP's mask1/mask2 split (hard-coded in its CLIPTextEmbeddings)
EOT_ID = 49407  # FGCLIPModel.__init__: text_config.eos_token_id = 49407
RES, ORI = "text_model.embeddings.position_embedding_res.weight", "text_model.embeddings.position_embedding_ori.weight"
FILIP = "text_filip_projection.weight"
TRAINING_ONLY = ("logit_scale_finegraind", "logit_scale_hardneg")


class FGClipBackbone(HFBackbone):
    """transformers ``CLIPModel`` holding FG-CLIP weights, with FG-CLIP's dense patch tokens."""

    family = FAMILY

    def __init__(self, model, tokenizer, image_processor, *, spec: str, long: bool):
        super().__init__(model, tokenizer, image_processor, spec=spec)
        self.long = long
        self.pad_to_longest_exact = True  # causal text tower pooled at the first end-of-text token
        self.has_patch_tokens = True
        self.has_token_features = True

    def forward_images(self, pixels, *, patches=False):
        if not patches:
            return super().forward_images(pixels)
        pixels = pixels.to(self.device, self.dtype)
        vm = self.model.vision_model
        out = vm(pixel_values=pixels, output_hidden_states=True)
        pooled = self.model.visual_projection(out.pooler_output)
        x = out.hidden_states[-2]  # (B, 1 + N, W): input of the last block
        last = vm.encoder.layers[-1]
        x = x + last.self_attn.out_proj(last.self_attn.v_proj(last.layer_norm1(x)))  # value path, no softmax
        x = x + last.mlp(last.layer_norm2(x))
        tokens = self.model.visual_projection(vm.post_layernorm(x[:, 1:]))  # (B, N, D)
        return pooled, tokens


def read_fgclip_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The folder's state dict: ``model.safetensors`` (or its sharded index) or ``pytorch_model.bin``."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        sd: dict[str, torch.Tensor] = {}
        for shard in shards:
            sd.update(read_state_dict(folder / shard))
        return sd
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return read_state_dict(folder / name)
    raise CapscoreError(f"{folder}: no model.safetensors or pytorch_model.bin")


def fgclip_state_dict(sd: dict[str, torch.Tensor], *, long: bool, where: str) -> dict[str, torch.Tensor]:
    """FG-CLIP keys -> ``CLIPModel`` keys for the short or the long text path (see the module docstring)."""
    missing = [k for k in (RES, ORI, FILIP) if k not in sd]
    if missing:
        raise CapscoreError(f"{where}: not an FG-CLIP checkpoint (no {missing[0]}); "
                            "for a plain Hugging Face CLIP folder use hf:DIR")
    out = {k: v for k, v in sd.items() if k not in (RES, ORI, FILIP, *TRAINING_ONLY)}
    if long:
        ori, res = sd[ORI], sd[RES]
        out["text_model.embeddings.position_embedding.weight"] = torch.cat([ori[:KEEP_LEN], res[KEEP_LEN:]])
        out["text_projection.weight"] = sd[FILIP]
    return out


def load_fgclip(
    rest: str,
    *,
    spec: str,
    device: str = "cpu",
    dtype: str = "fp32",
    seed: int = 0,
    context_length: int | None = None,
) -> FGClipBackbone:
    """``fgclip:DIR`` -> :class:`FGClipBackbone`; ``context_length`` > the short table selects the long path.

    ``seed`` is unused (all weights come from the folder). No code from the folder is run.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    transformers = require("transformers", purpose="--model fgclip:DIR")

    folder = Path(rest).expanduser()
    if not folder.is_dir() or not (folder / "config.json").is_file():
        raise CapscoreError(f"{folder}: not an FG-CLIP model folder (needs config.json and weights)")
    where = str(folder)
    sd = read_fgclip_weights(folder)
    try:
        with quiet_transformers():
            config = transformers.CLIPConfig.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as e:
        raise CapscoreError(f"{where}: cannot read config.json as a CLIP config ({str(e).splitlines()[0][:120]})") from None
    n_short = int(sd["text_model.embeddings.position_embedding.weight"].shape[0]) if \
        "text_model.embeddings.position_embedding.weight" in sd else int(config.text_config.max_position_embeddings)
    n_long = int(sd[ORI].shape[0]) if ORI in sd else n_short
    ctx = n_short if context_length is None else int(context_length)
    if not 2 <= ctx <= n_long:
        raise CapscoreError(f"{where}: FG-CLIP's text tower has {n_short} (short) and {n_long} (long) positions; "
                            f"cannot use a context of {ctx}")
    long = ctx > n_short
    mapped = fgclip_state_dict(sd, long=long, where=where)
    config.text_config.max_position_embeddings = n_long if long else n_short
    config.text_config.eos_token_id = EOT_ID
    with torch.random.fork_rng(devices=[]), quiet_transformers():
        model = transformers.CLIPModel(config).float().eval()
    missing, unexpected = model.load_state_dict(mapped, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        what = f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}"
        raise CapscoreError(f"{where}: weights do not fit the CLIP config ({what})")
    try:
        with quiet_transformers():
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
            image_processor = transformers.AutoImageProcessor.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as e:
        raise CapscoreError(f"{where}: cannot load the tokenizer or image processor ({str(e).splitlines()[0][:160]})") from None
    bb = FGClipBackbone(model, tokenizer, image_processor, spec=spec, long=long)
    bb.context_length = ctx
    return bb.to(device, resolve_dtype(dtype))
