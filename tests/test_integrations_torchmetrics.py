"""CaptionScore (torchmetrics Metric): parity with `capscore score`, accumulation, DDP-style merging,
and the documented relation to torchmetrics' own CLIPScore formula."""
import json

import numpy as np
import pytest
import torch
from PIL import Image

import capscore.backbones.openclip  # noqa: F401  (registers capscore-test-tiny)
from capscore.cli import main
from capscore.integrations.torchmetrics import CaptionScore

MODEL = "capscore-test-tiny"
CAPS = ["a red square", "two dogs in the snow", "a bowl of fruit", "a cat", "the sea at night"]


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(11)
    return torch.from_numpy((rng.random((5, 3, 32, 32)) * 255).astype(np.uint8))  # (N, C, H, W) uint8


def test_parity_with_the_cli_mean(batch, tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i, t in enumerate(batch):
        Image.fromarray(t.permute(1, 2, 0).numpy()).save(folder / f"im{i}.png")
    (tmp_path / "c.json").write_text(json.dumps({f"im{i}": c for i, c in enumerate(CAPS)}))
    out = tmp_path / "s.jsonl"
    for metric, refs in (("clip-s", None), ("refclip-s", [["a square"], ["dogs"], ["fruit"], ["a kitten"], ["sea"]])):
        argv = ["-q", "score", "--model", MODEL, "--images", str(folder), "--captions", str(tmp_path / "c.json"),
                "--metric", metric, "--out", str(out), "--overwrite", "--no-cache"]
        if refs:
            (tmp_path / "r.json").write_text(json.dumps({f"im{i}": r for i, r in enumerate(refs)}))
            argv += ["--refs", str(tmp_path / "r.json")]
        assert main(argv) == 0
        cli_mean = json.loads((tmp_path / "s.jsonl.summary.json").read_text())["mean"]
        m = CaptionScore(MODEL, metric)
        m.update(batch, CAPS, refs)
        assert float(m.compute()) == pytest.approx(cli_mean, abs=1e-6)


def test_several_updates_equal_one_big_update_and_states_merge_like_ddp(batch):
    one = CaptionScore(MODEL)
    one.update(batch, CAPS)
    many = CaptionScore(MODEL)
    many.update(batch[:2], CAPS[:2])
    many.update(batch[2:3], CAPS[2:3])
    many.update(batch[3:], CAPS[3:])
    assert int(many.count) == 5
    assert float(many.compute()) == pytest.approx(float(one.compute()), abs=1e-6)
    # two "processes", each with its shard: merging with the states' reduce functions (what DDP sync
    # does) gives the global mean, not the mean of the two means
    a, b = CaptionScore(MODEL), CaptionScore(MODEL)
    a.update(batch[:1], CAPS[:1])
    b.update(batch[1:], CAPS[1:])
    a.merge_state(b)
    assert float(a.compute()) == pytest.approx(float(one.compute()), abs=1e-6)
    assert one._reductions["score_sum"] is not None and one._reductions["count"] is not None
    one.reset()
    assert int(one.count) == 0


def test_relation_to_torchmetrics_clipscore(batch):
    """torchmetrics' CLIPScore (its own update/compute) on capscore's embeddings, through a stub model.

    torchmetrics: max(mean(100 cos), 0); capscore: mean(2.5 max(cos, 0)) (clamp per pair, as the paper).
    With no prefix they agree up to 2.5/100 when every cosine is positive; otherwise capscore is higher.
    """
    from types import SimpleNamespace

    from torchmetrics.multimodal.clip_score import CLIPScore

    from capscore.api import get_encoder
    from capscore.validate import to_image_ref

    enc = get_encoder(MODEL)

    class Stub(torch.nn.Module):  # the processor already returns capscore's normalised vectors
        config = SimpleNamespace()

        def get_image_features(self, x):
            return x

        def get_text_features(self, ids, mask=None):
            return ids

    def processor(images=None, text=None, **kw):
        if images is not None:
            return {"pixel_values": enc.encode_images([to_image_ref(t) for t in images])}
        return {"input_ids": enc.encode_texts(text), "attention_mask": torch.ones(len(text), 1)}

    tm = CLIPScore(model_name_or_path=lambda: (Stub(), processor))
    tm.update(list(batch), CAPS)
    tm_value = float(tm.compute())
    m = CaptionScore(MODEL, prefix="")
    m.update(batch, CAPS)
    ours = float(m.compute())
    cos = (enc.encode_images([to_image_ref(t) for t in batch]) * enc.encode_texts(CAPS)).sum(-1)
    assert tm_value == pytest.approx(max(100 * float(cos.mean()), 0.0), abs=1e-4)  # the stub is transparent
    if bool((cos > 0).all()):
        assert ours == pytest.approx(2.5 / 100 * tm_value, abs=1e-6)
    else:
        assert ours > 2.5 / 100 * tm_value


def test_update_scores_the_batch_without_a_run_and_checks_it_once(batch, monkeypatch):
    """update() is the functional core on the batch: no ScoreJob, no run loop, one argument check; its mean is
    2.5 · max(cos, 0) of the encoder's own vectors, recomputed here by hand."""
    from capscore import pipeline, validate
    from capscore.api import get_encoder

    m = CaptionScore(MODEL, prefix="")
    m.encoder  # loaded before the spies: the backbone, not the batch
    calls = []
    real = validate.check_score_args
    monkeypatch.setattr(validate, "check_score_args", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    monkeypatch.setattr(pipeline, "ScoreJob", lambda *a, **k: pytest.fail("a ScoreJob per batch"))
    monkeypatch.setattr(pipeline, "iter_rows", lambda *a, **k: pytest.fail("the run loop per batch"))
    m.update(batch, CAPS)
    assert calls == ["CaptionScore.update"]
    enc = get_encoder(MODEL)
    cos = (enc.encode_images([validate.to_image_ref(t) for t in batch]) * enc.encode_texts(CAPS)).sum(-1)
    assert float(m.compute()) == pytest.approx(float((2.5 * cos.clamp(min=0)).mean()), abs=1e-6)
