"""Converters between open_clip / OpenAI-format CLIP weights and Hugging Face ``CLIPModel`` folders.

Everything here works offline: the HF tokenizer files are rebuilt from the BPE
table that ships inside open_clip, and the model is written from weights we
already hold. Other parts of capscore rely on these names staying stable:

* :func:`write_clip_tokenizer_files` — ``vocab.json`` + ``merges.txt`` for ``CLIPTokenizer``;
* :func:`save_open_clip_as_hf` — an open_clip CLIP as a ``CLIPModel`` + ``CLIPProcessor``
  folder, loadable with ``hf:FOLDER`` (and by torchmetrics' ``CLIPScore``);
* :func:`save_openai_checkpoint` — OpenAI-format state dict (re-exported from
  :mod:`capscore.backbones.openai_ckpt`).

Weight mapping (open_clip -> transformers), per transformer block ``i``::

    ln_1 -> layer_norm1          attn.in_proj_{weight,bias} -> self_attn.{q,k,v}_proj (split in 3, q first)
    ln_2 -> layer_norm2          attn.out_proj -> self_attn.out_proj
    mlp.c_fc -> mlp.fc1          mlp.c_proj -> mlp.fc2

    text:   token_embedding -> embeddings.token_embedding, positional_embedding ->
            embeddings.position_embedding, ln_final -> final_layer_norm,
            text_projection (W, D) -> text_projection.weight (D, W) (transposed, no bias)
    vision: conv1 -> embeddings.patch_embedding, class_embedding -> embeddings.class_embedding,
            positional_embedding -> embeddings.position_embedding, ln_pre -> pre_layrnorm,
            ln_post -> post_layernorm, proj (W, D) -> visual_projection.weight (transposed)
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import torch
from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD
from open_clip.tokenizer import bytes_to_unicode, default_bpe
from open_clip.transformer import VisionTransformer

from capscore._optional import require
from capscore.backbones.openai_ckpt import save_openai_checkpoint
from capscore.errors import CapscoreError
from capscore.backbones.hf import quiet_transformers

__all__ = ["write_clip_tokenizer_files", "save_open_clip_as_hf", "save_openai_checkpoint", "open_clip_to_hf_state_dict"]

SOT, EOT = "<|startoftext|>", "<|endoftext|>"
N_MERGES = 49152 - 256 - 2  # the slice open_clip's SimpleTokenizer (and OpenAI's) uses: lines[1 : 1 + N_MERGES]


def _bpe_merges() -> list[str]:
    lines = gzip.open(default_bpe()).read().decode("utf-8").split("\n")
    return lines[1 : 1 + N_MERGES]  # line 0 is the version header


def write_clip_tokenizer_files(folder: str | Path, *, context_length: int = 77) -> Path:
    """Write ``vocab.json``, ``merges.txt`` (and a small ``tokenizer_config.json``) for ``CLIPTokenizer``.

    ``vocab.json`` lists, in id order, the 256 byte-unicode characters, the same
    with ``</w>``, the joined merges, then ``<|startoftext|>`` (49406) and
    ``<|endoftext|>`` (49407) — the table open_clip builds in memory, so the HF
    tokenizer gives the same ids. ``merges.txt`` starts with the
    ``#version: 0.2`` header that HF readers skip.
    """
    out = Path(folder).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    merges = _bpe_merges()
    chars = list(bytes_to_unicode().values())
    vocab = chars + [c + "</w>" for c in chars] + ["".join(m.split()) for m in merges] + [SOT, EOT]
    (out / "vocab.json").write_text(json.dumps({tok: i for i, tok in enumerate(vocab)}, ensure_ascii=False), encoding="utf-8")
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    config = {
        "tokenizer_class": "CLIPTokenizer",
        "bos_token": SOT,
        "eos_token": EOT,
        "unk_token": EOT,
        "pad_token": EOT,
        "model_max_length": context_length,
        "do_lower_case": True,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return out


def _activation(block) -> str:
    name = type(block.mlp.gelu).__name__.lower()
    if "quickgelu" in name:
        return "quick_gelu"
    if name == "gelu":
        approx = getattr(block.mlp.gelu, "approximate", "none")
        return "gelu" if approx == "none" else "gelu_new"
    raise CapscoreError(f"activation {type(block.mlp.gelu).__name__} has no transformers equivalent")


def _check_convertible(model) -> None:
    problems = []
    visual = getattr(model, "visual", None)
    if not isinstance(visual, VisionTransformer):
        problems.append("image tower is not open_clip's VisionTransformer")
    elif visual.attn_pool is not None or getattr(visual, "pool_type", "tok") != "tok" or visual.final_ln_after_pool:
        problems.append("image tower pools differently from CLIP")
    elif isinstance(visual.ln_pre, torch.nn.Identity):
        problems.append("image tower has no ln_pre")
    if not hasattr(model, "token_embedding") or getattr(model, "text_pool_type", "argmax") not in ("argmax", "eos"):
        problems.append("text tower is not the standard causal CLIP transformer")
    for blk in list(getattr(getattr(model, "transformer", None), "resblocks", [])) + list(
        getattr(getattr(visual, "transformer", None), "resblocks", [])
    ):
        if not isinstance(getattr(blk, "ls_1", torch.nn.Identity()), torch.nn.Identity) or not hasattr(blk.attn, "in_proj_weight"):
            problems.append("blocks use layer scale or custom attention")
            break
    if isinstance(getattr(model, "text_projection", None), torch.nn.Linear):
        problems.append("text projection has a bias")
    if problems:
        raise CapscoreError(f"cannot convert to a transformers CLIPModel: {problems[0]}")


def _blocks(prefix_src: str, prefix_dst: str, n: int, sd: dict, out: dict) -> None:
    for i in range(n):
        s, d = f"{prefix_src}.{i}.", f"{prefix_dst}.{i}."
        for a, b in [("ln_1", "layer_norm1"), ("ln_2", "layer_norm2"), ("attn.out_proj", "self_attn.out_proj"),
                     ("mlp.c_fc", "mlp.fc1"), ("mlp.c_proj", "mlp.fc2")]:
            out[d + b + ".weight"] = sd[s + a + ".weight"]
            out[d + b + ".bias"] = sd[s + a + ".bias"]
        for name, w, bias in zip("qkv", sd[s + "attn.in_proj_weight"].chunk(3), sd[s + "attn.in_proj_bias"].chunk(3)):
            out[d + f"self_attn.{name}_proj.weight"] = w
            out[d + f"self_attn.{name}_proj.bias"] = bias


def open_clip_to_hf_state_dict(model) -> dict[str, torch.Tensor]:
    """The weights of an open_clip CLIP under transformers ``CLIPModel`` names (see the module docstring)."""
    sd = {k: v.detach().float().cpu() for k, v in model.state_dict().items() if v.is_floating_point()}
    if "visual.conv1.weight" not in sd:
        raise CapscoreError("this image tower has a convolutional stem (capscore.backbones.convstem), which "
                            "transformers' CLIPModel cannot hold; save it with save_openai_checkpoint (ckpt:PATH)")
    out: dict[str, torch.Tensor] = {}
    t, v = "text_model.", "vision_model."
    out[t + "embeddings.token_embedding.weight"] = sd["token_embedding.weight"]
    out[t + "embeddings.position_embedding.weight"] = sd["positional_embedding"]
    _blocks("transformer.resblocks", t + "encoder.layers", len(model.transformer.resblocks), sd, out)
    out[t + "final_layer_norm.weight"], out[t + "final_layer_norm.bias"] = sd["ln_final.weight"], sd["ln_final.bias"]
    out["text_projection.weight"] = sd["text_projection"].T.contiguous()
    out[v + "embeddings.class_embedding"] = sd["visual.class_embedding"]
    out[v + "embeddings.patch_embedding.weight"] = sd["visual.conv1.weight"]
    out[v + "embeddings.position_embedding.weight"] = sd["visual.positional_embedding"]
    out[v + "pre_layrnorm.weight"], out[v + "pre_layrnorm.bias"] = sd["visual.ln_pre.weight"], sd["visual.ln_pre.bias"]
    _blocks("visual.transformer.resblocks", v + "encoder.layers", len(model.visual.transformer.resblocks), sd, out)
    out[v + "post_layernorm.weight"], out[v + "post_layernorm.bias"] = sd["visual.ln_post.weight"], sd["visual.ln_post.bias"]
    out["visual_projection.weight"] = sd["visual.proj"].T.contiguous()
    out["logit_scale"] = sd["logit_scale"].reshape(())
    return {k: x.contiguous() for k, x in out.items()}


def _hf_configs(model) -> dict:
    tb, vb = model.transformer.resblocks[0], model.visual.transformer.resblocks[0]
    visual = model.visual
    image_size = visual.image_size[0] if isinstance(visual.image_size, (tuple, list)) else int(visual.image_size)
    patch = visual.patch_size[0] if isinstance(visual.patch_size, (tuple, list)) else int(visual.patch_size)
    text_width = int(model.ln_final.normalized_shape[0])
    vision_width = int(visual.ln_post.normalized_shape[0])
    embed_dim = int(model.text_projection.shape[1])
    text = dict(
        vocab_size=int(model.token_embedding.weight.shape[0]),
        hidden_size=text_width,
        intermediate_size=int(tb.mlp.c_fc.weight.shape[0]),
        num_hidden_layers=len(model.transformer.resblocks),
        num_attention_heads=int(tb.attn.num_heads),
        max_position_embeddings=int(model.positional_embedding.shape[0]),
        hidden_act=_activation(tb),
        layer_norm_eps=float(model.ln_final.eps),
        projection_dim=embed_dim,
        bos_token_id=49406,
        eos_token_id=49407,
        pad_token_id=49407,
    )
    vision = dict(
        hidden_size=vision_width,
        intermediate_size=int(vb.mlp.c_fc.weight.shape[0]),
        num_hidden_layers=len(visual.transformer.resblocks),
        num_attention_heads=int(vb.attn.num_heads),
        image_size=image_size,
        patch_size=patch,
        hidden_act=_activation(vb),
        layer_norm_eps=float(visual.ln_post.eps),
        projection_dim=embed_dim,
    )
    return dict(text_config=text, vision_config=vision, projection_dim=embed_dim)


def save_open_clip_as_hf(backbone, folder: str | Path) -> Path:
    """Write an open_clip CLIP (ViT image tower, standard text tower) as a transformers folder.

    The folder holds ``config.json`` + ``model.safetensors`` (``CLIPModel``) and the
    ``CLIPProcessor`` files (tokenizer built offline by :func:`write_clip_tokenizer_files`;
    image processor: bicubic resize of the short side, center crop, the mean/std
    of the backbone's own preprocessing, OpenAI's by default). ``hf:FOLDER``
    then gives the same vectors as the source backbone. Returns the folder.
    """
    require("transformers", purpose="writing a Hugging Face CLIPModel folder")
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    model = backbone.model if hasattr(backbone, "model") else backbone
    _check_convertible(model)
    out = Path(folder).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    cfg = _hf_configs(model)
    hf_cfg = CLIPConfig(text_config=cfg["text_config"], vision_config=cfg["vision_config"],
                        projection_dim=cfg["projection_dim"], logit_scale_init_value=float(model.logit_scale.detach()))
    with torch.random.fork_rng(devices=[]):
        hf = CLIPModel(hf_cfg).float().eval()
    missing, unexpected = hf.load_state_dict(open_clip_to_hf_state_dict(model), strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:  # a programming error: the mapping above is incomplete
        raise RuntimeError(f"open_clip -> HF mapping incomplete: missing {missing[:3]}, unexpected {unexpected[:3]}")

    with quiet_transformers():
        hf.save_pretrained(out)

    mean, std = _normalisation(backbone)
    size = cfg["vision_config"]["image_size"]
    image_processor = CLIPImageProcessor(
        do_resize=True, size={"shortest_edge": size}, resample=3, do_center_crop=True,
        crop_size={"height": size, "width": size}, do_rescale=True, rescale_factor=1 / 255,
        do_normalize=True, image_mean=list(mean), image_std=list(std), do_convert_rgb=True,
    )
    tok_dir = write_clip_tokenizer_files(out, context_length=cfg["text_config"]["max_position_embeddings"])
    with quiet_transformers():
        tokenizer = CLIPTokenizer.from_pretrained(str(tok_dir))
        CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(out)
    return out


def _normalisation(backbone) -> tuple[tuple[float, ...], tuple[float, ...]]:
    for t in getattr(getattr(backbone, "_preprocess", None), "transforms", []):
        if type(t).__name__ == "Normalize":
            return tuple(float(x) for x in t.mean), tuple(float(x) for x in t.std)
    return OPENAI_DATASET_MEAN, OPENAI_DATASET_STD
