"""The encoding engine: batching, padding, device/dtype and caching, in one place; and its one factory.

Names are imported on first use (PEP 562), so that ``capscore.embed.factory`` (:class:`Encoding`, which
every job carries) is importable without torch: ``capscore --help`` stays fast.
"""
from importlib import import_module

from capscore.data.images import ImageRef

_WHERE = {"Encoder": "engine", "MemoryCache": "engine", "TokenFeatures": "engine", "EmbeddingCache": "cache",
          "Encoding": "factory", "make_encoder": "factory"}

__all__ = ["Encoder", "Encoding", "EmbeddingCache", "MemoryCache", "ImageRef", "TokenFeatures", "make_encoder"]


def __getattr__(name: str):
    if name == "ImageRef":
        return ImageRef
    if name in _WHERE:
        return getattr(import_module(f"capscore.embed.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'capscore.embed' has no attribute {name!r}")
