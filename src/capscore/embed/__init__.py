"""The encoding engine: batching, padding, device/dtype and caching, in one place."""
from capscore.embed.cache import EmbeddingCache
from capscore.embed.engine import Encoder, MemoryCache, TokenFeatures
from capscore.data.images import ImageRef

__all__ = ["Encoder", "EmbeddingCache", "MemoryCache", "ImageRef", "TokenFeatures"]
