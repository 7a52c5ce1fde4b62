"""The encoding engine: padding exactness, truncation keeping EOT, dedupe, cache."""
import warnings

import open_clip
import pytest
import torch

from capscore.embed import EmbeddingCache, Encoder
from capscore.errors import InputError


def reference_text(bb, texts):
    """What open_clip itself computes with full 77-token padding."""
    tok = open_clip.get_tokenizer("capscore-test-tiny")
    with torch.no_grad():
        return torch.nn.functional.normalize(bb.model.encode_text(tok(texts)), dim=-1)


def test_pad_to_longest_equals_full_padding(tiny_backbone):
    texts = ["a dog", "two red cubes left of a large blue sphere on the floor", "x"]
    enc = Encoder(tiny_backbone, batch_size=2)
    got = enc.encode_texts(texts)
    assert (got - reference_text(tiny_backbone, texts)).abs().max() < 1e-5


def test_long_caption_keeps_eot_and_warns_once(tiny_backbone):
    long = " ".join(["red cube"] * 60)  # > 77 tokens
    enc = Encoder(tiny_backbone)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = enc.encode_texts([long, long, "short"])
    assert sum("truncated" in str(x.message) for x in w) == 1 and enc.stats.truncated == 1
    ids = tiny_backbone.tokenize([long])[0]
    kept = ids[:76] + [ids[-1]]  # 76 tokens then EOT: the EOT vector is what gets pooled
    with torch.no_grad():
        ref = tiny_backbone.model.encode_text(torch.tensor([kept]))
    ref = torch.nn.functional.normalize(ref, dim=-1)
    assert (got[0] - ref[0]).abs().max() < 1e-5


def test_dedupe_and_persistent_cache(tiny_backbone, make_images, tmp_path):
    paths = make_images(3)
    db = tmp_path / "c"
    enc = Encoder(tiny_backbone, cache=db)
    a = enc.encode_images([paths[0], paths[1], paths[0], paths[2], paths[0]])
    t = enc.encode_texts(["a", "b", "a"])
    assert enc.stats.images_encoded == 3 and enc.stats.texts_encoded == 2
    assert torch.equal(a[0], a[2]) and torch.equal(t[0], t[2])
    enc2 = Encoder(tiny_backbone, cache=EmbeddingCache(db))
    b = enc2.encode_images(paths)
    t2 = enc2.encode_texts(["a", "b", "c"])
    assert enc2.stats.images_encoded == 0 and enc2.stats.images_cached == 3
    assert enc2.stats.texts_encoded == 1  # only the new caption
    assert torch.equal(b[1], a[1]) and torch.equal(t2[0], t[0])


def test_image_errors_name_the_file(tiny_backbone, make_images, tmp_path):
    good = make_images(1)[0]
    bad = tmp_path / "broken.png"
    bad.write_bytes(good.read_bytes()[:60])  # truncated PNG
    enc = Encoder(tiny_backbone)
    with pytest.raises(InputError, match="broken.png"):
        enc.encode_images([good, bad])
    errors = {}
    out = enc.encode_images([good, tmp_path / "missing.jpg", bad], errors=errors)
    assert set(errors) == {1, 2} and "not found" in errors[1]
    assert not torch.isnan(out[0]).any() and torch.isnan(out[1]).all()


def test_patch_and_token_features(tiny_backbone, make_images):
    enc = Encoder(tiny_backbone)
    g, p = enc.image_patches(make_images(2))
    assert p.shape == (2, 16, 32)  # 32 px / 8 px patches = 4x4
    assert torch.allclose(g, enc.encode_images(make_images(2)), atol=1e-5)
    (feat,) = enc.text_tokens(["a red cube"])
    assert feat.vectors.shape[0] == len(feat.ids) == 5 and feat.tokens[2] == "red"
    assert torch.allclose(feat.global_, enc.encode_texts(["a red cube"])[0], atol=1e-5)


def test_warm_run_reads_but_never_decodes(tiny_backbone, make_images, tmp_path, monkeypatch):
    from capscore.data.images import ImageRef

    paths = make_images(4)
    Encoder(tiny_backbone, cache=tmp_path / "c").encode_images(paths)
    calls = []
    real = ImageRef.decode
    monkeypatch.setattr(ImageRef, "decode", lambda self, payload: calls.append(1) or real(self, payload))
    warm = Encoder(tiny_backbone, cache=tmp_path / "c")
    warm.encode_images(paths)
    assert warm.stats.images_cached == 4 and calls == []
    paths[0].write_bytes(make_images(1, seed=7, folder="other")[0].read_bytes())  # content changed
    again = Encoder(tiny_backbone, cache=tmp_path / "c")
    again.encode_images(paths)
    assert again.stats.images_encoded == 1 and len(calls) == 1  # keyed on bytes, not on the path


def test_cache_path_expands_user(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    c = EmbeddingCache("~/capscore-cache")
    assert c.path == tmp_path / "capscore-cache" / "embeddings.sqlite" and c.path.exists()


# ---------------------------------------------------------------- palette images: the reference scripts' order
def test_palette_png_reference_rgb_order(tmp_path):
    import numpy as np
    from PIL import Image

    """clipscore.py / pacscore resize + crop *before* convert('RGB'); PIL then resizes a palette (mode P)
    image with nearest-neighbour. rgb_order='after-crop' reproduces that order, 'first' (default) converts
    first; the two give different vectors and never share cache entries."""
    import numpy as np
    import open_clip
    import torchvision.transforms as T
    from PIL import Image

    import capscore.backbones.openclip  # noqa: F401  (registers capscore-test-tiny)
    from capscore.backbones import load_backbone
    from capscore.embed.engine import Encoder

    rng = np.random.default_rng(0)
    path = tmp_path / "palette.png"
    Image.fromarray((rng.random((45, 60, 3)) * 255).astype("uint8")).quantize(16).save(path)
    assert Image.open(path).mode == "P"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = open_clip.create_model("capscore-test-tiny", pretrained=None).eval()
    norm = T.Normalize((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))
    resize = [T.Resize(32, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(32)]
    reference = T.Compose([*resize, lambda im: im.convert("RGB"), T.ToTensor(), norm])  # clipscore.py's _transform
    convert_first = T.Compose([lambda im: im.convert("RGB"), *resize, T.ToTensor(), norm])
    with torch.no_grad():
        want = {o: torch.nn.functional.normalize(model.encode_image(t(Image.open(path))[None]), dim=-1)[0]
                for o, t in (("after-crop", reference), ("first", convert_first))}
    assert (want["after-crop"] - want["first"]).abs().max() > 1e-3  # the order matters for palette images
    cache = tmp_path / "cache.sqlite"
    for order in ("first", "after-crop"):
        bb = load_backbone("capscore-test-tiny", seed=0, rgb_order=order)
        enc = Encoder(bb, cache=cache)
        assert (enc.encode_images([path])[0] - want[order]).abs().max() <= 1e-5, order
        assert (enc.image_patches([path])[0][0] - want[order]).abs().max() <= 1e-5, order
    assert load_backbone("capscore-test-tiny", rgb_order="after-crop").identity.endswith("|rgb=after-crop")


def test_raw_vectors_are_the_projections_before_normalisation_and_share_one_forward(tiny_backbone, make_images,
                                                                                   tmp_path):
    """raw=True gives open_clip's own encode_image / encode_text outputs (not normalised); with keep_raw, the
    forward of a normalised request also stores them, so a raw request after it encodes nothing, in memory
    and in the persistent cache (a second encoder on the same file)."""
    paths = make_images(3)
    texts = ["a dog", "two red cubes on the floor"]
    enc = Encoder(tiny_backbone, cache=EmbeddingCache(tmp_path / "c"))
    enc.keep_raw = True
    unit_i, unit_t = enc.encode_images(paths + paths[:1]), enc.encode_texts(texts)
    assert enc.stats.images_encoded == 3 and enc.stats.texts_encoded == 2
    raw_i, raw_t = enc.encode_images(paths + paths[:1], raw=True), enc.encode_texts(texts, raw=True)
    assert enc.stats.images_encoded == 3 and enc.stats.texts_encoded == 2  # nothing encoded again
    from PIL import Image

    with torch.no_grad():
        px = torch.stack([tiny_backbone.preprocess(Image.open(p).convert("RGB")) for p in paths])
        want_i = tiny_backbone.model.encode_image(px)
        want_t = tiny_backbone.model.encode_text(open_clip.get_tokenizer("capscore-test-tiny")(texts))
    assert (raw_i[:3] - want_i).abs().max() < 1e-5 and torch.equal(raw_i[3], raw_i[0])
    assert (raw_t - want_t).abs().max() < 1e-5
    assert not torch.allclose(raw_i.norm(dim=-1), torch.ones(4))  # really before normalisation
    assert (torch.nn.functional.normalize(raw_i, dim=-1) - unit_i).abs().max() < 1e-6
    assert (torch.nn.functional.normalize(raw_t, dim=-1) - unit_t).abs().max() < 1e-6
    later = Encoder(tiny_backbone, cache=EmbeddingCache(tmp_path / "c"))
    assert torch.equal(later.encode_images(paths, raw=True), raw_i[:3]) and later.stats.images_encoded == 0


def test_a_raw_request_first_also_fills_the_normalised_cache(tiny_backbone, make_images):
    paths = make_images(2)
    enc = Encoder(tiny_backbone)
    raw = enc.encode_images(paths, raw=True)
    unit = enc.encode_images(paths)
    assert enc.stats.images_encoded == 2 and enc.stats.images_cached == 2
    assert (torch.nn.functional.normalize(raw, dim=-1) - unit).abs().max() < 1e-6
    with pytest.raises(ValueError, match="raw=True gives global projections only"):
        enc.encode_images(paths, raw=True, patches=True)
