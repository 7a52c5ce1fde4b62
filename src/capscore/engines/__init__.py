"""Engines: the same per-block functions run in this process (the default) or on a Ray cluster.

Nothing here imports Ray; :func:`require_ray` is the one place that does, and
turns its absence into a one-line install hint.
"""
from __future__ import annotations

from capscore.errors import CapscoreError

RAY_HINT = '--engine ray needs Ray Data, which is not installed; install it with: pip install "capscore[ray]"'


def require_ray():
    """Import and return ``ray`` (with ``ray.data``); CapscoreError with the install hint if absent."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise CapscoreError(RAY_HINT) from None
    return ray
