"""Every encoder a face or engine builds gives the same vectors for the same calls.

The variants: :func:`capscore.embed.make_encoder` (memory and persistent cache), the pipeline's
``load_encoders``, the API's ``get_encoder``, the Ray score actor's and probe worker's encoders (their
classes built in this process), and the Ray encoder of probe/correlate on a local cluster (``slow``). Each
goes through the same calls — texts, images, images with patches, patch tokens, per-token text features,
video frames, and a missing image with ``errors=`` — and is checked against open_clip by hand
(capscore-test-tiny: ``torch.manual_seed(0)`` then ``create_model_and_transforms``) where open_clip gives
the number directly, and against each other everywhere.
"""
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from test_cli_score import MODEL, ref_model  # noqa: F401  (open_clip by hand, the same random init)

TEXTS = ["a red square on a blue field", "two small circles", "a red square on a blue field", "x"]


def _unit(x):
    return torch.nn.functional.normalize(x.float(), dim=-1)


def _variants(tmp_path):
    """name -> a zero-argument builder of the encoder that variant uses."""
    from capscore.api import get_encoder
    from capscore.data.sources import InMemory
    from capscore.embed.factory import Encoding, make_encoder
    from capscore.engines.ray import ScoreActor, _EncodeWorker
    from capscore.pipeline import ScoreJob, load_encoders

    memory = Encoding(cache=False)
    return {
        "make_encoder": lambda: make_encoder(MODEL, memory),
        "make_encoder, persistent cache": lambda: make_encoder(MODEL, Encoding(cache_dir=str(tmp_path / "emb"))),
        "pipeline.load_encoders": lambda: load_encoders(ScoreJob(InMemory(()), (MODEL,), ("clip-s",),
                                                                 encoding=memory))[MODEL],
        "api.get_encoder": lambda: get_encoder(MODEL),
        "Ray score actor": lambda: ScoreActor(model=MODEL, slot=0, metrics=(), encoding=memory, plan=None, threads=1,
                                              pixel_shape=(3, 32, 32), out=str(tmp_path), fmt="parquet",
                                              names=()).encoder,
        "Ray probe worker": lambda: _EncodeWorker(spec=MODEL, encoding=replace(memory), threads=1).encoder,
    }


def _calls(enc, images, frames_dir, missing):
    """The same calls on every variant -> their results as numpy arrays (and the error messages)."""
    from capscore.data.video import Sampling

    out = {"texts": enc.encode_texts(TEXTS).numpy(), "images": enc.encode_images(images).numpy()}
    g, p = enc.image_patches(images)
    out["patches"], out["patch_globals"] = p.numpy(), g.numpy()
    out["images_with_patches"] = enc.encode_images(images, patches=True).numpy()
    toks = enc.text_tokens(TEXTS[:2])
    out["token_vectors"] = [t.vectors.numpy() for t in toks]
    out["token_globals"] = np.stack([t.global_.numpy() for t in toks])
    out["frames"] = enc.encode_videos([frames_dir], sampling=Sampling.parse("all"))[0].numpy()
    errors: dict[int, str] = {}
    out["with_errors"] = enc.encode_images([images[0], missing, images[1]], errors=errors).numpy()
    out["errors"] = errors
    with pytest.raises(Exception) as bad:
        enc.encode_images([missing])
    out["raised"] = str(bad.value)
    return out


@pytest.fixture
def inputs(make_images, tmp_path):
    images = make_images(3)
    frames = tmp_path / "clip"
    frames.mkdir()
    for i, p in enumerate(make_images(2, seed=5, folder="frames")):
        Image.open(p).save(frames / f"{i:03d}.png")
    return images, frames, tmp_path / "images" / "nope.png"


def _expected(ref, images, frames_dir):
    model, preprocess, tok = ref
    with torch.no_grad():
        texts = _unit(model.encode_text(tok(TEXTS))).numpy()
        ims = _unit(model.encode_image(torch.stack([preprocess(Image.open(p).convert("RGB")) for p in images])))
        fr = sorted(frames_dir.iterdir())
        frames = _unit(model.encode_image(torch.stack([preprocess(Image.open(p).convert("RGB")) for p in fr])))
    return texts, ims.numpy(), frames.numpy()


def _check(got, ref, images, frames_dir, missing, base=None):
    texts, ims, frames = _expected(ref, images, frames_dir)
    np.testing.assert_allclose(got["texts"], texts, atol=2e-6)
    np.testing.assert_allclose(got["images"], ims, atol=2e-6)
    np.testing.assert_allclose(got["patch_globals"], ims, atol=2e-6)
    np.testing.assert_allclose(got["images_with_patches"], ims, atol=2e-6)
    np.testing.assert_allclose(got["token_globals"], texts[:2], atol=2e-6)
    np.testing.assert_allclose(got["frames"], frames, atol=2e-6)
    assert got["patches"].shape[0] == 3 and np.allclose(np.linalg.norm(got["patches"], axis=-1), 1, atol=1e-5)
    np.testing.assert_allclose(got["with_errors"][[0, 2]], ims[:2], atol=2e-6)
    assert np.isnan(got["with_errors"][1]).all()
    assert list(got["errors"]) == [1] and "nope.png" in got["errors"][1]
    assert "nope.png" in got["raised"]
    if base is not None:  # the same as the first variant, to the last bit where nothing differs
        for k in ("texts", "images", "patches", "frames", "token_globals"):
            np.testing.assert_allclose(got[k], base[k], atol=1e-6, err_msg=k)
        for a, b in zip(got["token_vectors"], base["token_vectors"]):
            np.testing.assert_allclose(a, b, atol=1e-6)
        assert got["errors"] == base["errors"] and got["raised"] == base["raised"]


def test_every_local_variant_gives_the_same_results(ref_model, inputs, tmp_path):
    images, frames, missing = inputs
    base = None
    for name, build in _variants(tmp_path).items():
        got = _calls(build(), images, frames, missing)
        try:
            _check(got, ref_model, images, frames, missing, base)
        except AssertionError as e:
            raise AssertionError(f"variant {name!r}: {e}") from None
        base = base or got


def test_variants_share_the_encodings_defaults(tmp_path):
    """One Encoding, one cache rule: persistent by default (a lazy backbone when the weights are files), in
    memory when asked; the Ray actor's encoder is make_encoder's with its thread count."""
    from capscore.embed.cache import EmbeddingCache
    from capscore.embed.engine import MemoryCache
    from capscore.embed.factory import Encoding, make_encoder
    from capscore.engines.ray import ScoreActor

    assert isinstance(make_encoder("scenes-tiny", Encoding(cache_dir=str(tmp_path / "c"))).cache, EmbeddingCache)
    assert isinstance(make_encoder("scenes-tiny", Encoding(cache=False)).cache, MemoryCache)
    actor = ScoreActor(model="scenes-tiny", slot=0, metrics=(), encoding=Encoding(cache_dir=str(tmp_path / "c")),
                       plan=None, threads=3, pixel_shape=(3, 8, 8), out=str(tmp_path), fmt="parquet", names=())
    assert isinstance(actor.encoder.cache, EmbeddingCache) and actor.encoder.workers == 3
    assert actor.encoder.cache.path == tmp_path / "c" / "embeddings.sqlite"


@pytest.mark.slow  # a local Ray cluster (start-up ~10-20 s)
def test_ray_encoder_gives_the_same_results(ref_model, inputs, tmp_path):
    ray = pytest.importorskip("ray")
    from capscore.embed.factory import Encoding, make_encoder
    from capscore.engines.ray import RayOptions, ray_encoders

    images, frames, missing = inputs
    base = _calls(make_encoder(MODEL, Encoding(cache=False)), images, frames, missing)
    ray.init(num_cpus=2, object_store_memory=160 * 1024**2, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    try:
        enc = ray_encoders(RayOptions(workers=1))(MODEL, Encoding(cache=False))
        got = _calls(enc, images, frames, missing)
        assert enc._pool is not None  # the actors computed the missing vectors
    finally:
        ray.shutdown()
    _check(got, ref_model, images, frames, missing, base)
    assert math.isnan(float(got["with_errors"][1][0]))
