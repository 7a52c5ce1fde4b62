"""Released metric checkpoints read from a local weights folder (``--metric-weights DIR``).

Learned metrics (Polos, DENEB) and judges (FLEUR, EXPERT) ship their weights as files their authors
published; capscore never downloads them. This module finds those files under the weights folder, reads
them safely and checks their layout, so a metric's loader states *which* tensors it expects and nothing
else:

* :func:`find_weights` — the first of a metric's accepted file names that exists, else one line naming
  the file and where it is published (:class:`WeightsFile` rows hold both);
* :func:`read_checkpoint` — a ``.safetensors`` file, or a PyTorch Lightning ``.ckpt`` (what the Polos and
  DENEB training code writes: ``{"state_dict": ..., "hyper_parameters": ..., "callbacks": ...}``), read
  with ``torch.load(weights_only=True)``. Lightning 1.x pickles a few of its own classes into the file
  (callback classes as dict keys, ``AttributeDict``); those names, and only names under
  ``pytorch_lightning.`` / ``lightning.`` plus ``argparse.Namespace``, are given inert stand-ins that
  store their state and run no code, so the unpickler stays the restricted one. Anything else is refused
  in one line;
* :func:`take` — split a state dict by key prefix into the parts a loader consumes, checking every
  expected key and shape; a key no part claims is an error (strict: every key consumed).
"""
from __future__ import annotations

import pickle
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import hashlib
from torch.serialization import get_unsafe_globals_in_checkpoint, safe_globals

from capscore.backbones.openai_ckpt import _first_line, read_safetensors
from capscore.errors import CapscoreError

#: Classes a Lightning checkpoint may name that we replace by inert stand-ins (prefixes / exact names).
STAND_IN_PREFIXES = ("pytorch_lightning.", "lightning.", "lightning_fabric.")
STAND_IN_NAMES = ("argparse.Namespace",)


@dataclass(frozen=True)
class WeightsFile:
    """One file a metric needs: accepted names under the weights folder and where it is published."""

    names: tuple[str, ...]  # relative paths, first = the published name
    source: str  # URL or instructions
    what: str  # one phrase: what the file holds


def find_weights(root: str | Path | None, spec: WeightsFile, *, metric: str) -> Path:
    """The first of ``spec.names`` under ``root`` that exists; else one line naming it and its source."""
    if root is None:
        raise CapscoreError(f"{metric} needs {spec.what}: pass --metric-weights DIR holding "
                            f"{spec.names[0]} (published at {spec.source})")
    base = Path(root).expanduser()
    for name in spec.names:
        if (base / name).exists():
            return base / name
    raise CapscoreError(f"{metric}: {base / spec.names[0]} not found ({spec.what}; published at {spec.source})")


class _StandIn:
    """What a Lightning class pickled into a checkpoint becomes: an object holding its state, nothing run."""

    def __setstate__(self, state):
        self.state = state


def _stand_ins(names: Iterable[str]) -> list[tuple[type, str]]:
    """Inert replacements for the allowed names. Lightning's ``AttributeDict`` is a ``dict`` subclass
    (its items are pickled with SETITEMS, which the restricted unpickler allows on ``dict`` only): it is
    read as a plain ``dict``."""
    out = []
    for name in names:
        if name.startswith(STAND_IN_PREFIXES) or name in STAND_IN_NAMES:
            short = name.rsplit(".", 1)[-1]
            out.append((dict if short == "AttributeDict" else type(short, (_StandIn,), {}), name))
    return out


def _torch_load(path: Path) -> object:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        pass  # perhaps Lightning's classes: name them, stand them in, try once more
    except Exception as e:  # noqa: BLE001  (a garbled file fails anywhere inside the unpickler)
        raise CapscoreError(f"{path}: not a PyTorch checkpoint ({type(e).__name__}: {_first_line(e)})") from None
    try:
        names = get_unsafe_globals_in_checkpoint(path)
    except Exception as e:  # noqa: BLE001
        raise CapscoreError(f"{path}: not a PyTorch checkpoint ({type(e).__name__}: {_first_line(e)})") from None
    stand_ins = _stand_ins(names)
    refused = sorted(set(names) - {name for _, name in stand_ins})
    if refused:
        raise CapscoreError(f"{path}: holds Python objects besides tensors ({refused[0]}); capscore reads "
                            "checkpoints only with torch.load(weights_only=True) — re-save the state dict "
                            "(or convert it to .safetensors)")
    try:
        with safe_globals(stand_ins):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001
        raise CapscoreError(f"{path}: unreadable checkpoint ({type(e).__name__}: {_first_line(e)})") from None


def read_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """(state dict, hyper-parameters) of a ``.safetensors`` file or a Lightning/plain ``.ckpt``/``.pt``.

    Hyper-parameters come from the checkpoint's ``hyper_parameters`` entry, else from a ``hparams.yaml``
    beside the file (Lightning writes one; Polos' released zip holds it), else ``{}``.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise CapscoreError(f"{p}: checkpoint file not found")
    hparams: dict = {}
    if p.suffix == ".safetensors":
        sd = read_safetensors(p)
    else:
        obj = _torch_load(p)
        if isinstance(obj, Mapping) and isinstance(obj.get("state_dict"), Mapping):
            hp = obj.get("hyper_parameters")
            hparams = dict(hp) if isinstance(hp, Mapping) else {}
            obj = obj["state_dict"]
        if not isinstance(obj, Mapping) or not obj or not all(isinstance(v, torch.Tensor) for v in obj.values()):
            raise CapscoreError(f"{p}: not a state dict (expected a dict of tensors, or a Lightning checkpoint "
                                "with one under 'state_dict')")
        sd = dict(obj)
    yaml_file = p.parent / "hparams.yaml"
    if not hparams and yaml_file.is_file():
        import yaml

        try:
            loaded = yaml.safe_load(yaml_file.read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            raise CapscoreError(f"{yaml_file}: not readable YAML ({_first_line(e)})") from None
        hparams = dict(loaded) if isinstance(loaded, Mapping) else {}
    return sd, hparams


@dataclass(frozen=True)
class Part:
    """Keys a loader consumes: those under ``prefix`` (prefix stripped). ``shapes``: key -> expected shape
    (None: any); ``optional``: keys that may be absent; ``open=True``: the part accepts any key under the
    prefix and checks its own layout (e.g. a CLIP tower handed to capscore's checkpoint builder)."""

    prefix: str
    shapes: Mapping[str, tuple[int, ...] | None] = None  # type: ignore[assignment]
    optional: frozenset = frozenset()
    open: bool = False


def take(sd: Mapping[str, torch.Tensor], parts: Mapping[str, Part], *, where: str) -> dict[str, dict[str, torch.Tensor]]:
    """Split ``sd`` into ``{part name: {key without prefix: tensor}}``, strictly.

    Errors (one line, naming ``where``): a key no part claims, an expected key that is missing, a shape
    that differs from the expected one.
    """
    out: dict[str, dict[str, torch.Tensor]] = {name: {} for name in parts}
    unclaimed = []
    for key, tensor in sd.items():
        for name, part in parts.items():
            if key.startswith(part.prefix):
                out[name][key[len(part.prefix):]] = tensor
                break
        else:
            unclaimed.append(key)
    if unclaimed:
        raise CapscoreError(f"{where}: unexpected tensor {unclaimed[0]!r} ({len(unclaimed)} unexpected in all); "
                            "is this the right checkpoint for this metric?")
    for name, part in parts.items():
        got = out[name]
        if part.open:
            if not got:
                raise CapscoreError(f"{where}: no tensors under {part.prefix!r}")
            continue
        for key, shape in (part.shapes or {}).items():
            if key not in got:
                if key in part.optional:
                    continue
                raise CapscoreError(f"{where}: missing tensor {part.prefix + key!r}")
            if shape is not None and tuple(got[key].shape) != tuple(shape):
                raise CapscoreError(f"{where}: tensor {part.prefix + key!r} has shape {tuple(got[key].shape)}; "
                                    f"expected {tuple(shape)}")
        extra = sorted(set(got) - set(part.shapes or {}))
        if extra:
            raise CapscoreError(f"{where}: unexpected tensor {part.prefix + extra[0]!r}")
    return out


def numbered(sd: Mapping[str, torch.Tensor], stem: str) -> int:
    """How many consecutive ``stem.0``, ``stem.1``, ... keys (or key prefixes) ``sd`` holds."""
    n = 0
    while any(k == f"{stem}.{n}" or k.startswith(f"{stem}.{n}.") for k in sd):
        n += 1
    return n


def shape_of(sd: Mapping[str, torch.Tensor], key: str, *, where: str) -> tuple[int, ...]:
    if key not in sd:
        raise CapscoreError(f"{where}: missing tensor {key!r}")
    return tuple(sd[key].shape)


def file_digest(paths: Sequence[Path]) -> str:
    """A short SHA-256 over the bytes of ``paths`` (tokenizer and config files: part of an identity)."""
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


__all__ = ["Part", "WeightsFile", "file_digest", "find_weights", "numbered", "read_checkpoint", "shape_of", "take"]
