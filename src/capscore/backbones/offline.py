"""Fail fast when pretrained weights are neither cached nor downloadable.

Without a network, ``huggingface_hub`` and open_clip retry their downloads for
about a minute and then raise deep inside the loader. Before a download is
attempted, :func:`require_weights` asks the local cache first; only when the
weights are missing does it check (one TCP connect, a few seconds at most)
whether the hub can be reached, and if not it raises one line saying how to
get the weights onto this machine.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

from capscore.errors import CapscoreError

HUB_HOST = "huggingface.co"


def hub_offline() -> bool:
    """True when the user switched the hub off (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)."""
    return any(os.environ.get(v, "0").strip().lower() not in ("", "0", "false", "no", "off")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_reachable(host: str = HUB_HOST, timeout: float = 3.0) -> bool:
    """One TCP connection to ``host:443`` (honours nothing but the network itself)."""
    if hub_offline():
        return False
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def hf_cached(repo_id: str, filenames: tuple[str, ...]) -> bool:
    """Whether any of ``filenames`` of ``repo_id`` is in the local Hugging Face cache."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    for name in filenames:
        try:
            hit = try_to_load_from_cache(repo_id, name)
        except Exception:  # noqa: BLE001  (an invalid repo id: not cached, the loader will say why)
            return False
        if isinstance(hit, str):
            return True
    return False


def _how(spec: str, extra: str) -> str:
    return (f"--model {spec}: the weights are not in the local cache and {HUB_HOST} cannot be reached "
            f"(offline{' mode' if hub_offline() else ''}); {extra}; capscore's bundled model works offline: "
            "--model scenes-tiny")


def require_hf_repo(spec: str, repo_id: str, filenames: tuple[str, ...]) -> None:
    """Raise at once when ``repo_id`` is not cached and the hub is unreachable."""
    if hf_cached(repo_id, filenames) or hub_reachable():
        return
    raise CapscoreError(_how(spec, f"download {repo_id} on a machine with network (it lands in the Hugging Face "
                                   "cache, ~/.cache/huggingface/hub or $HF_HOME/hub) and copy that cache here, "
                                   "or pass a local folder instead of the hub name"))


def require_open_clip_weights(spec: str, arch: str, tag: str) -> None:
    """For ``ARCH/TAG`` with a pretrained tag (not a file): raise when the weights are unobtainable."""
    import open_clip  # noqa: PLC0415  (deferred: open_clip)

    cfg = open_clip.get_pretrained_cfg(arch, tag) or {}
    if not cfg or "file" in cfg:
        return
    hub = cfg.get("hf_hub", "")
    if hub:
        repo_id, filename = os.path.split(hub.rstrip("/")) if not hub.endswith("/") else (hub.rstrip("/"), "")
        names = tuple(n for n in (filename, "open_clip_model.safetensors", "open_clip_pytorch_model.bin",
                                  Path(filename).with_suffix(".safetensors").name if filename else "") if n)
        if hf_cached(repo_id, names):
            return
    url = cfg.get("url", "")
    if url and (Path.home() / ".cache" / "clip" / os.path.basename(url)).is_file():
        return
    if hub_reachable():
        return
    where = f"the Hugging Face repo {repo_id}" if hub else url
    raise CapscoreError(_how(spec, f"fetch {where} on a machine with network and copy ~/.cache/huggingface/hub "
                                   f"(or $HF_HOME/hub) here, or pass the weights file itself: "
                                   f"--model {arch}/PATH/TO/weights.safetensors"))
