"""FG-CLIP checkpoints (``fgclip:DIR``) and SigLIP patch tokens.

The expected vectors come from an independent re-implementation of FG-CLIP's forward
(360CVGroup/FG-CLIP ``fgclip.py`` + its ``modeling_clip.py``), written here with functional
ops on the raw checkpoint tensors — never from the adapter or transformers' CLIPModel.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from capscore.backbones import load_backbone
from capscore.embed.engine import Encoder
from capscore.errors import CapscoreError

TOL = 1e-5
W_T, W_V, HEADS, LAYERS, D = 32, 48, 2, 2, 24  # text width, vision width, heads, layers, joint dim
TEXTS = ["a red cube", "a yellow cylinder and a red cube next to a small green sphere on the floor", "x"]


@pytest.fixture(scope="module")
def fg(tmp_path_factory):
    """A random tiny CLIP saved in FG-CLIP's full checkpoint layout (config, weights, tokenizer, processor)."""
    from safetensors.torch import save_file
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    from capscore.backbones.hf_convert import write_clip_tokenizer_files

    folder = tmp_path_factory.mktemp("fgclip") / "fg-clip-tiny"
    cfg = CLIPConfig(
        text_config=dict(vocab_size=49408, hidden_size=W_T, intermediate_size=4 * W_T, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, max_position_embeddings=77, hidden_act="quick_gelu"),
        vision_config=dict(hidden_size=W_V, intermediate_size=4 * W_V, num_hidden_layers=LAYERS,
                           num_attention_heads=HEADS, image_size=32, patch_size=8, hidden_act="quick_gelu"),
        projection_dim=D,
    )
    g = torch.Generator().manual_seed(3)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        model = CLIPModel(cfg).eval()
    sd = {k: v.detach().clone() for k, v in model.state_dict().items() if "position_ids" not in k}
    for k, v in sd.items():  # non-trivial biases and layer norms, so a dropped tensor shows
        if k.endswith(("bias", "layer_norm1.weight", "layer_norm2.weight")):
            sd[k] = v + 0.05 * torch.randn(v.shape, generator=g)
    sd["text_model.embeddings.position_embedding_res.weight"] = 0.02 * torch.randn(248, W_T, generator=g)
    sd["text_model.embeddings.position_embedding_ori.weight"] = 0.02 * torch.randn(248, W_T, generator=g)
    sd["text_filip_projection.weight"] = W_T ** -0.5 * torch.randn(D, W_T, generator=g)
    sd["logit_scale_finegraind"] = torch.tensor(2.0)
    sd["logit_scale_hardneg"] = torch.tensor(2.5)
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(folder / "model.safetensors"))
    config = cfg.to_dict()
    config["architectures"] = ["FGCLIPModel"]
    config["auto_map"] = {"AutoConfig": "configuration_clip.CLIPConfig", "AutoModelForCausalLM": "fgclip.FGCLIPModel"}
    (folder / "config.json").write_text(json.dumps(config))
    write_clip_tokenizer_files(folder)
    processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor.save_pretrained(folder)
    rng = np.random.default_rng(5)
    images = [Image.fromarray((rng.random((32, 32, 3)) * 255).astype("uint8")) for _ in range(2)]
    pixels = processor(images=images, return_tensors="pt")["pixel_values"]
    return dict(folder=folder, sd=sd, images=images, pixels=pixels)


# ---- FG-CLIP's forward, re-implemented from its source on the raw tensors
def _ln(sd, p, x):
    return F.layer_norm(x, x.shape[-1:], sd[p + ".weight"], sd[p + ".bias"], 1e-5)


def _lin(sd, p, x):
    return x @ sd[p + ".weight"].T + sd[p + ".bias"]


def _mlp(sd, p, x):
    h = _lin(sd, p + ".fc1", x)
    return _lin(sd, p + ".fc2", h * torch.sigmoid(1.702 * h))


def _layer(sd, p, x, causal):
    B, L, W = x.shape
    h = _ln(sd, p + ".layer_norm1", x)
    q, k, v = (_lin(sd, f"{p}.self_attn.{n}_proj", h).view(B, L, HEADS, W // HEADS).transpose(1, 2) for n in "qkv")
    att = (q * (W // HEADS) ** -0.5) @ k.transpose(-1, -2)
    if causal:
        att = att + torch.full((L, L), float("-inf")).triu(1)
    x = x + _lin(sd, p + ".self_attn.out_proj", (att.softmax(-1) @ v).transpose(1, 2).reshape(B, L, W))
    return x + _mlp(sd, p + ".mlp", _ln(sd, p + ".layer_norm2", x))


def _text(sd, ids, *, long):
    e = "text_model.embeddings."
    L = ids.shape[1]
    if long:  # CLIPTextEmbeddings(walk_short_pos=False): ori * mask1 + res * mask2
        mask1 = (torch.arange(L) < 20).float()[:, None]
        pos = sd[e + "position_embedding_ori.weight"][:L] * mask1 + sd[e + "position_embedding_res.weight"][:L] * (1 - mask1)
    else:
        pos = sd[e + "position_embedding.weight"][:L]
    x = sd[e + "token_embedding.weight"][ids] + pos
    for i in range(LAYERS):
        x = _layer(sd, f"text_model.encoder.layers.{i}", x, causal=True)
    x = _ln(sd, "text_model.final_layer_norm", x)
    pooled = x[torch.arange(len(ids)), (ids == 49407).int().argmax(-1)]  # first end-of-text
    return pooled @ sd["text_filip_projection.weight" if long else "text_projection.weight"].T, x


def _vision(sd, pixels):
    v = "vision_model."
    x = F.conv2d(pixels, sd[v + "embeddings.patch_embedding.weight"], stride=8).flatten(2).transpose(1, 2)
    cls = sd[v + "embeddings.class_embedding"].expand(len(pixels), 1, -1)
    x = _ln(sd, v + "pre_layrnorm", torch.cat([cls, x], 1) + sd[v + "embeddings.position_embedding.weight"])
    for i in range(LAYERS - 1):
        x = _layer(sd, f"{v}encoder.layers.{i}", x, causal=False)
    before_last = x
    x = _layer(sd, f"{v}encoder.layers.{LAYERS - 1}", x, causal=False)
    proj = sd["visual_projection.weight"].T
    pooled = _ln(sd, v + "post_layernorm", x[:, 0]) @ proj
    # get_image_dense_features: forward_without_attn on hidden_states[-2], drop CLS, post_layernorm, projection
    p = f"{v}encoder.layers.{LAYERS - 1}"
    y = before_last + _lin(sd, p + ".self_attn.out_proj", _lin(sd, p + ".self_attn.v_proj", _ln(sd, p + ".layer_norm1", before_last)))
    y = y + _mlp(sd, p + ".mlp", _ln(sd, p + ".layer_norm2", y))
    dense = _ln(sd, v + "post_layernorm", y[:, 1:]) @ proj
    return pooled, dense


def _ids(texts, length):
    import open_clip

    return open_clip.tokenize(texts, context_length=length)  # zero padding: pooling reads the first EOT only


def test_fgclip_short_path_global_and_dense_features(fg):
    bb = load_backbone(f"fgclip:{fg['folder']}")
    assert bb.family == "fgclip" and bb.context_length == 77 and bb.has_patch_tokens and bb.has_token_features
    enc = Encoder(bb, batch_size=2)  # two batches padded to different lengths
    with torch.no_grad():
        want_text, states = _text(fg["sd"], _ids(TEXTS, 77), long=False)
        want_img, want_dense = _vision(fg["sd"], fg["pixels"])
    assert (enc.encode_texts(TEXTS) - F.normalize(want_text, dim=-1)).abs().max() <= TOL
    assert (enc.encode_images(fg["images"]) - F.normalize(want_img, dim=-1)).abs().max() <= TOL
    g, patches = enc.image_patches(fg["images"])
    assert patches.shape == (2, 16, D)  # (32 / 8)^2 patches, class token dropped
    assert (g - F.normalize(want_img, dim=-1)).abs().max() <= TOL
    assert (patches - F.normalize(want_dense, dim=-1)).abs().max() <= TOL
    tok = enc.text_tokens(TEXTS[:1])[0]
    want_tok = F.normalize(states[0, : len(tok.ids)] @ fg["sd"]["text_projection.weight"].T, dim=-1)
    assert (tok.vectors - want_tok).abs().max() <= TOL


def test_fgclip_long_path_uses_ori_res_positions_and_filip_projection(fg):
    bb = load_backbone(f"fgclip:{fg['folder']}", context_length=248)
    assert bb.context_length == 248
    long_text = " ".join(["a red cube next to a green sphere"] * 12)  # > 77 tokens
    with torch.no_grad():
        want, _ = _text(fg["sd"], _ids(TEXTS + [long_text], 248), long=True)
    got = Encoder(bb).encode_texts(TEXTS + [long_text])
    assert (got - F.normalize(want, dim=-1)).abs().max() <= TOL
    short = Encoder(load_backbone(f"fgclip:{fg['folder']}")).encode_texts(TEXTS)
    assert (short - got[:3]).abs().max() > 1e-3  # the two paths are different models
    assert load_backbone(f"fgclip:{fg['folder']}").identity != bb.identity


def test_fgclip_errors(fg, tmp_path):
    with pytest.raises(CapscoreError, match="cannot use a context of 300"):
        load_backbone(f"fgclip:{fg['folder']}", context_length=300)
    with pytest.raises(CapscoreError, match="not an FG-CLIP model folder"):
        load_backbone(f"fgclip:{tmp_path / 'nowhere'}")
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text((fg["folder"] / "config.json").read_text())
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in fg["sd"].items() if "filip" not in k}, str(plain / "model.safetensors"))
    with pytest.raises(CapscoreError, match="not an FG-CLIP checkpoint .*hf:DIR"):
        load_backbone(f"fgclip:{plain}")


# ------------------------------------------------------------------ SigLIP patch tokens
def _siglip_folder(tmp_path, image_size):
    from transformers import CLIPTokenizer, SiglipConfig, SiglipImageProcessor, SiglipModel

    from capscore.backbones.hf_convert import write_clip_tokenizer_files

    folder = tmp_path / f"siglip{image_size}"
    write_clip_tokenizer_files(folder, context_length=16)
    tok = CLIPTokenizer.from_pretrained(str(folder))
    cfg = SiglipConfig(
        text_config=dict(vocab_size=49408, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=16, pad_token_id=tok.pad_token_id),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=image_size, patch_size=8),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = SiglipModel(cfg).eval()
    model.save_pretrained(folder)
    SiglipImageProcessor(size={"height": image_size, "width": image_size}).save_pretrained(folder)
    return folder, model


def test_siglip_patch_tokens_are_the_pooling_head_applied_to_each_patch(tmp_path):
    """One patch: the head's attention has a single key, so the patch token IS the pooled embedding."""
    folder, model = _siglip_folder(tmp_path, 8)
    bb = load_backbone(f"hf:{folder}")
    assert bb.has_patch_tokens and not bb.has_token_features
    pixels = torch.randn(3, 3, 8, 8)
    with torch.no_grad():
        pooled, patches = bb.forward_images(pixels, patches=True)
        want = model.get_image_features(pixel_values=pixels)
        want = getattr(want, "pooler_output", want)
    assert patches.shape == (3, 1, 32)
    assert (pooled - want).abs().max() <= TOL and (patches[:, 0] - want).abs().max() <= TOL

    folder4, model4 = _siglip_folder(tmp_path, 16)  # 4 patches: each is the head on that patch alone
    bb4 = load_backbone(f"hf:{folder4}")
    px = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        _, p4 = bb4.forward_images(px, patches=True)
        states = model4.vision_model(pixel_values=px).last_hidden_state  # (2, 4, 32)
        head = model4.vision_model.head
        alone = torch.stack([head(states[:, j : j + 1]) for j in range(4)], 1)  # the real head, one patch at a time
        alone = getattr(alone, "pooler_output", alone)
    assert p4.shape == (2, 4, 32) and (p4 - alone).abs().max() <= TOL
