"""The one encoder factory: an :class:`Encoding` (where and how a backbone runs, where its vectors are
cached) and a model -> an :class:`~capscore.embed.engine.Encoder`.

Every face builds its encoders here — ``capscore score`` (:func:`capscore.pipeline.load_encoders`),
``capscore.score`` / ``CaptionScore`` (:func:`capscore.api.get_encoder`), correlate, probe, and the
Ray engine's actors (which compose this encoder rather than subclass it) — so one Encoding gives the
same encoder, the same cache and the same vectors in every face and engine.

The rules, once:

* ``model``: a ``--model`` string (loaded with the Encoding's device, dtype, seed, context length,
  RGB order and ``trust_remote_code``), a loaded Backbone (used as is), or an Encoder (returned as is).
* cache: ``cache=True`` (the default) is the persistent SQLite cache in ``cache_dir`` (None:
  ``~/.cache/capscore`` or ``$CAPSCORE_CACHE``); ``cache=False`` keeps vectors in memory (a bounded
  LRU). A caller that builds several encoders of one run passes one opened store (``store=``) so they
  share it.
* a metric that brings its own image tower (Polos's and DENEB's CLIP) gets its encoder from
  :func:`tower_encoder`: the run's encoder of a backbone that gives the same vectors
  (:func:`~capscore.backbones.base.same_vectors`), so each image and text is encoded once for both,
  else a new one on the run's store;
* a model string with the persistent cache is loaded lazily
  (:class:`~capscore.backbones.lazy.LazyBackbone`): a run served from the cache never builds the
  network; without a persistent cache every vector is computed, so the model is built at once.
"""
from __future__ import annotations

from dataclasses import dataclass

from capscore.errors import CapscoreError, param_error
from capscore.backbones import load_backbone


@dataclass(frozen=True)
class Encoding:
    """Where and how backbones run, and where their vectors are cached."""

    device: str = "cpu"
    dtype: str = "fp32"
    seed: int = 0  # random-init backbones
    context_length: int | None = None
    trust_remote_code: bool = False
    rgb_order: str = "first"
    batch_size: int = 64
    cache_dir: str | None = None  # None: ~/.cache/capscore (or $CAPSCORE_CACHE)
    cache: bool = True  # False: vectors in memory only
    workers: int = 2  # threads that read and decode images

    def __post_init__(self) -> None:
        for name in ("batch_size", "workers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise CapscoreError(f"The {name!r} parameter must be a positive integer; got {value!r} instead.")


def load_model(spec: str, encoding: Encoding, *, lazy: bool = False):
    """The backbone ``spec`` names, loaded as ``encoding`` says (``lazy``: see the module docstring)."""
    e = encoding
    return load_backbone(spec, device=e.device, dtype=e.dtype, seed=e.seed, context_length=e.context_length,
                         trust_remote_code=e.trust_remote_code, rgb_order=e.rgb_order, lazy=lazy)


def open_cache(encoding: Encoding):
    """The vector store ``encoding`` asks for: the persistent cache, or a bounded one in memory."""
    from capscore.embed.cache import EmbeddingCache  # noqa: PLC0415  (deferred: numpy)
    from capscore.embed.engine import MemoryCache  # noqa: PLC0415  (deferred: numpy, torch)

    return EmbeddingCache(encoding.cache_dir) if encoding.cache else MemoryCache()


def make_encoder(model, encoding: Encoding = Encoding(), *, store=None, progress: bool = False):
    """An :class:`~capscore.embed.engine.Encoder` of ``model`` (a ``--model`` string, a Backbone, or an Encoder,
    returned as is) as ``encoding`` says; ``store``: an opened cache to share (default :func:`open_cache`)."""
    from capscore.backbones import Backbone  # noqa: PLC0415  (deferred: numpy, torch)
    from capscore.embed.engine import Encoder  # noqa: PLC0415  (deferred: numpy, torch)

    if isinstance(model, Encoder):
        return model
    if isinstance(model, str):
        backbone = load_model(model, encoding, lazy=encoding.cache)
    elif isinstance(model, Backbone):
        backbone = model
    else:
        raise param_error("model", "make_encoder", "a --model string (e.g. 'scenes-tiny'), a Backbone or an Encoder",
                          model)
    return Encoder(backbone, batch_size=encoding.batch_size, cache=store if store is not None else open_cache(encoding),
                   workers=encoding.workers, progress=progress)


def tower_encoder(backbone, encoders, encoding: Encoding = Encoding(), *, store=None):
    """The encoder of a metric's own ``backbone`` (a loaded Backbone): the first of ``encoders`` (the run's)
    whose backbone gives the same vectors, else :func:`make_encoder` of it on ``store``. Its raw projections
    are kept (``keep_raw``): the metrics that bring a tower feed them to a trained head."""
    from capscore.backbones.base import same_vectors  # noqa: PLC0415  (deferred: torch)

    enc = next((e for e in encoders if same_vectors(e.backbone, backbone)), None)
    if enc is None:
        enc = make_encoder(backbone, encoding, store=store)
    enc.keep_raw = True
    return enc
