"""capscore.score / score_frame: every image input kind, the prefix, refs and components, bad inputs.

Expected values are recomputed with open_clip alone (same random init), full
77-token padding and the CLIPScore formulas by hand — never with capscore.
"""
import subprocess
import sys

import numpy as np
import open_clip
import pandas as pd
import pytest
import torch
from PIL import Image

import capscore
import capscore.backbones.openclip  # noqa: F401  (registers capscore-test-tiny)
from capscore.errors import CapscoreError

MODEL = "capscore-test-tiny"
PREFIX = "A photo depicts "


@pytest.fixture(scope="module")
def ref_model():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, _, preprocess = open_clip.create_model_and_transforms(MODEL, pretrained=None)
    return model.eval(), preprocess, open_clip.get_tokenizer(MODEL)


def ref_vectors(ref_model, pil_images, texts):
    model, preprocess, tok = ref_model
    with torch.no_grad():
        im = model.encode_image(torch.stack([preprocess(p.convert("RGB")) for p in pil_images]))
        tx = model.encode_text(tok(list(texts)))
    return torch.nn.functional.normalize(im, dim=-1), torch.nn.functional.normalize(tx, dim=-1)


@pytest.fixture(scope="module")
def pixels():
    rng = np.random.default_rng(3)
    return (rng.random((3, 36, 44, 3)) * 255).astype(np.uint8)  # (N, H, W, C)


CAPS = ["a red square on a table", "two dogs in the snow", "a bowl of fruit"]


def test_import_is_light_and_has_a_version():
    code = "import sys, capscore; print(capscore.__version__); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[1] == "False"
    from importlib.metadata import version

    assert out[0] == version("capscore")


def test_clip_s_matches_open_clip_by_hand_for_every_image_kind(ref_model, pixels, tmp_path):
    pils = [Image.fromarray(a) for a in pixels]
    im, tx = ref_vectors(ref_model, pils, [PREFIX + c for c in CAPS])
    expected = 2.5 * np.maximum((im * tx).sum(-1).numpy(), 0)
    paths = []
    for i, p in enumerate(pils):
        paths.append(tmp_path / f"{i}.png")
        p.save(paths[-1])
    chw = torch.from_numpy(pixels).permute(0, 3, 1, 2)
    kinds = {
        "paths": paths, "pil": pils, "numpy batch": pixels, "numpy list": list(pixels),
        "uint8 tensor batch": chw, "float tensor list": [t.float() / 255 for t in chw],
        "float numpy": pixels.astype(np.float32) / 255,
    }
    for name, images in kinds.items():
        got = capscore.score(images, CAPS, model=MODEL)
        np.testing.assert_allclose(got, expected, atol=2e-5, err_msg=name)


def test_prefix_is_the_metrics_default_and_can_be_turned_off(ref_model, pixels):
    pils = [Image.fromarray(a) for a in pixels]
    im, tx = ref_vectors(ref_model, pils, CAPS)  # no prefix
    expected = 2.5 * np.maximum((im * tx).sum(-1).numpy(), 0)
    np.testing.assert_allclose(capscore.score(pils, CAPS, model=MODEL, prefix=""), expected, atol=2e-5)
    # mcs and abe take captions as written: their default prefix is ""
    np.testing.assert_allclose(capscore.score(pils, CAPS, model=MODEL, metric="mcs"), expected, atol=2e-5)


def test_refclip_s_with_components_and_several_candidates(ref_model, pixels):
    pils = [Image.fromarray(a) for a in pixels[:2]]
    caps = [["a red square", "a blue circle"], "two dogs"]
    refs = [["a square", "red things"], "dogs playing"]
    frame = capscore.score(pils, caps, refs, model=MODEL, metric="refclip-s", as_frame=True)
    assert list(frame["index"]) == [0, 0, 1] and list(frame["candidate"]) == [0, 1, 0]
    # by hand: H-mean(2.5 max(cos(v, c), 0), max(max_r cos(c, r), 0)), prefix on candidates and refs
    cands = ["a red square", "a blue circle", "two dogs"]
    img_of = [0, 0, 1]
    im, tx = ref_vectors(ref_model, [pils[i] for i in img_of], [PREFIX + c for c in cands])
    clip_part = 2.5 * np.maximum((im * tx).sum(-1).numpy(), 0)
    ref_part = []
    for k, i in enumerate(img_of):
        rs = [refs[i]] if isinstance(refs[i], str) else refs[i]
        _, rv = ref_vectors(ref_model, pils[:1], [PREFIX + r for r in rs])
        ref_part.append(max(float((tx[k] @ rv.T).max()), 0.0))
    ref_part = np.array(ref_part)
    hm = np.where(clip_part + ref_part > 0, 2 * clip_part * ref_part / (clip_part + ref_part + 1e-30), 0)
    np.testing.assert_allclose(frame["image_score"], clip_part, atol=2e-5)
    np.testing.assert_allclose(frame["ref_score"], ref_part, atol=2e-5)
    np.testing.assert_allclose(frame["score"], hm, atol=2e-5)


def test_several_models_and_metrics_need_as_frame(pixels):
    with pytest.raises(CapscoreError, match="as_frame=True"):
        capscore.score(pixels, CAPS, model=MODEL, metric=["clip-s", "pac-s"])
    frame = capscore.score(pixels, CAPS, model=MODEL, metric=["clip-s", "pac-s"], as_frame=True)
    clip = frame[frame.metric == "clip-s"]["score"].to_numpy()
    pac = frame[frame.metric == "pac-s"]["score"].to_numpy()
    np.testing.assert_allclose(pac, clip * 2.0 / 2.5, rtol=1e-6)  # same cosines, w = 2 vs 2.5


@pytest.mark.parametrize("bad, needle", [
    (lambda p: torch.from_numpy(p[0]), "looks channels-last"),  # torch wants (C, H, W)
    (lambda p: p[0].transpose(2, 0, 1), "looks channels-first"),  # numpy wants (H, W, C)
    (lambda p: p[0].astype(np.float32), "must be in [0, 1]"),  # 0-255 floats are ambiguous
    (lambda p: p[0].astype(np.int16), "dtype must be uint8"),
    (lambda p: p[0][None, None], "must be (H, W, C)"),
])
def test_ambiguous_arrays_are_rejected_with_a_clear_error(pixels, bad, needle):
    with pytest.raises(CapscoreError, match=needle.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        capscore.score([bad(pixels)], ["a caption"], model=MODEL)


def test_mismatched_lengths_and_unknown_metric():
    with pytest.raises(CapscoreError, match="2 images but 1 captions"):
        capscore.score(["a.png", "b.png"], ["x"], model=MODEL)
    with pytest.raises(CapscoreError, match="did you mean 'clip-s'"):
        capscore.score(["a.png"], ["x"], model=MODEL, metric="clip-z")


def test_score_frame_adds_columns_in_row_order(pixels):
    df = pd.DataFrame({"img": list(pixels), "text": CAPS, "refs": [["r one"], ["r two"], ["r three"]]})
    out = capscore.score_frame(df, "img", "text", "refs", model=MODEL, metric="refclip-s")
    assert list(out.columns[:3]) == ["img", "text", "refs"] and len(out) == 3
    direct = capscore.score(list(pixels), CAPS, [["r one"], ["r two"], ["r three"]], model=MODEL,
                            metric="refclip-s")
    np.testing.assert_allclose(out["score"], direct)
    assert {"image_score", "ref_score"} <= set(out.columns)
    with pytest.raises(CapscoreError, match="no column 'caption'"):
        capscore.score_frame(df, "img", "caption", model=MODEL)


def test_cosine_metric_is_the_plain_cosine_by_hand(ref_model, pixels):
    """The registered ``cosine``: cos(image, caption) with no weight, no clamp and no prefix."""
    pils = [Image.fromarray(a) for a in pixels]
    im, tx = ref_vectors(ref_model, pils, CAPS)
    got = capscore.score(pixels, CAPS, model=MODEL, metric="cosine")
    np.testing.assert_allclose(got, (im * tx).sum(-1).numpy(), atol=2e-5)


def test_score_batch_on_a_tensor_batch_by_hand(ref_model, pixels):
    """capscore.score_batch: the tensor-level core on an (N, C, H, W) uint8 batch, CLIP-S by hand."""
    from capscore.api import get_encoder

    pils = [Image.fromarray(a) for a in pixels]
    im, tx = ref_vectors(ref_model, pils, [PREFIX + c for c in CAPS])
    values = capscore.score_batch(get_encoder(MODEL), "clip-s", torch.from_numpy(pixels).permute(0, 3, 1, 2), CAPS)
    np.testing.assert_allclose(values.scores, 2.5 * np.maximum((im * tx).sum(-1).numpy(), 0), atol=2e-5)
    assert values.parts == {}


def test_score_batch_checks_its_arguments_once_and_names_items(pixels):
    from capscore.api import get_encoder
    from capscore.errors import InputError

    enc = get_encoder(MODEL)
    with pytest.raises(CapscoreError, match="'captions' parameter of capscore.score_batch"):
        capscore.score_batch(enc, "clip-s", pixels, CAPS[:2])
    with pytest.raises(CapscoreError, match="did you mean 'clip-s'"):
        capscore.score_batch(enc, "clip-z", pixels, CAPS)
    with pytest.raises(CapscoreError, match="does not score images"):
        capscore.score_batch(enc, "emscore", pixels, CAPS)
    with pytest.raises(CapscoreError, match="'prefix' parameter of capscore.score_batch"):
        capscore.score_batch(enc, "clip-s", pixels, CAPS, prefix=3)
    with pytest.raises(InputError, match=r"^images\[1\]: float image contains NaN"):
        capscore.score_batch(enc, "clip-s", [pixels[0], np.full((8, 8, 3), np.nan)], CAPS[:2])
    with pytest.raises(InputError, match=r"^captions\[1\]: empty caption"):
        capscore.score_batch(enc, "clip-s", pixels[:2], ["a dog", " "])
    with pytest.raises(InputError, match=r"^captions\[0\]: refclip-s needs references"):
        capscore.score_batch(enc, "refclip-s", pixels[:1], ["a dog"], [[]])


def test_score_frame_nan_refs_cell_names_its_row_or_becomes_an_error_row(pixels):
    """A missing references cell (NaN, as pandas stores it) is one line naming the row and column; with
    skip_bad that row gets an error and the other rows their own scores."""
    from capscore.errors import InputError

    df = pd.DataFrame({"img": list(pixels), "text": CAPS, "refs": [["r one"], float("nan"), ["r three"]]},
                      index=["a", "b", "c"])
    with pytest.raises(InputError, match=r"^row 1 \(index 'b'\), column 'refs': references are NaN") as e:
        capscore.score_frame(df, "img", "text", "refs", model=MODEL, metric="refclip-s")
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match=r"^refs\[1\]: references are NaN"):
        capscore.score(list(pixels), CAPS, list(df["refs"]), model=MODEL, metric="refclip-s")
    out = capscore.score_frame(df, "img", "text", "refs", model=MODEL, metric="refclip-s", skip_bad=True)
    assert out["score"].isna().tolist() == [False, True, False]
    assert out["error"].isna().tolist() == [True, False, True]
    assert out["error"]["b"].startswith("row 1 (index 'b'), column 'refs': references are NaN")
    good = capscore.score([pixels[0], pixels[2]], [CAPS[0], CAPS[2]], [["r one"], ["r three"]], model=MODEL,
                          metric="refclip-s")
    np.testing.assert_allclose(out["score"][["a", "c"]], good, atol=1e-6)
