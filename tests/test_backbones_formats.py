"""Backbone adapters for weight files: OpenAI-format checkpoints (CLIP, PAC-S, PAC++, LongCLIP),
open_clip files and Hugging Face folders.

The reference for every vector is open_clip itself (``encode_text`` on its own
77-token padded tokenization, ``encode_image`` on its own transform) run on the
model the files were written from, never the adapter under test.
"""
from __future__ import annotations

import argparse
import json
import warnings

import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import capscore.backbones.openclip  # noqa: F401  (registers capscore-test-tiny)
from capscore.backbones import load_backbone
from capscore.embed.engine import Encoder
from capscore.errors import CapscoreError

ARCH = "capscore-test-tiny"
TEXTS = [
    "a dog",
    "a red car parked on a long street near the sea, with two people walking by",
    "x",
    "A kitchen: pots, pans & a window!",
]
TOL = 1e-5


@pytest.fixture(scope="session")
def ref(tmp_path_factory):
    """A random capscore-test-tiny written in every format, plus open_clip's own vectors for it."""
    d = tmp_path_factory.mktemp("formats")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)
        model, _, preprocess = open_clip.create_model_and_transforms(ARCH, pretrained=None)
    model.eval()
    with torch.no_grad():  # a non-trivial logit scale and non-zero biases, so a dropped tensor shows
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.02)
    rng = np.random.default_rng(0)
    images = []
    for i in range(3):
        path = d / f"im{i}.png"
        Image.fromarray((rng.random((32, 32, 3)) * 255).astype("uint8")).save(path)
        images.append(path)
    tok = open_clip.get_tokenizer(ARCH)
    with torch.no_grad():
        text = F.normalize(model.encode_text(tok(TEXTS)), dim=-1)
        pixels = torch.stack([preprocess(Image.open(p)) for p in images])
        image = F.normalize(model.encode_image(pixels), dim=-1)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    return dict(dir=d, model=model, sd=sd, text=text, image=image, images=images, pixels=pixels)


def _check_vectors(bb, ref, *, tol=TOL):
    enc = Encoder(bb, batch_size=3)  # 3 < len(TEXTS): two batches padded to different lengths
    assert (enc.encode_texts(TEXTS) - ref["text"]).abs().max().item() <= tol
    assert (enc.encode_images(ref["images"]) - ref["image"]).abs().max().item() <= tol


def _quiet_load(spec, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_backbone(spec, **kw)


# ------------------------------------------------------------------ OpenAI-format checkpoints
@pytest.mark.parametrize("layout", ["plain", "pacs-ddp", "safetensors", "model-wrapper"])
def test_openai_checkpoint_layouts_give_open_clip_vectors(ref, layout):
    sd = {k: v for k, v in ref["sd"].items()}
    path = ref["dir"] / f"ckpt-{layout}.pt"
    if layout == "plain":
        torch.save(sd, path)
    elif layout == "pacs-ddp":  # PAC-S: {'state_dict': ...}, here also saved from a DDP-wrapped model
        torch.save({"state_dict": {"module." + k: v for k, v in sd.items()}, "epoch": 3}, path)
    elif layout == "model-wrapper":
        torch.save({"model": {k: v.half() for k, v in sd.items()}, "step": 10}, path)  # fp16 weights too
    else:
        from safetensors.torch import save_file

        path = path.with_suffix(".safetensors")
        save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    bb = load_backbone(f"ckpt:{path}")
    assert bb.family == "openai-ckpt" and bb.context_length == 77 and bb.embed_dim == 32
    assert bb.has_patch_tokens and bb.has_token_features and bb.pad_to_longest_exact
    _check_vectors(bb, ref, tol=2e-3 if layout == "model-wrapper" else TOL)


def test_bare_checkpoint_path_routes_to_ckpt(ref):
    path = ref["dir"] / "bare.pth"
    torch.save(ref["sd"], path)
    bb = load_backbone(str(path))
    assert bb.family == "openai-ckpt"
    _check_vectors(bb, ref)


def test_same_weights_same_vectors_in_every_format(ref):
    """Parity: OpenAI format, open_clip format (ARCH/file) and HF format agree (<= 1e-5)."""
    from capscore.backbones.hf_convert import save_open_clip_as_hf
    from capscore.backbones.openai_ckpt import save_openai_checkpoint

    oc_file = ref["dir"] / "open_clip_format.pt"
    torch.save(ref["sd"], oc_file)
    via_open_clip = _quiet_load(f"{ARCH}/{oc_file}")
    ckpt = save_openai_checkpoint(via_open_clip, ref["dir"] / "roundtrip.pt")
    via_ckpt = load_backbone(f"ckpt:{ckpt}")
    hf_dir = save_open_clip_as_hf(via_ckpt, ref["dir"] / "hf")
    via_hf = load_backbone(f"hf:{hf_dir}")
    assert via_hf.family == "hf" and via_hf.pad_to_longest_exact and via_hf.context_length == 77
    for bb in (via_open_clip, via_ckpt, via_hf):
        _check_vectors(bb, ref)
    # the folder is a complete transformers checkpoint: CLIPProcessor loads it as other tools do
    from transformers import CLIPProcessor

    proc = CLIPProcessor.from_pretrained(str(hf_dir))
    assert proc.tokenizer(TEXTS[1])["input_ids"] == via_ckpt.tokenize([TEXTS[1]])[0]
    assert torch.equal(proc(images=Image.open(ref["images"][0]), return_tensors="pt")["pixel_values"][0],
                       via_hf.preprocess(Image.open(ref["images"][0])))
    # patch tokens and per-token text features agree across adapters too
    g0, p0 = Encoder(via_ckpt).image_patches(ref["images"])
    g1, p1 = Encoder(via_hf).image_patches(ref["images"])
    assert p0.shape == (3, 16, 32)  # (32 / 8)^2 patches
    assert (p0 - p1).abs().max() <= TOL and (g0 - g1).abs().max() <= TOL
    t0, t1 = Encoder(via_ckpt).text_tokens(TEXTS), Encoder(via_hf).text_tokens(TEXTS)
    for a, b in zip(t0, t1):
        assert a.ids == b.ids
        assert (a.vectors - b.vectors).abs().max() <= TOL


def test_longclip_checkpoint_merges_res_table(ref):
    """LongCLIP: rows < 20 from positional_embedding, rows >= 20 from positional_embedding_res."""
    torch.manual_seed(5)
    sd = dict(ref["sd"])
    pe = torch.randn(248, 32) * 0.01
    res = torch.randn(248, 32) * 0.01
    sd["positional_embedding"], sd["positional_embedding_res"] = pe, res
    path = ref["dir"] / "longclip-tiny.pt"
    torch.save(sd, path)
    bb = load_backbone(f"ckpt:{path}")
    assert bb.context_length == 248
    # LongCLIP's text tower adds pe * mask1 + res * mask2 (mask1 = rows < 20, mask2 = rows >= 20)
    mask1 = torch.zeros(248, 1)
    mask1[:20] = 1
    expected_table = pe * mask1 + res * (1 - mask1)
    assert torch.equal(bb.model.positional_embedding.detach(), expected_table)
    # a 150-token caption is encoded whole, as open_clip does with the merged table at context 248
    long_caption = " ".join(["word"] * 150)
    ref_model = open_clip.create_model(ARCH, pretrained=None, force_context_length=248).eval()
    merged = {k: v for k, v in sd.items() if k != "positional_embedding_res"}
    merged["positional_embedding"] = expected_table
    ref_model.load_state_dict(merged)
    with torch.no_grad():
        expected = F.normalize(ref_model.encode_text(open_clip.get_tokenizer(ARCH, context_length=248)([long_caption])), dim=-1)
    enc = Encoder(bb)
    got = enc.encode_texts([long_caption])
    assert enc.stats.truncated == 0
    assert (got - expected).abs().max() <= TOL


def test_stretch_on_load_is_longclip_knowledge_preserved(ref):
    """context_length=248 on a 77 model: rows 0..19 kept, then 4x linear interpolation, extrapolated tail.

    With a linear ramp pe[i] = i·v the stretched table is known in closed form:
    row i is i·v for i < 20 and (20 + (i - 20)/4)·v after (interpolating a ramp stays
    on the ramp; the last 4 rows continue its slope: 76, 76.25, 76.5, 76.75).
    """
    v = torch.linspace(-1, 1, 32)
    sd = dict(ref["sd"])
    sd["positional_embedding"] = torch.arange(77, dtype=torch.float32)[:, None] * v
    path = ref["dir"] / "ramp.pt"
    torch.save(sd, path)
    bb = load_backbone(f"ckpt:{path}", context_length=248)
    assert bb.context_length == 248
    pos = [i if i < 20 else 20 + (i - 20) / 4 for i in range(248)]
    expected = torch.tensor(pos, dtype=torch.float32)[:, None] * v
    got = bb.model.positional_embedding.detach()
    assert got.shape == (248, 32)
    assert torch.allclose(got, expected, atol=1e-5, rtol=0)
    assert pos[-4:] == [76.0, 76.25, 76.5, 76.75]
    assert bb.model.attn_mask.shape == (248, 248)


def test_shorter_context_slices_and_bad_context_errors(ref):
    path = ref["dir"] / "ctx.pt"
    torch.save(ref["sd"], path)
    bb = load_backbone(f"ckpt:{path}", context_length=40)
    assert bb.context_length == 40
    assert torch.equal(bb.model.positional_embedding.detach(), ref["sd"]["positional_embedding"][:40])
    with pytest.raises(CapscoreError, match="cannot give a 77-position text tower a context of 100"):
        load_backbone(f"ckpt:{path}", context_length=100)


def test_pacpp_lora_factors_are_merged(ref):
    """loralib: W_eff = W + (B @ A) * alpha / r, alpha = 1; PAC++'s MLP factors are not applied by default."""
    from capscore.backbones.openai_ckpt import merge_lora

    sd = {
        "blk.attn.in_proj_weight": torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [0.0, 0.0], [1.0, 1.0], [3.0, 0.0]]),
        "blk.attn.in_proj_weight_lora_A": torch.tensor([[1.0, 2.0], [0.0, 1.0]]),  # r = 2
        "blk.attn.in_proj_weight_lora_B": torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 2.0], [0.0, 0.0], [0.0, 0.0], [4.0, 0.0]]),
        "blk.mlp.c_fc.weight": torch.tensor([[1.0, 1.0]]),
        "blk.mlp.c_fc.lora_A": torch.tensor([[3.0, 1.0]]),  # r = 1
        "blk.mlp.c_fc.lora_B": torch.tensor([[2.0]]),
        "blk.mlp.c_fc.bias": torch.tensor([0.5]),
        # PAC++'s lora_layers.Conv2d: kernel 2, C_in 1, C_out 1, r = 1 -> A (r·k, C_in·k) = (2, 2), B (C_out·k, r·k) = (2, 2)
        "visual.conv1.weight": torch.zeros(1, 1, 2, 2),
        "visual.conv1.lora_A": torch.tensor([[1.0, 0.0], [0.0, 1.0]]),
        "visual.conv1.lora_B": torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
    }
    out = merge_lora(sd)
    # in_proj: B @ A = [[1,2],[0,0],[0,2],[0,0],[0,0],[4,8]], scaled by 1/2
    assert out["blk.attn.in_proj_weight"].tolist() == [[1.5, 1.0], [0.0, 1.0], [2.0, 3.0], [0.0, 0.0], [1.0, 1.0], [5.0, 4.0]]
    # conv: B @ A = [[1,2],[3,4]] viewed as the (1, 1, 2, 2) kernel, r = A.shape[0] / k = 1
    assert out["visual.conv1.weight"].tolist() == [[[[1.0, 2.0], [3.0, 4.0]]]]
    assert out["blk.mlp.c_fc.weight"].tolist() == [[1.0, 1.0]]  # pacscore never applies the MLP factors
    assert not any("lora" in k for k in out) and out["blk.mlp.c_fc.bias"].tolist() == [0.5]
    merged = merge_lora(sd, mlp="merge")
    assert merged["blk.mlp.c_fc.weight"].tolist() == [[7.0, 3.0]]  # [1,1] + [6,2]·1
    assert merge_lora(sd, lora_alpha=2.0, mlp="merge")["blk.mlp.c_fc.weight"].tolist() == [[13.0, 5.0]]
    with pytest.raises(CapscoreError, match="'mlp' parameter of merge_lora"):
        merge_lora(sd, mlp="all")

    # end to end: zero LoRA factors on a real checkpoint change nothing
    full = dict(ref["sd"])
    full["transformer.resblocks.0.mlp.c_fc.lora_A"] = torch.zeros(4, 32)
    full["transformer.resblocks.0.mlp.c_fc.lora_B"] = torch.zeros(128, 4)
    path = ref["dir"] / "pacpp.pth"
    torch.save({"state_dict": full}, path)
    _check_vectors(load_backbone(f"ckpt:{path}"), ref)


# ---- an independent re-implementation of pacscore's PAC++ forward (models/clip_lora + custom_loralib),
# ---- written from its source: functional ops on the raw state dict, no open_clip, no capscore.
R_PACPP = 4  # compute_correlations_pac++.py: lora_r = 4; lora_alpha = 1 -> scaling 1/4


def _ln(sd, p, x):
    return F.layer_norm(x, x.shape[-1:], sd[p + ".weight"], sd[p + ".bias"], 1e-5)


def _lora_linear(sd, x, w_key, a_key, b_key, bias_key, *, apply):
    y = x @ sd[w_key].T + sd[bias_key]
    if apply:  # multi_head_attention_forward: linear(linear(x, A), B) * scaling
        y = y + (x @ sd[a_key].T @ sd[b_key].T) / R_PACPP
    return y


def _pacpp_block(sd, p, x, heads, mask, *, mlp_lora):
    B, L, W = x.shape
    h = _ln(sd, p + "ln_1", x)
    qkv = _lora_linear(sd, h, p + "attn.in_proj_weight", p + "attn.in_proj_weight_lora_A",
                       p + "attn.in_proj_weight_lora_B", p + "attn.in_proj_bias", apply=True)
    q, k, v = (t.reshape(B, L, heads, W // heads).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
    att = (q * (W // heads) ** -0.5) @ k.transpose(-1, -2)
    if mask is not None:
        att = att + mask
    o = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, L, W)
    x = x + _lora_linear(sd, o, p + "attn.out_proj.weight", p + "attn.out_proj.lora_A", p + "attn.out_proj.lora_B",
                         p + "attn.out_proj.bias", apply=True)
    h = _ln(sd, p + "ln_2", x)
    h = _lora_linear(sd, h, p + "mlp.c_fc.weight", p + "mlp.c_fc.lora_A", p + "mlp.c_fc.lora_B", p + "mlp.c_fc.bias",
                     apply=mlp_lora)
    h = h * torch.sigmoid(1.702 * h)  # QuickGELU
    h = _lora_linear(sd, h, p + "mlp.c_proj.weight", p + "mlp.c_proj.lora_A", p + "mlp.c_proj.lora_B",
                     p + "mlp.c_proj.bias", apply=mlp_lora)
    return x + h


def _pacpp_encode_image(sd, pixels, *, mlp_lora=False):
    w = sd["visual.conv1.weight"]
    w = w + (sd["visual.conv1.lora_B"] @ sd["visual.conv1.lora_A"]).view(w.shape) / R_PACPP  # lora_layers.Conv2d.forward
    x = F.conv2d(pixels, w, stride=w.shape[-1]).flatten(2).transpose(1, 2)  # (B, N, W)
    cls = sd["visual.class_embedding"].expand(x.shape[0], 1, -1)
    x = _ln(sd, "visual.ln_pre", torch.cat([cls, x], 1) + sd["visual.positional_embedding"])
    for i in range(2):
        x = _pacpp_block(sd, f"visual.transformer.resblocks.{i}.", x, 3, None, mlp_lora=mlp_lora)
    return _ln(sd, "visual.ln_post", x[:, 0]) @ sd["visual.proj"]


def _pacpp_encode_text(sd, ids, *, mlp_lora=False):
    L = ids.shape[1]
    x = sd["token_embedding.weight"][ids] + sd["positional_embedding"][:L]
    mask = torch.full((L, L), float("-inf")).triu(1)
    for i in range(2):
        x = _pacpp_block(sd, f"transformer.resblocks.{i}.", x, 2, mask, mlp_lora=mlp_lora)
    x = _ln(sd, "ln_final", x)
    return x[torch.arange(x.shape[0]), ids.argmax(-1)] @ sd["text_projection"]


def test_pacpp_full_layout_matches_pacscore_forward(ref):
    """A random capscore-test-tiny saved in PAC++'s full layout (non-zero factors on conv1, in_proj, out_proj,
    c_fc, c_proj of both towers) gives the vectors of pacscore's own forward; lora_mlp=merge gives loralib's
    training-time forward, and the two differ."""
    g = torch.Generator().manual_seed(7)
    sd = {k: v.clone() for k, v in ref["sd"].items()}
    r = R_PACPP

    def factor(*shape):
        return torch.randn(*shape, generator=g) * 0.3

    for tower, width, n in (("visual.transformer", 48, 2), ("transformer", 32, 2)):
        for i in range(n):
            p = f"{tower}.resblocks.{i}."
            sd[p + "attn.in_proj_weight_lora_A"], sd[p + "attn.in_proj_weight_lora_B"] = factor(r, width), factor(3 * width, r)
            sd[p + "attn.out_proj.lora_A"], sd[p + "attn.out_proj.lora_B"] = factor(r, width), factor(width, r)
            sd[p + "mlp.c_fc.lora_A"], sd[p + "mlp.c_fc.lora_B"] = factor(r, width), factor(4 * width, r)
            sd[p + "mlp.c_proj.lora_A"], sd[p + "mlp.c_proj.lora_B"] = factor(r, 4 * width), factor(width, r)
    k = sd["visual.conv1.weight"].shape[-1]
    sd["visual.conv1.lora_A"], sd["visual.conv1.lora_B"] = factor(r * k, 3 * k), factor(48 * k, r * k)
    path = ref["dir"] / "pacpp-full.pth"
    torch.save({"state_dict": sd}, path)

    ids = open_clip.get_tokenizer(ARCH)(TEXTS)  # zero-padded to 77, as pacscore's clip.tokenize
    with torch.no_grad():
        want = {m: (F.normalize(_pacpp_encode_text(sd, ids, mlp_lora=m), dim=-1),
                    F.normalize(_pacpp_encode_image(sd, ref["pixels"], mlp_lora=m), dim=-1)) for m in (False, True)}
    for spec, m in ((f"ckpt:{path}", False), (f"ckpt:{path}#lora_mlp=merge", True)):
        enc = Encoder(load_backbone(spec), batch_size=3)
        assert (enc.encode_texts(TEXTS) - want[m][0]).abs().max().item() <= TOL
        assert (enc.encode_images(ref["images"]) - want[m][1]).abs().max().item() <= TOL
    assert (want[False][0] - want[True][0]).abs().max() > 1e-2  # the MLP factors matter: the choice is visible
    with pytest.raises(CapscoreError, match="lora_mlp must be one of ignore, merge"):
        load_backbone(f"ckpt:{path}#lora_mlp=yes")


def test_save_openai_checkpoint_layouts_round_trip(ref):
    from capscore.backbones.openai_ckpt import save_openai_checkpoint

    src = load_backbone(f"ckpt:{_plain(ref)}")
    p1 = save_openai_checkpoint(src, ref["dir"] / "out-pacs.pth", layout="pacs")
    assert set(torch.load(p1, weights_only=True)) == {"state_dict"}
    p2 = save_openai_checkpoint(src, ref["dir"] / "out-long.pt", layout="longclip")
    assert "positional_embedding_res" in torch.load(p2, weights_only=True)
    p3 = save_openai_checkpoint(src, ref["dir"] / "out.safetensors")
    for p in (p1, p2, p3):
        _check_vectors(load_backbone(f"ckpt:{p}"), ref)


def _plain(ref):
    path = ref["dir"] / "plain-src.pt"
    if not path.exists():
        torch.save(ref["sd"], path)
    return path


def test_arch_option_and_quick_gelu_option(ref):
    path = _plain(ref)
    _check_vectors(load_backbone(f"ckpt:{path}#arch={ARCH}"), ref)
    gelu = load_backbone(f"ckpt:{path}#quick_gelu=0")  # same weights, exact GELU: different vectors
    assert type(gelu.model.transformer.resblocks[0].mlp.gelu) is torch.nn.GELU
    assert (Encoder(gelu).encode_texts(TEXTS) - ref["text"]).abs().max() > 1e-4
    with pytest.raises(CapscoreError, match="unknown ckpt option 'archh'; did you mean 'arch'"):
        load_backbone(f"ckpt:{path}#archh=ViT-B-32")
    with pytest.raises(CapscoreError, match="unknown open_clip architecture 'ViT-B-33'"):
        load_backbone(f"ckpt:{path}#arch=ViT-B-33")


# ------------------------------------------------------------------ errors name the file
def test_checkpoint_errors_are_one_line_and_name_the_file(ref, tmp_path):
    missing = tmp_path / "nope.pt"
    with pytest.raises(CapscoreError, match=r"nope\.pt: checkpoint file not found"):
        load_backbone(f"ckpt:{missing}")
    text = tmp_path / "notes.pt"
    text.write_text("hello, not a checkpoint\n")
    with pytest.raises(CapscoreError, match=r"notes\.pt: not a PyTorch checkpoint"):
        load_backbone(str(text))
    bad_st = tmp_path / "junk.safetensors"
    bad_st.write_bytes(b"\x00\x01garbage")
    with pytest.raises(CapscoreError, match=r"junk\.safetensors: not a readable safetensors file"):
        load_backbone(f"ckpt:{bad_st}")
    pickled = tmp_path / "pickled.pt"
    torch.save({"args": argparse.Namespace(lr=1), "w": torch.zeros(1)}, pickled)
    with pytest.raises(CapscoreError, match=r"pickled\.pt: holds pickled Python objects.*weights_only=True"):
        load_backbone(f"ckpt:{pickled}")
    other = tmp_path / "resnet.pt"
    torch.save({"fc.weight": torch.zeros(2, 2)}, other)
    with pytest.raises(CapscoreError, match=r"resnet\.pt: not an OpenAI-format CLIP state dict"):
        load_backbone(f"ckpt:{other}")
    hf_like = tmp_path / "pytorch_model.bin"
    torch.save({"text_model.embeddings.token_embedding.weight": torch.zeros(2, 2)}, hf_like)
    with pytest.raises(CapscoreError, match=r"pytorch_model\.bin: .*use.*hf:DIR|hf:DIR"):
        load_backbone(str(hf_like))
    for err in [missing, text, pickled, other]:
        try:
            load_backbone(f"ckpt:{err}")
        except CapscoreError as e:
            assert "\n" not in str(e)


def test_hf_errors_name_the_folder(tmp_path):
    with pytest.raises(CapscoreError, match=r"no_such_model_dir: Hugging Face model folder not found"):
        load_backbone(f"hf:{tmp_path / 'no_such_model_dir'}")
    empty = tmp_path / "empty_model"
    empty.mkdir()
    with pytest.raises(CapscoreError, match=r"empty_model: not a Hugging Face model folder \(no config\.json\)"):
        load_backbone(f"hf:{empty}")
    with pytest.raises(CapscoreError, match=r"hf:someorg/not-cached-model: cannot load the model config"):
        load_backbone("hf:someorg/not-cached-model")  # HF_HUB_OFFLINE=1 in tests
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(CapscoreError, match=r"model type 'bert' is not supported by hf:.*--trust-remote-code"):
        load_backbone(f"hf:{bert}")


def test_hf_rejects_longer_context(ref):
    from capscore.backbones.hf_convert import save_open_clip_as_hf

    folder = ref["dir"] / "hf"
    if not folder.exists():
        save_open_clip_as_hf(load_backbone(f"ckpt:{_plain(ref)}"), folder)
    with pytest.raises(CapscoreError, match="has 77 positions; cannot use a context of 248"):
        load_backbone(f"hf:{folder}", context_length=248)


# ------------------------------------------------------------------ tokenizer files
def test_clip_tokenizer_files_match_open_clip(tmp_path):
    from transformers import CLIPTokenizer

    from capscore.backbones.hf_convert import write_clip_tokenizer_files

    folder = write_clip_tokenizer_files(tmp_path / "tok")
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    assert len(vocab) == 49408
    assert vocab["!"] == 0 and vocab["!</w>"] == 256  # byte chars, then the same with </w>
    assert vocab["<|startoftext|>"] == 49406 and vocab["<|endoftext|>"] == 49407
    merges = (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
    assert merges[0].startswith("#version") and len(merges) == 1 + 48894
    assert vocab["".join(merges[1].split())] == 512  # first merge follows the 512 single-char entries
    hf = CLIPTokenizer.from_pretrained(str(folder))
    oc = open_clip.tokenizer.SimpleTokenizer()
    captions = TEXTS + ["Two   CATS sleeping; one is 3 years old.", "don't stop—it's fine", "café naïve résumé"]
    for c in captions:
        assert hf(c)["input_ids"] == [49406, *oc.encode(c), 49407], c


# ------------------------------------------------------------------ SigLIP
def test_siglip_folder_matches_transformers_own_forward(tmp_path):
    """A tiny random SiglipModel: capscore pads to the context with the pad token, like SigLIP."""
    from transformers import CLIPTokenizer, SiglipConfig, SiglipImageProcessor, SiglipModel

    from capscore.backbones.hf_convert import write_clip_tokenizer_files

    folder = tmp_path / "siglip"
    write_clip_tokenizer_files(folder, context_length=16)
    tok = CLIPTokenizer.from_pretrained(str(folder))
    cfg = SiglipConfig(
        text_config=dict(vocab_size=49408, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=16, pad_token_id=tok.pad_token_id),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=32, patch_size=8),
    )
    torch.manual_seed(0)
    model = SiglipModel(cfg).eval()
    model.save_pretrained(folder)
    SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    bb = load_backbone(f"hf:{folder}")
    assert bb.context_length == 16 and not bb.pad_to_longest_exact
    assert bb.has_patch_tokens and not bb.has_token_features  # patches: see test_backbones_fgclip.py
    texts = ["a dog", "two cats on a sofa"]
    rng = np.random.default_rng(1)
    images = [Image.fromarray((rng.random((32, 32, 3)) * 255).astype("uint8")) for _ in range(2)]
    inputs = tok(texts, padding="max_length", max_length=16, return_tensors="pt")
    pixels = SiglipImageProcessor(size={"height": 32, "width": 32})(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out = model(input_ids=inputs["input_ids"], pixel_values=pixels)
    enc = Encoder(bb)
    assert (enc.encode_texts(texts) - out.text_embeds).abs().max() <= TOL
    assert (enc.encode_images(images) - out.image_embeds).abs().max() <= TOL


def test_resnet_checkpoint_loads(tmp_path):
    """OpenAI's ModifiedResNet towers (RN50 family) use the same loader; tiny shapes here."""
    from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = CLIP(32, CLIPVisionCfg(layers=(1, 1, 1, 1), width=16, image_size=64),
                     CLIPTextCfg(width=64, heads=1, layers=1), quick_gelu=True).eval()
    torch.save(model.state_dict(), tmp_path / "rn.pt")
    bb = load_backbone(f"ckpt:{tmp_path / 'rn.pt'}")
    assert not bb.has_patch_tokens  # attention-pooled: no patch tokens in the joint space
    pixels = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert (bb.forward_images(pixels)[0] - model.encode_image(pixels)).abs().max() <= TOL
        expected = F.normalize(model.encode_text(open_clip.tokenize(TEXTS)), dim=-1)
    assert (Encoder(bb).encode_texts(TEXTS) - expected).abs().max() <= TOL
