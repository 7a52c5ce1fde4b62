"""Engines: the same per-block functions run in this process (the default) or on a Ray cluster.

Nothing here imports Ray; :func:`require_ray` is the one place that does, and
turns its absence into a one-line install hint.
"""
from __future__ import annotations

from capscore._optional import require


def require_ray():
    """Import and return ``ray`` (with ``ray.data``); CapscoreError with the install hint if absent."""
    require("ray.data", purpose="--engine ray")
    return require("ray", purpose="--engine ray")
