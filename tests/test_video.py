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
