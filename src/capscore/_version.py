"""The installed capscore's version (the package metadata's), for the package root and every layer below it."""
from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("capscore")
except _metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"
