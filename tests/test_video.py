"""Video scoring (EMScore formula used by PAC-S for video) against hand-computed values."""
import math

import open_clip
import pytest
import torch
from PIL import Image

from capscore.embed import Encoder
from capscore.errors import InputError
from capscore.scores.video import em_score, idf_weights, score_videos


def test_em_score_hand_computed():
    frames = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    tokens = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
    glob = torch.tensor([0.6, 0.8])
    s = em_score(frames, tokens, glob)
    p, r = (1 + 0.8 + 1) / 3, 1.0
    assert s.fine_p == pytest.approx(p) and s.fine_r == pytest.approx(r)
    assert s.fine_f == pytest.approx(2 * p * r / (p + r))
    cogr = 1.4 / math.sqrt(2)  # cos((0.6, 0.8), (1, 1)/sqrt 2)
    assert s.coarse == pytest.approx(cogr)
    assert s.full_f == pytest.approx((2 * p * r / (p + r) + cogr) / 2)
    weighted = em_score(frames, tokens, glob, idf=torch.tensor([1.0, 2.0, 1.0]))
    assert weighted.fine_p == pytest.approx((1 + 2 * 0.8 + 1) / 4)


def test_idf_weights_follow_emscore():
    idf = idf_weights([[1, 2], [1, 3], [1]])
    assert idf[1] == pytest.approx(math.log(4 / 4)) and idf[2] == pytest.approx(math.log(4 / 2))
    assert idf[-1] == pytest.approx(math.log(4))  # unseen ids


def test_frame_folder_gif_and_static_video(tiny_backbone, make_images, tmp_path):
    frames = make_images(3)
    gif = tmp_path / "clip.gif"
    ims = [Image.open(p).convert("RGB") for p in frames]
    ims[0].save(gif, save_all=True, append_images=ims[1:], duration=100, loop=0)
    enc = Encoder(tiny_backbone)
    cap = "a small red cube"
    by_folder, by_list = score_videos(enc, [frames[0].parent, frames], [cap, cap])
    # same pixels, encoded at different positions of one batch: equal up to float noise
    for a, b in zip((by_folder.coarse, by_folder.fine_p, by_folder.fine_r), (by_list.coarse, by_list.fine_p, by_list.fine_r)):
        assert a == pytest.approx(b, abs=1e-6)
    # GIF frames are palette-quantised, so compare loosely to the lossless PNG frames.
    (by_gif,) = score_videos(enc, [gif], [cap])
    assert by_gif.coarse == pytest.approx(by_list.coarse, abs=0.05)
    # A static video's coarse score is the image-caption cosine, computed here with open_clip itself.
    (static,) = score_videos(enc, [[frames[0]] * 4], [cap])
    model = tiny_backbone.model
    pre = open_clip.create_model_and_transforms("capscore-test-tiny", pretrained=None)[2]
    with torch.no_grad():
        iv = torch.nn.functional.normalize(model.encode_image(pre(ims[0]).unsqueeze(0)), dim=-1)[0]
        tv = torch.nn.functional.normalize(model.encode_text(open_clip.get_tokenizer("capscore-test-tiny")([cap])), dim=-1)[0]
    assert static.coarse == pytest.approx(float(iv @ tv), abs=1e-5)


def test_bad_video_inputs(tiny_backbone, tmp_path):
    enc = Encoder(tiny_backbone)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no frame images"):
        score_videos(enc, [tmp_path / "empty"], ["x"])
    with pytest.raises(InputError, match="not found"):
        score_videos(enc, [tmp_path / "nope.gif"], ["x"])


# ---------------------------------------------------------------------------- reference-based formulas
from capscore.embed.engine import TokenFeatures  # noqa: E402
from capscore.scores.video import (  # noqa: E402
    VIDEO_METRICS, best_reference, combine, ref_video_score, text_em_score,
)


def _tf(vectors, glob, ids=None):
    v = torch.tensor(vectors, dtype=torch.float32)
    return TokenFeatures(tuple(ids or range(len(vectors))), tuple("t" * len(vectors)), v,
                         torch.tensor(glob, dtype=torch.float32))


def test_text_em_score_hand_computed():
    cand = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    ref = torch.tensor([[0.6, 0.8], [1.0, 0.0], [0.8, 0.6]])
    s = text_em_score(cand, torch.tensor([1.0, 0.0]), ref, torch.tensor([0.6, 0.8]))
    # sim = [[0.6, 1, 0.8], [0.8, 0, 0.6]]: P = mean(1, 0.8) over cand tokens, R = mean(0.8, 1, 0.8) over ref tokens
    p, r = 0.9, (0.8 + 1 + 0.8) / 3
    assert (s.fine_p, s.fine_r) == (pytest.approx(p), pytest.approx(r))
    assert s.fine_f == pytest.approx(2 * p * r / (p + r)) and s.coarse == pytest.approx(0.6)
    w = text_em_score(cand, torch.tensor([1.0, 0.0]), ref, torch.tensor([0.6, 0.8]),
                      cand_idf=torch.tensor([3.0, 1.0]), ref_idf=torch.tensor([1.0, 0.0, 1.0]))
    assert w.fine_p == pytest.approx((3 * 1 + 0.8) / 4) and w.fine_r == pytest.approx(0.8)


def test_refpac_s_video_formula_and_emscore_component_max():
    """RefPAC-S(c, V, R) = (PAC-S(c, V) + max_r Score(c, r)) / 2 (PAC-S §4.3), Score = (F + cos)/2."""
    frames = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    cand = _tf([[1.0, 0.0], [0.6, 0.8]], [0.6, 0.8])
    r1 = _tf([[1.0, 0.0]], [1.0, 0.0])          # tokens match well, global poorly
    r2 = _tf([[0.0, 1.0]], [0.6, 0.8])          # tokens poorly, global exactly
    # caption vs video: sim = [[1, 0], [0.6, 0.8]]: P = (1 + 0.8)/2, R = mean(1, 0.8), cogr = cos((.6,.8), (1,1)/√2)
    pv, rv = 0.9, 0.9
    cogr = 1.4 / math.sqrt(2)
    pac = (2 * pv * rv / (pv + rv) + cogr) / 2
    # vs r1: sim = [1, 0.6]: P = 0.8, R = 1; cos = 0.6.  vs r2: sim = [0, 0.8]: P = 0.4, R = 0.8; cos = 1
    f1, f2 = 2 * 0.8 * 1 / 1.8, 2 * 0.4 * 0.8 / 1.2
    s1, s2 = (f1 + 0.6) / 2, (f2 + 1.0) / 2
    got = combine(VIDEO_METRICS["refpac-s"], frames, cand, [r1, r2])
    assert got.video.full_f == pytest.approx(pac)
    assert got.score == pytest.approx((pac + max(s1, s2)) / 2)
    # EMScore's reference code maxes each component separately: (max F + max cos)/2
    em = combine(VIDEO_METRICS["emscore-ref"], frames, cand, [r1, r2])
    assert em.score == pytest.approx((pac + (max(f1, f2) + 1.0) / 2) / 2)
    # one reference: both rules agree
    assert combine(VIDEO_METRICS["refpac-s"], frames, cand, [r2]).score == pytest.approx(
        combine(VIDEO_METRICS["emscore-ref"], frames, cand, [r2]).score)
    assert ref_video_score(got.video, best_reference([got.ref])) == pytest.approx(got.score)
    # PAC-S and EMScore(X, V) are the same formula; clip-s is 2.5·max(cogr, 0)
    assert combine(VIDEO_METRICS["pac-s"], frames, cand).score == pytest.approx(pac)
    assert combine(VIDEO_METRICS["clip-s"], frames, cand).score == pytest.approx(2.5 * cogr)
    with pytest.raises(Exception, match="at least one reference"):
        combine(VIDEO_METRICS["refpac-s"], frames, cand, [])


def test_idf_end_token_gets_mean_idf():
    idf = idf_weights([[0, 5, 9], [0, 6, 9]], eos_id=9)
    assert idf[5] == pytest.approx(math.log(3 / 2)) and idf[0] == pytest.approx(0.0)
    assert idf[9] == pytest.approx((0 + 2 * math.log(3 / 2) + 0) / 4)  # mean over ids 0, 5, 6, 9 (9 at 0 before)
