"""The SPECS score: the authors' README formula max((cos + 1)/2, 0), no prefix, the default for SPECS checkpoints.

Expected values are computed here with open_clip alone (the same random init as the checkpoint written by
the test) and the formula written out by hand.
"""
import json

import numpy as np
import pytest
import torch
from PIL import Image

from capscore.cli import main
from capscore.pipeline import default_metric
from capscore.scores.metric import get_metric
from capscore.scores.specs import is_specs_checkpoint, specs_score

MODEL = "capscore-test-tiny"


def cosines(tiny_open_clip, paths, texts) -> np.ndarray:
    model, preprocess, tok = tiny_open_clip
    with torch.no_grad():
        im = model.encode_image(torch.stack([preprocess(Image.open(p).convert("RGB")) for p in paths]))
        tx = model.encode_text(tok(list(texts)))
    im, tx = im / im.norm(dim=-1, keepdim=True), tx / tx.norm(dim=-1, keepdim=True)
    return (im * tx).sum(-1).double().numpy()


@pytest.fixture
def data(tmp_path, make_images):
    paths = make_images(4)
    caps = {f"img{i}": f"a {c} square with a dotted border" for i, c in enumerate(["red", "green", "blue", "grey"])}
    (tmp_path / "caps.json").write_text(json.dumps(caps))
    return paths, caps


@pytest.fixture
def specs_ckpt(tmp_path, tiny_backbone):
    """capscore-test-tiny's weights in LongCLIP's layout, under the authors' release name ``spec.pt``."""
    from capscore.backbones.openai_ckpt import save_openai_checkpoint

    return save_openai_checkpoint(tiny_backbone, tmp_path / "ckpts" / "spec.pt", layout="longclip")


def _rows(path):
    return [json.loads(line) for line in open(path)]


def test_formula_by_hand_on_unit_vectors():
    # cos = 1, 0.2, -0.6, -1 -> (cos + 1)/2 = 1, 0.6, 0.2, 0: a negative cosine is not cut to 0 (CLIP-S would)
    a = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    b = torch.tensor([[1.0, 0.0], [0.2, 0.96 ** 0.5], [-0.6, 0.8], [-1.0, 0.0]])
    assert specs_score(a, b).tolist() == pytest.approx([1.0, 0.6, 0.2, 0.0], abs=1e-6)
    row = get_metric("specs")
    assert row.prefix == "" and row.range == (0.0, 1.0) and row.needs() == frozenset({"global"})


def test_cli_metric_specs_equals_the_formula_by_hand(tmp_path, data, tiny_open_clip, capsys):
    paths, caps = data
    out = tmp_path / "o.jsonl"
    argv = ["score", "--model", MODEL, "--metric", "specs", "--images", paths[0].parent,
            "--captions", tmp_path / "caps.json", "--out", out, "--cache-dir", tmp_path / "cache"]
    assert main([str(a) for a in argv]) == 0
    # other weights than a SPECS checkpoint: computed, with a warning naming the model
    assert f"{MODEL}#seed=0 does not look like a SPECS checkpoint" in capsys.readouterr().err
    got = _rows(out)
    cos = cosines(tiny_open_clip, paths, caps.values())  # the plain captions: SPECS prepends nothing
    np.testing.assert_allclose([r["score"] for r in got], np.maximum((cos + 1) / 2, 0), atol=1e-5)
    assert {r["metric"] for r in got} == {"specs"}


def test_a_specs_checkpoint_is_scored_with_specs_by_default(tmp_path, data, tiny_open_clip, specs_ckpt, capsys):
    paths, caps = data
    out = tmp_path / "d.jsonl"
    argv = ["score", "--model", f"ckpt:{specs_ckpt}", "--images", paths[0].parent,
            "--captions", tmp_path / "caps.json", "--out", out, "--cache-dir", tmp_path / "cache"]
    assert main([str(a) for a in argv]) == 0
    assert "SPECS checkpoint" not in capsys.readouterr().err  # the weights the metric is made for: no warning
    got = _rows(out)
    assert {r["metric"] for r in got} == {"specs"}
    cos = cosines(tiny_open_clip, paths, caps.values())
    np.testing.assert_allclose([r["score"] for r in got], (cos + 1) / 2, atol=1e-5)
    # --metric clip-s stays a choice: 2.5·max(cos, 0) of "A photo depicts " + caption
    out2 = tmp_path / "c.jsonl"
    argv[argv.index(out)] = out2
    assert main([str(a) for a in argv[:1] + ["--metric", "clip-s"] + argv[1:]]) == 0
    cos_p = cosines(tiny_open_clip, paths, ["A photo depicts " + c for c in caps.values()])
    np.testing.assert_allclose([r["score"] for r in _rows(out2)], 2.5 * np.maximum(cos_p, 0), atol=1e-5)


@pytest.mark.parametrize("spec, expected", [
    ("ckpt:~/models/spec.pt", True),
    ("ckpt:/w/SPECS-B32.safetensors#arch=ViT-B-32", True),
    ("/runs/longclipdetails-epoch-2.pt", True),
    ("runs/specs/model.safetensors", False),  # the folder does not count: the file is what was trained
    ("ckpt:/w/longclip-B.pt", False),  # original LongCLIP: same layout, not SPECS
    ("ViT-B-32/openai", False),
    ("hf:someone/specs-clip", False),  # not an OpenAI-format checkpoint
    ("scenes-tiny", False),
])
def test_which_models_are_specs_checkpoints(spec, expected):
    assert is_specs_checkpoint(spec) is expected


def test_default_metric_for_specs_checkpoints():
    assert default_metric(has_refs=False, models=("ckpt:spec.pt",)) == "specs"
    assert default_metric(has_refs=False, models=("ckpt:spec.pt", "ViT-B-32/openai")) == "clip-s"  # mixed
    assert default_metric(has_refs=True, models=("ckpt:spec.pt",)) == "refclip-s"  # references asked for
    assert default_metric(has_refs=False) == "clip-s"
