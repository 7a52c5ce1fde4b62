"""Polos and DENEB: the head arithmetic by hand, the released checkpoint layouts read strictly, and each
metric's forward against an independent reconstruction of the authors' forward (written here from
PolosEstimator.forward / DenebEstimator.forward with transformers, open_clip and torch.nn modules).

Parity with the authors' own code (run from their repositories) is measured by
benchmarks/learned_throughput.py, which needs their code and is not part of the test run.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

import learned_weights as lw
from capscore.backbones.sentence import SentenceFeatures
from capscore.errors import CapscoreError


@pytest.fixture(scope="module")
def wdir(tmp_path_factory):
    return lw.weights_dir(tmp_path_factory.mktemp("metric-weights"), polos=True, deneb=True)


@pytest.fixture(scope="module")
def polos(wdir):
    from capscore.scores.polos import load_polos

    return load_polos(wdir)


@pytest.fixture(scope="module")
def deneb(wdir):
    from capscore.scores.deneb import load_deneb

    return load_deneb(wdir, clip_arch="capscore-test-tiny")


def images(n, seed=0):
    rng = np.random.default_rng(seed)
    return [Image.fromarray((rng.random((36 + 4 * i, 44, 3)) * 255).astype("uint8")) for i in range(n)]


CAPS = ["a dog runs on the grass", "two cats sleep", "a man rides a bike in the street"]
REFS = [["a dog runs", "a dog on grass"], ["cats sleep on a red sofa"], ["a man on a bike", "a bike", "the street"]]


# ------------------------------------------------------------------------------------ hand-checked arithmetic
def features(tokens_per_layer: list[list[list[float]]]) -> SentenceFeatures:
    """One sentence: per layer, its tokens' hidden values (the first token first)."""
    h = torch.tensor(tokens_per_layer, dtype=torch.float64)  # (L, T, D)
    return SentenceFeatures(h[None, :, 0, :].float(), h.sum((1, 2))[None], (h * h).sum((1, 2))[None],
                            torch.tensor([h.shape[1] * h.shape[2]], dtype=torch.float64))


def test_scalar_mix_by_hand():
    from capscore.scores.polos import ScalarMix, mix_layers

    f = features([[[1, 3], [5, 7]], [[2, 2], [2, 6]]])
    # layer 0: mean 4, variance 84/4 - 16 = 5; layer 1: mean 3, variance 48/4 - 9 = 3
    # softmax([0, ln 3]) = (1/4, 3/4); gamma 2
    want = [2 * (0.25 * (1 - 4) / math.sqrt(5) + 0.75 * (2 - 3) / math.sqrt(3)),
            2 * (0.25 * (3 - 4) / math.sqrt(5) + 0.75 * (2 - 3) / math.sqrt(3))]
    got = mix_layers(f, ScalarMix(torch.tensor([0.0, math.log(3)]), torch.tensor(2.0)))
    assert got[0].tolist() == pytest.approx(want, abs=1e-6)


def test_scalar_mix_batch_statistics_pool_every_value_of_the_batch():
    from capscore.scores.polos import ScalarMix, mix_layers

    a = features([[[1.0, 3.0]]])  # one layer; one token each
    b = features([[[5.0, 7.0]]])
    both = SentenceFeatures.cat([a, b])
    mix = ScalarMix(torch.tensor([0.0]), torch.tensor(1.0))
    # pooled over the batch: values 1, 3, 5, 7 -> mean 4, variance 5 (the authors' _do_layer_norm)
    got = mix_layers(both, mix, layer_norm="batch")
    assert got.flatten().tolist() == pytest.approx([-3 / math.sqrt(5), -1 / math.sqrt(5), 1 / math.sqrt(5),
                                                    3 / math.sqrt(5)], abs=1e-6)
    # per sentence: each normalised by its own two values -> (-1, 1)
    assert mix_layers(both, mix).flatten().tolist() == pytest.approx([-1, 1, -1, 1], abs=1e-5)


def test_polos_head_by_hand():
    """D = E = 1: x has ten entries in the order of PolosEstimator.forward; the MLP is
    W3 tanh(W2 tanh(I x)) with W2 = (1..10)/20, W3 = 1; the score is max over references of its sigmoid."""
    from capscore.scores.polos import Features, PolosHead, ScalarMix, polos_head

    up, down = features([[[2.0], [0.0]]]), features([[[0.0], [2.0]]])  # mix -> +1 and -1 (ε aside)
    cand = up
    refs = SentenceFeatures.cat([down, up])
    head = PolosHead(ScalarMix(torch.tensor([0.0]), torch.tensor(1.0)),
                     ((torch.eye(10), torch.zeros(10)), (torch.arange(1.0, 11.0)[None] / 20, torch.zeros(1)),
                      (torch.ones(1, 1), torch.zeros(1))))
    v, c_v, r_v = 0.5, -0.2, [0.3, 0.9]
    feats = Features(cand, refs, torch.tensor([[0, 1]]), torch.tensor([[v]]), torch.tensor([[c_v]]),
                     torch.tensor([[r_v[0]], [r_v[1]]]))

    def by_hand(c_s, r_s, rv):
        x = [r_s, c_s, abs(c_s - r_s), c_s * r_s, v, c_v, abs(v - c_v), v * c_v, abs(rv - c_v), rv * c_v]
        return 1 / (1 + math.exp(-math.tanh(sum((k + 1) / 20 * math.tanh(xk) for k, xk in enumerate(x)))))

    want = max(by_hand(1, -1, r_v[0]), by_hand(1, 1, r_v[1]))
    assert float(polos_head(feats, head)[0]) == pytest.approx(want, abs=1e-5)
    only_first = Features(cand, refs, torch.tensor([[0, -1]]), feats.image, feats.cand_clip, feats.ref_clip)
    assert float(polos_head(only_first, head)[0]) == pytest.approx(by_hand(1, -1, r_v[0]), abs=1e-5)
    none = Features(cand, refs, torch.tensor([[-1, -1]]), feats.image, feats.cand_clip, feats.ref_clip)
    assert math.isnan(float(polos_head(none, head)[0]))


def test_deneb_encoder_layer_is_torch_transformer_encoder_layer():
    from capscore.scores.deneb import LAYER_KEYS, EncoderLayer, encoder_layer

    torch.manual_seed(0)
    ref = torch.nn.TransformerEncoderLayer(d_model=16, nhead=8, dim_feedforward=32, batch_first=True).eval()
    p = EncoderLayer(*(ref.state_dict()[k] for k in LAYER_KEYS))
    x = torch.randn(3, 5, 16)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
    with torch.no_grad():
        want = ref(x)
        want_pad = ref(x, src_key_padding_mask=pad)
    assert torch.allclose(encoder_layer(x, p), want, atol=1e-5)
    got = encoder_layer(x, p, pad=pad)
    assert torch.allclose(got[~pad], want_pad[~pad], atol=1e-5)  # padded positions' outputs are not used


# ------------------------------------------------------------------------------------ the released layouts
def test_polos_checkpoint_loads_strictly_from_a_lightning_file(wdir, polos):
    head = polos.head
    assert head.mix.weights.shape == (3,)  # embeddings + 2 layers
    assert [tuple(w.shape) for w, _ in head.linears] == [(24, 4 * 32 + 6 * 32), (12, 24), (1, 12)]
    assert head.activation == "tanh" and head.final_activation is None
    assert polos.clip.embed_dim == 32 and polos.sentence.name == "sup-simcse-roberta-base"


def test_polos_checkpoint_as_safetensors(tmp_path, wdir):
    from safetensors.torch import save_file

    from capscore.scores.polos import load_polos, read_polos

    sd, _ = __import__("capscore.backbones.released", fromlist=["x"]).read_checkpoint(wdir / "polos" / "reprod.ckpt")
    (tmp_path / "polos").mkdir()
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "polos" / "polos.safetensors"))
    (tmp_path / "sup-simcse-roberta-base").symlink_to(wdir / "sup-simcse-roberta-base")
    head, _, _ = read_polos(tmp_path / "polos" / "polos.safetensors")
    assert torch.equal(head.linears[0][0], read_polos(wdir / "polos" / "reprod.ckpt")[0].linears[0][0])
    assert load_polos(tmp_path).head.mix.weights.shape == (3,)


@pytest.mark.parametrize("change, message", [
    (lambda sd: sd.pop("scalar_mix.gamma"), "missing tensor 'scalar_mix.gamma'"),
    (lambda sd: sd.__setitem__("extra.weight", torch.zeros(1)), "unexpected tensor 'extra.weight'"),
    (lambda sd: sd.__setitem__("ff.0.ff.linear_2.weight", torch.zeros(12, 25)), "'ff.0.ff.linear_2.weight' has shape (12, 25)"),
    (lambda sd: sd.__setitem__("scalar_mix.scalar_parameters.3", torch.zeros(1)), "unexpected tensor 'scalar_mix.scalar_parameters.3'"),
])
def test_polos_layout_errors_name_the_file_and_tensor(tmp_path, wdir, change, message):
    from capscore.backbones.released import read_checkpoint
    from capscore.scores.polos import read_polos

    sd, hp = read_checkpoint(wdir / "polos" / "reprod.ckpt")
    change(sd)
    path = lw.save_lightning(tmp_path / "bad.ckpt", sd, hp)
    with pytest.raises(CapscoreError) as e:
        read_polos(path)
    assert message in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_wrong_checkpoint_for_the_metric(wdir):
    from capscore.scores.deneb import read_deneb
    from capscore.scores.polos import read_polos

    with pytest.raises(CapscoreError, match="not a Polos checkpoint"):
        read_polos(wdir / "deneb" / "deneb.ckpt")
    with pytest.raises(CapscoreError, match="not a DENEB checkpoint"):
        read_deneb(wdir / "polos" / "reprod.ckpt")


def test_absent_weights_name_the_file_and_where_it_is_published(tmp_path):
    from capscore.scores.deneb import load_deneb
    from capscore.scores.polos import load_polos

    with pytest.raises(CapscoreError) as e:
        load_polos(tmp_path)
    msg = str(e.value)
    assert "polos/reprod.ckpt not found" in msg and "polos-polaris.s3" in msg and "\n" not in msg
    with pytest.raises(CapscoreError, match="--metric-weights DIR"):
        load_polos(None)
    with pytest.raises(CapscoreError, match="deneb/deneb.ckpt not found.*no public release"):
        load_deneb(tmp_path)


def test_a_pickle_with_foreign_objects_is_refused(tmp_path):
    import collections

    from capscore.backbones.released import read_checkpoint

    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {"w": torch.ones(1)}, "x": collections.UserDict(a=1)}, path)
    with pytest.raises(CapscoreError, match="holds Python objects besides tensors .collections.UserDict"):
        read_checkpoint(path)


def test_hparams_outside_the_released_configuration_are_refused(tmp_path, wdir):
    from capscore.backbones.released import read_checkpoint
    from capscore.scores.polos import read_polos

    sd, hp = read_checkpoint(wdir / "polos" / "reprod.ckpt")
    path = lw.save_lightning(tmp_path / "avg.ckpt", sd, {**hp, "pool": "avg"})
    with pytest.raises(CapscoreError, match="pool is 'avg'"):
        read_polos(path)


def test_deneb_checkpoint_loads_strictly(deneb):
    h = deneb.head
    assert len(h.layers1) == len(h.layers2) == 3 and h.pe1.shape == (1000, 64)
    assert [tuple(w.shape) for w, _ in h.linears] == [(24, 6 * 32), (12, 24), (1, 12)]


# ------------------------------------------------------------------------------------ forwards vs a reconstruction
def reference_sentence_vectors(model, texts, scope="sentence"):
    """SimCSE scalar mix as Estimator.get_sentence_embedding does it, with transformers' RobertaModel."""
    enc = model.sentence
    mix = model.head.mix
    rows = [enc.tokenizer(t)["input_ids"] for t in texts]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), enc.tokenizer.pad_token_id)
    mask = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    with torch.no_grad():
        layers = enc.model(input_ids=ids, attention_mask=mask.long(), output_hidden_states=True).hidden_states
    w = torch.softmax(mix.weights, 0)
    out = torch.zeros(len(rows), layers[0].shape[-1])
    for k, h in enumerate(layers):
        if scope == "batch":
            m = mask[..., None].expand_as(h)
            mean = (h * m).sum() / m.sum()
            var = (((h - mean) * m) ** 2).sum() / m.sum()
            out += w[k] * ((h[:, 0] - mean) / torch.sqrt(var + 1e-12))
        else:
            for i in range(len(rows)):
                vals = h[i, : int(mask[i].sum())]
                mean, var = vals.mean(), ((vals - vals.mean()) ** 2).mean()
                out[i] += w[k] * ((h[i, 0] - mean) / torch.sqrt(var + 1e-12))
    return mix.gamma * out


def reference_clip(model, imgs, texts, prefix, mean_std=None):
    import open_clip

    bb = model.clip
    net = bb.model
    size = net.visual.image_size
    size = size[0] if isinstance(size, (tuple, list)) else size
    mean, std = mean_std or (open_clip.OPENAI_DATASET_MEAN, open_clip.OPENAI_DATASET_STD)
    tf = open_clip.image_transform(size, is_train=False, mean=mean, std=std)
    tok = open_clip.tokenizer.SimpleTokenizer()
    with torch.no_grad():
        v = net.encode_image(torch.stack([tf(im.convert("RGB")) for im in imgs]))
        t = net.encode_text(tok([prefix + x for x in texts]))
    return v, t


def test_sentence_features_are_those_of_each_sentence_alone(polos):
    texts = ["a dog", "two cats sleep on a red sofa in the sun", "a man rides a bike"]
    together = polos.sentence.encode(texts)
    for i, t in enumerate(texts):
        alone = polos.sentence.encode([t])
        assert torch.allclose(together.first[i], alone.first[0], atol=1e-5)
        assert torch.allclose(together.sums[i], alone.sums[0], rtol=1e-6, atol=1e-4)
        assert float(together.counts[i]) == len(polos.sentence.tokenizer(t)["input_ids"]) * 32


@pytest.mark.parametrize("scope", ["sentence", "batch"])
def test_polos_matches_a_reconstruction_of_the_authors_forward(polos, scope):
    from capscore.scores.polos import mlp, score_polos

    imgs = images(3)
    got = score_polos(polos, imgs, CAPS, REFS, layer_norm=scope, batch_size=8)
    r = min(map(len, REFS)) if scope == "batch" else None
    v, c_v = reference_clip(polos, imgs, CAPS, "A photo depicts ")
    c_s = reference_sentence_vectors(polos, CAPS, scope)
    want = []
    for i in range(3):
        refs = REFS[i][:r] if r else REFS[i]
        _, r_v = reference_clip(polos, imgs[:1], refs, "A photo depicts ")
        scores = []
        for j, ref in enumerate(refs):
            if scope == "batch":  # column j of the batch: the j-th reference of every item, normalised together
                r_s = reference_sentence_vectors(polos, [REFS[k][j] for k in range(3)], "batch")[i]
            else:
                r_s = reference_sentence_vectors(polos, [ref])[0]
            x = torch.cat([r_s, c_s[i], (c_s[i] - r_s).abs(), c_s[i] * r_s, v[i], c_v[i], (v[i] - c_v[i]).abs(),
                           v[i] * c_v[i], (r_v[j] - c_v[i]).abs(), r_v[j] * c_v[i]])
            scores.append(float(torch.sigmoid(mlp(x[None], polos.head.linears, "tanh"))))
        want.append(max(scores))
    assert got == pytest.approx(want, abs=2e-5)


def test_polos_scores_repeated_and_shared_inputs_once(polos):
    """Rows repeating a (image, caption) pair and references shared by an image's captions are encoded once;
    each row's score equals the score of the row alone."""
    from capscore.scores.polos import score_polos

    imgs = images(2)
    rows = [(imgs[0], CAPS[0], REFS[0]), (imgs[0], CAPS[0], REFS[0]), (imgs[0], CAPS[1], REFS[0]), (imgs[1], CAPS[2], REFS[2])]
    calls = []
    real = polos.sentence.encode
    polos.sentence.encode = lambda texts, **k: calls.append(list(texts)) or real(texts, **k)
    try:
        got = score_polos(polos, *map(list, zip(*rows)))
    finally:
        polos.sentence.encode = real
    assert calls == [list(dict.fromkeys([CAPS[0], CAPS[1], CAPS[2], *REFS[0], *REFS[2]]))]
    alone = [score_polos(polos, [im], [c], [r])[0] for im, c, r in rows]
    assert got == pytest.approx(alone, abs=1e-6) and got[0] == got[1]


def test_deneb_matches_a_reconstruction_of_the_authors_forward(deneb, wdir):
    """DenebEstimator.forward with torch.nn.TransformerEncoder modules loaded from the checkpoint, item by
    item (each item with all its references)."""
    from capscore.backbones.released import read_checkpoint
    from capscore.scores.deneb import CLIP_MEAN_STD, score_deneb

    sd, _ = read_checkpoint(wdir / "deneb" / "deneb.ckpt")
    d = 32

    def module(prefix):
        layer = torch.nn.TransformerEncoderLayer(d_model=2 * d, nhead=8, batch_first=True)
        m = torch.nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False).eval()
        m.load_state_dict({k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)})
        return m

    t1, t2 = module("transformer."), module("transformer2.")
    up = lambda x: x @ sd["upsampler.weight"].T + sd["upsampler.bias"]  # noqa: E731
    up2 = lambda x: x @ sd["upsampler2.weight"].T + sd["upsampler2.bias"]  # noqa: E731
    imgs = images(3, seed=4)
    got = score_deneb(deneb, imgs, CAPS, REFS)
    v, c_v = reference_clip(deneb, imgs, CAPS, "In the image, ", CLIP_MEAN_STD)
    c_s = reference_sentence_vectors(deneb, CAPS)
    want = []
    with torch.no_grad():
        for i in range(3):
            _, r_v = reference_clip(deneb, imgs[:1], REFS[i], "In the image, ", CLIP_MEAN_STD)
            r_s = reference_sentence_vectors(deneb, REFS[i])
            x3 = torch.cat([up((v[i] - c_v[i]).abs()), up(v[i] * c_v[i])])
            x1 = torch.stack([x3] + [torch.cat([up((r - c_v[i]).abs()), up(r * c_v[i])]) for r in r_v])
            x2 = torch.stack([torch.cat([up2((c_s[i] - r).abs()), up2(c_s[i] * r)]) for r in r_s])
            x1 = torch.cat([sd["cls_token1"][0], x1]) + sd["pos_encoder.pe"][: len(x1) + 1, 0]
            x2 = torch.cat([sd["cls_token2"][0], x2]) + sd["pos_encoder2.pe"][: len(x2) + 1, 0]
            x = torch.cat([t1(x1[None])[0, 0], t2(x2[None])[0, 0], x3])
            for k in (1, 2, 3):
                x = x @ sd[f"ff.0.ff.linear_{k}.weight"].T + sd[f"ff.0.ff.linear_{k}.bias"]
                x = torch.tanh(x) if k < 3 else torch.sigmoid(x)
            want.append(float(x))
    assert got == pytest.approx(want, abs=2e-5)


def test_deneb_batch_statistics_use_the_fewest_references_of_the_batch(deneb):
    """layer_norm='batch' follows the authors' collate: with items of 2, 1 and 3 references, each item is
    scored on its first reference only."""
    from capscore.scores.deneb import score_deneb

    imgs = images(3, seed=4)
    full = score_deneb(deneb, imgs, CAPS, REFS, layer_norm="batch")
    first_only = score_deneb(deneb, imgs, CAPS, [r[:1] for r in REFS], layer_norm="batch")
    assert full == pytest.approx(first_only, abs=1e-6)
    assert score_deneb(deneb, imgs, CAPS, REFS) != pytest.approx(score_deneb(deneb, imgs, CAPS, [r[:1] for r in REFS]))


def test_reference_free_items_get_nan(polos, deneb):
    from capscore.scores.deneb import score_deneb
    from capscore.scores.polos import score_polos

    imgs = images(2)
    for score, model in ((score_polos, polos), (score_deneb, deneb)):
        out = score(model, imgs, CAPS[:2], [REFS[0], []])
        assert not math.isnan(out[0]) and math.isnan(out[1])


def test_layer_norm_parameter_is_checked(polos):
    from capscore.scores.polos import score_polos

    with pytest.raises(CapscoreError, match="The 'layer_norm' parameter of run_head must be one of"):
        score_polos(polos, images(1), CAPS[:1], REFS[:1], layer_norm="token")


def test_polos_can_use_a_capscore_backbone_with_the_same_weights(wdir, polos):
    """The CLIP tower may come from capscore's backbone loader (shared with CLIP-S in one run)."""
    from capscore.backbones import load_backbone
    from capscore.backbones.released import read_checkpoint
    from capscore.scores.polos import load_polos, score_polos

    sd, _ = read_checkpoint(wdir / "polos" / "reprod.ckpt")
    path = wdir / "clip-only.pt"
    torch.save({k[len("clip."):]: v for k, v in sd.items() if k.startswith("clip.")}, path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bb = load_backbone(f"capscore-test-tiny/{path}")
    shared = load_polos(wdir, clip=bb)
    imgs = images(2)
    assert score_polos(shared, imgs, CAPS[:2], REFS[:2]) == pytest.approx(score_polos(polos, imgs, CAPS[:2], REFS[:2]),
                                                                          abs=1e-6)


def test_same_vectors_tells_towers_apart_by_weights_activation_and_transform(wdir):
    """One state dict as a QuickGELU and as a GELU tower, or with OpenAI's and with (0.5, 0.5, 0.5)
    normalisation, gives other vectors; the same tower built twice gives the same ones."""
    from capscore.backbones.base import same_vectors
    from capscore.backbones.openai_ckpt import backbone_from_state_dict
    from capscore.backbones.released import read_checkpoint

    sd, _ = read_checkpoint(wdir / "polos" / "reprod.ckpt")
    clip = {k[len("clip."):]: v for k, v in sd.items() if k.startswith("clip.")}

    def build(**kw):
        return backbone_from_state_dict(clip, spec="t", where="t", **kw)

    a = build(quick_gelu=True)
    assert same_vectors(a, build(quick_gelu=True))
    assert not same_vectors(a, build(quick_gelu=False))
    assert not same_vectors(a, build(quick_gelu=True, mean_std=((0.5,) * 3, (0.5,) * 3)))
    other = {k: v + 0.01 if k == "visual.proj" else v for k, v in clip.items()}
    assert not same_vectors(a, backbone_from_state_dict(other, spec="t", where="t", quick_gelu=True))


@pytest.mark.slow  # two ViT-B/32 builds and their weights hashes
@pytest.mark.parametrize("arch, shared", [("ViT-B-32-quickgelu", True), ("ViT-B-32", False)])
def test_polos_tower_from_a_state_dict_is_shared_only_with_the_quickgelu_vit_b_32(arch, shared):
    """Polos's checkpoint tower (OpenAI's ViT-B/32: QuickGELU, inferred from an OpenAI-layout state dict) and
    open_clip's ViT-B/32 with the same tensors: one encoder for the QuickGELU build, two for the GELU one."""
    from capscore.backbones import load_backbone
    from capscore.backbones.base import same_vectors
    from capscore.backbones.openai_ckpt import backbone_from_state_dict

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = load_backbone(arch, seed=0)
    tower = backbone_from_state_dict({k: v.clone() for k, v in run.model.state_dict().items()},
                                     spec="polos:reprod.ckpt#clip", where="reprod.ckpt (clip.*)")
    assert same_vectors(run, tower) is shared
