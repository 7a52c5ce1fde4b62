"""Image references and their decoding live in the data layer (:mod:`capscore.data.images`); the engine
reads them from there. This name stays for code written against it."""

from capscore.data import images


def __getattr__(name: str):
    return getattr(images, name)
