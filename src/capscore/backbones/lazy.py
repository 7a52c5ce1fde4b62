"""A backbone that is built only when a run needs its model: warm re-runs skip open_clip and the weights.

A run whose vectors are all in the persistent embedding cache needs of its backbone only the
identity (every cache key holds it) and a few facts (embedding width, context length, which
features it exposes). ``load_backbone(spec, lazy=True)`` remembers those facts after a real load,
in ``$CAPSCORE_CACHE/backbones.json``, under a key made of

* every weights file's resolved path, size and mtime (as :mod:`capscore.backbones.hashcache`);
* the files of capscore's code that builds and preprocesses (``capscore/backbones``, its configs,
  ``capscore/scenes``), path, size and mtime, so an edited loader is a new key;
* the load recipe: spec, device, dtype, seed, context length, RGB order, and the installed
  capscore, torch, open_clip and transformers versions.

With the same key, the next load returns a :class:`LazyBackbone` holding the facts; the first use
of anything else (a forward pass, the tokenizer, the model) builds the real backbone, once, under a
lock, checks that its identity is the remembered one, and from then on forwards every attribute.
A mismatch — something the key does not cover changed, e.g. an installed package edited in place —
forgets the entry and raises, since vectors already read from the cache may belong to the earlier
model; the next run loads for real.

Only loads whose weights come from known files are remembered (bundled models, ``ckpt:PATH``,
``ARCH/PATH``): for a pretrained tag, a hub id or random weights the identity needs the parameters.
"""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
import sys
from importlib import metadata

from capscore.backbones import hashcache
from capscore.errors import CapscoreError

# What a LazyBackbone answers without building: JSON-able attributes read on a warm run.
FACTS = ("identity", "spec", "family", "embed_dim", "token_dim", "context_length", "rgb_order",
         "has_token_features", "has_patch_tokens", "supports_packed_text", "pad_to_longest_exact")

_PACKAGE = Path(__file__).resolve().parents[1]  # capscore/


def facts_file() -> Path:
    return hashcache.cache_file().with_name("backbones.json")


def code_files() -> list[Path]:
    """capscore's files that decide what a loaded backbone computes (loaders, configs, the bundled models)."""
    out = []
    for sub, pattern in (("backbones", "*.py"), ("backbones/configs", "*.json"), ("scenes", "*.py")):
        out += sorted((_PACKAGE / sub).glob(pattern))
    return out


def _versions() -> str:
    out = []
    for dist, module in (("capscore", "capscore"), ("torch", "torch"), ("open_clip_torch", "open_clip"),
                         ("transformers", "transformers")):
        mod = sys.modules.get(module)
        version = getattr(mod, "__version__", None) if mod is not None else None
        if version is None:
            try:
                version = metadata.version(dist)
            except metadata.PackageNotFoundError:
                version = "-"
        out.append(f"{dist}={version}")
    return ",".join(out)


def facts_key(files: Sequence[Path], recipe: str) -> str | None:
    """The key the facts of a load are remembered under; None when a file cannot be read."""
    fp = hashcache.file_fingerprint([*files, *code_files()])
    return None if fp is None else hashcache.source_key(fp, f"lazy|{recipe}|{_versions()}")


def facts_of(bb) -> dict:
    return {name: getattr(bb, name) for name in FACTS}


def remembered(key: str) -> dict | None:
    raw = hashcache.lookup(key, path=facts_file())
    try:
        facts = json.loads(raw) if raw else None
    except ValueError:
        return None
    return facts if isinstance(facts, dict) and all(name in facts for name in FACTS) else None


def remember(key: str, bb) -> None:
    hashcache.remember(key, json.dumps(facts_of(bb)), path=facts_file())


class LazyBackbone:
    """Stands in for a :class:`~capscore.backbones.base.Backbone` until its model is needed (see module).

    Registered as a virtual subclass of ``Backbone``: ``isinstance(x, Backbone)`` holds for it."""

    def __init__(self, facts: dict, build: Callable[[], object], key: str):
        object.__setattr__(self, "_facts", dict(facts))
        object.__setattr__(self, "_build", build)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_real", None)
        object.__setattr__(self, "_lock", threading.Lock())

    @property
    def built(self) -> bool:
        return self._real is not None

    def materialize(self):
        """The real backbone, built on first call (thread-safe)."""
        if self._real is None:
            with self._lock:
                if self._real is None:
                    bb = self._build()
                    if bb.identity != self._facts["identity"]:
                        hashcache.remember(self._key, None, path=facts_file())  # forget it
                        raise CapscoreError(
                            f"{self._facts['spec']}: the model built now is not the one remembered for this "
                            f"weights file and code ({facts_file()}), so vectors read from the cache this run may "
                            "be another model's; the entry is forgotten, run the command again")
                    object.__setattr__(self, "_real", bb)
        return self._real

    def __getattr__(self, name: str):  # only for names not found on the proxy itself
        if name.startswith("__"):
            raise AttributeError(name)
        if self._real is None and name in self._facts:
            return self._facts[name]
        return getattr(self.materialize(), name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self.materialize(), name, value)

    def __repr__(self) -> str:
        if self._real is not None:
            return repr(self._real)
        return f"<LazyBackbone {self._facts['spec']} (not built) ctx={self._facts['context_length']}>"


def env_disabled() -> bool:
    """``CAPSCORE_LAZY_BACKBONE=0`` turns the stand-in off (every load builds the model)."""
    return os.environ.get("CAPSCORE_LAZY_BACKBONE", "1").strip().lower() in ("0", "false", "no", "off")
