"""Video files through PyAV: lossless round trips, frame sampling, bad files, and the engine's per-video cache."""
from fractions import Fraction

import av
import numpy as np
import pytest
import torch
from PIL import Image

from capscore.data.video import Sampling, VideoRef, decode_video, index_videos
from capscore.embed import Encoder, MemoryCache
from capscore.embed.cache import EmbeddingCache
from capscore.errors import CapscoreError, InputError


def frames_rgb(n, size=32, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.random((size, size, 3)) * 255).astype("uint8") for _ in range(n)]


def write_with_pyav(path, frames, *, codec, pix_fmt, options=None, fps=8):
    """Written here with PyAV directly (not through capscore) so the read side is tested on its own."""
    with av.open(str(path), "w") as c:
        s = c.add_stream(codec, rate=Fraction(fps))
        s.width, s.height, s.pix_fmt = frames[0].shape[1], frames[0].shape[0], pix_fmt
        s.options = options or {}
        for a in frames:
            for p in s.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


@pytest.mark.parametrize("name,codec,pix,opts", [("v.mkv", "ffv1", "bgr0", {}),
                                                 ("v.mp4", "libx264rgb", "rgb24", {"crf": "0"})])
def test_pyav_decoding_equals_the_written_frames(tmp_path, name, codec, pix, opts):
    written = frames_rgb(6)
    path = write_with_pyav(tmp_path / name, written, codec=codec, pix_fmt=pix, options=opts)
    got = decode_video(path, Sampling.parse("all"))
    assert len(got) == 6
    for g, w in zip(got, written):
        assert np.array_equal(np.asarray(g), w)  # lossless codecs: bit-exact


def test_lossy_h264_within_tolerance(tmp_path):
    written = frames_rgb(4, size=32)
    smooth = [np.full_like(a, 40 * i + 20) for i, a in enumerate(written)]  # flat colours survive 4:2:0 well
    path = write_with_pyav(tmp_path / "v.mp4", smooth, codec="libx264", pix_fmt="yuv420p", options={"crf": "10"})
    got = decode_video(path, Sampling.parse("all"))
    assert len(got) == 4
    for g, w in zip(got, smooth):
        assert np.abs(np.asarray(g).astype(int) - w).max() <= 3


def test_sampling_modes_pick_the_documented_frames(tmp_path):
    # frame i is a flat image of grey level 10·i, so each decoded frame says which one it is
    written = [np.full((16, 16, 3), 10 * i, dtype=np.uint8) for i in range(10)]
    path = write_with_pyav(tmp_path / "v.mkv", written, codec="ffv1", pix_fmt="bgr0", fps=4)  # t = i/4 s

    def which(sampling, **window):
        ims = VideoRef(path=path, **window).load(Sampling.parse(sampling))
        return [int(np.asarray(im)[0, 0, 0]) // 10 for im in ims]

    assert which("all") == list(range(10))
    assert which("uniform:4") == [0, 3, 6, 9]          # int(linspace(0, 9, 4)) = 0, 3, 6, 9
    assert which("uniform:3") == [0, 4, 9]             # linspace(0, 9, 3) = 0, 4.5, 9 -> floor
    assert which("uniform:20") == list(range(10))      # fewer frames than N: each frame once
    assert which("every:3") == [0, 3, 6, 9]
    assert which("fps:1") == [0, 4, 8]                 # first frame of each second at 4 fps
    assert which("fps:2") == [0, 2, 4, 6, 8]
    assert which("all", start=0.5, end=1.5) == [2, 3, 4, 5]   # [0.5 s, 1.5 s)
    assert which("uniform:2", start=0.5, end=1.5) == [2, 5]
    # the same rules on a GIF (durations in ms) and on a frame folder
    gif = tmp_path / "v.gif"
    ims = [Image.fromarray(a) for a in written]
    ims[0].save(gif, save_all=True, append_images=ims[1:], duration=250, loop=0)
    assert [int(np.asarray(im)[0, 0, 0]) // 10 for im in VideoRef(path=gif).load(Sampling.parse("fps:1"))] == [0, 4, 8]
    (tmp_path / "frames").mkdir()
    for i, im in enumerate(ims):
        im.save(tmp_path / "frames" / f"f{i:02d}.png")
    got = VideoRef(path=tmp_path / "frames").load(Sampling.parse("uniform:4"))
    assert [int(np.asarray(im)[0, 0, 0]) // 10 for im in got] == [0, 3, 6, 9]
    with pytest.raises(InputError, match="needs timestamps"):
        VideoRef(path=tmp_path / "frames").load(Sampling.parse("fps:1"))


def test_sampling_grammar():
    assert str(Sampling.parse("uniform")) == "uniform:10" and str(Sampling.parse("FPS:0.5")) == "fps:0.5"
    for bad in ("uniform:0", "every:1.5", "fps:-1", "sometimes:3", "all:3", "uniform:x"):
        with pytest.raises(CapscoreError):
            Sampling.parse(bad)


def test_corrupt_empty_and_frameless_videos_raise_naming_the_file(tmp_path):
    (tmp_path / "junk.mp4").write_bytes(b"\x00\x01not a video at all" * 50)
    (tmp_path / "empty.mp4").write_bytes(b"")
    with av.open(str(tmp_path / "noframes.mkv"), "w") as c:  # a valid container with a stream and no frames
        s = c.add_stream("ffv1", rate=8)
        s.width, s.height, s.pix_fmt = 16, 16, "bgr0"
    for name in ("junk.mp4", "empty.mp4", "noframes.mkv", "missing.mp4"):
        with pytest.raises(InputError) as e:
            VideoRef(path=tmp_path / name).load()
        assert name in str(e.value) and "\n" not in str(e.value)
    ok = write_with_pyav(tmp_path / "ok.mkv", frames_rgb(3), codec="ffv1", pix_fmt="bgr0")
    with pytest.raises(InputError, match="no frames could be decoded between 10.0s and 20.0s"):
        VideoRef(path=ok, start=10.0, end=20.0).load()


def test_index_videos_folder(tmp_path):
    write_with_pyav(tmp_path / "a.mp4", frames_rgb(2), codec="libx264rgb", pix_fmt="rgb24", options={"crf": "0"})
    (tmp_path / "b").mkdir()
    (tmp_path / "notes.txt").write_text("x")
    idx = index_videos(tmp_path)
    assert sorted(idx.by_id) == ["a", "b"]
    (tmp_path / "a.webm").write_bytes(b"")
    with pytest.raises(InputError, match="share the id 'a'"):
        index_videos(tmp_path)


def test_frames_shared_by_captions_are_encoded_once_and_cached(tiny_backbone, tmp_path):
    a = write_with_pyav(tmp_path / "a.mkv", frames_rgb(12, seed=1), codec="ffv1", pix_fmt="bgr0")
    b = write_with_pyav(tmp_path / "b.mkv", frames_rgb(12, seed=2), codec="ffv1", pix_fmt="bgr0")
    cache = EmbeddingCache(tmp_path / "cache")
    enc = Encoder(tiny_backbone, cache=cache)
    out = enc.encode_videos([a, b, a, a, b], sampling="uniform:5")  # five captions, two clips
    assert enc.stats.videos_encoded == 2 and enc.stats.frames_encoded == 10  # not 25
    assert all(o.shape == (5, tiny_backbone.embed_dim) for o in out)
    assert torch.equal(out[0], out[2]) and torch.equal(out[1], out[4])
    # each frame vector is the image tower's vector of that decoded frame
    direct = enc.encode_images(VideoRef(path=a).load(Sampling.parse("uniform:5")))
    assert torch.allclose(out[0], direct, atol=1e-5)
    # a new run on the same cache decodes nothing; another sampling is another key
    enc2 = Encoder(tiny_backbone, cache=EmbeddingCache(tmp_path / "cache"))
    again = enc2.encode_videos([b, a], sampling="uniform:5")
    assert enc2.stats.videos_cached == 2 and enc2.stats.frames_encoded == 0
    assert torch.allclose(again[1], out[0])
    enc2.encode_videos([a], sampling="every:4")
    assert enc2.stats.frames_encoded == 3
    # the key follows the bytes, not the name: a changed file is re-encoded
    write_with_pyav(a, frames_rgb(12, seed=3), codec="ffv1", pix_fmt="bgr0")
    enc3 = Encoder(tiny_backbone, cache=EmbeddingCache(tmp_path / "cache"))
    enc3.encode_videos([a], sampling="uniform:5")
    assert enc3.stats.videos_encoded == 1 and enc3.stats.videos_cached == 0


def test_bad_video_is_recorded_not_raised_with_errors(tiny_backbone, tmp_path):
    good = write_with_pyav(tmp_path / "g.mkv", frames_rgb(3), codec="ffv1", pix_fmt="bgr0")
    (tmp_path / "bad.mp4").write_bytes(b"garbage" * 100)
    enc = Encoder(tiny_backbone, cache=MemoryCache())
    errors = {}
    out = enc.encode_videos([good, tmp_path / "bad.mp4"], errors=errors)
    assert out[0] is not None and out[1] is None and "bad.mp4" in errors[1]
    with pytest.raises(InputError, match="bad.mp4"):
        enc.encode_videos([tmp_path / "bad.mp4"])


@pytest.mark.parametrize("name,codec,pix,opts", [("v.webm", "libvpx-vp9", "yuv444p", {"lossless": "1"}),
                                                 ("v.avi", "mpeg4", "yuv420p", {"qscale": "2"})])
def test_webm_and_avi_decode_within_codec_tolerance(tmp_path, name, codec, pix, opts):
    flat = [np.full((32, 32, 3), 30 * i + 15, dtype=np.uint8) for i in range(5)]  # flat greys: colour-exact in YUV
    path = write_with_pyav(tmp_path / name, flat, codec=codec, pix_fmt=pix, options=opts)
    got = decode_video(path, Sampling.parse("all"))
    assert len(got) == 5
    for g, w in zip(got, flat):
        assert np.abs(np.asarray(g).astype(int) - w).mean() <= 2
    assert len(decode_video(path, Sampling.parse("fps:4"))) == 3  # 8 fps: t = 0, .125, ... -> buckets of 0.25 s
