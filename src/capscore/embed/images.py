"""Image references: a path on disk or an in-memory PIL image, each with a content key."""
from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from capscore.errors import InputError

ImageInput = "str | Path | Image.Image | ImageRef"


@dataclass(frozen=True)
class ImageRef:
    """An image to encode. ``path`` for files; ``image`` for in-memory pictures (scenes)."""

    path: Path | None = None
    image: Image.Image | None = field(default=None, compare=False, repr=False)
    name: str = ""  # shown in errors (e.g. the manifest line)

    @staticmethod
    def of(x) -> "ImageRef":
        if isinstance(x, ImageRef):
            return x
        if isinstance(x, Image.Image):
            return ImageRef(image=x)
        return ImageRef(path=Path(x))

    def where(self) -> str:
        return self.name or (str(self.path) if self.path is not None else "<in-memory image>")

    def identity_hint(self) -> str:
        """A cheap key used only to dedupe within one call (not the cache key)."""
        if self.path is not None:
            return f"path:{self.path}"
        return f"obj:{id(self.image)}"

    def read(self) -> tuple[str, bytes | Image.Image]:
        """Read without decoding: (content key, file bytes or in-memory image).

        The key is the SHA-256 of the file's bytes (or of the pixels), so the
        cache can be consulted before paying for a decode.
        """
        if self.image is not None:
            im = self.image.convert("RGB")
            h = hashlib.sha256(f"{im.size}".encode())
            h.update(im.tobytes())
            return "px:" + h.hexdigest(), im
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            raise InputError(self.where(), "image file not found") from None
        except OSError as e:
            raise InputError(self.where(), f"cannot read image file ({e.strerror or e})") from None
        return "sha256:" + hashlib.sha256(data).hexdigest(), data

    def decode(self, payload: bytes | Image.Image, *, convert_rgb: bool = True) -> Image.Image:
        """Decode what :meth:`read` returned to RGB; InputError names the file if it is not a valid image.

        ``convert_rgb=False`` keeps the file's own mode (palette ``P``, ``L``, ``RGBA`` ...) for
        backbones whose preprocessing converts *after* resizing, as the clipscore/pacscore
        reference scripts do (``Backbone.rgb_order == "after-crop"``).
        """
        if isinstance(payload, Image.Image):
            return payload
        try:
            with Image.open(io.BytesIO(payload)) as im:
                im.load()  # forces a full decode: truncated files fail here
                return im.convert("RGB") if convert_rgb else im.copy()
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
            msg = "not an image file" if isinstance(e, UnidentifiedImageError) else f"unreadable or truncated image ({e})"
            raise InputError(self.where(), msg) from None

    def load(self, *, convert_rgb: bool = True) -> tuple[str, Image.Image]:
        """Read and decode: (content key, RGB image). Raises InputError naming the file."""
        key, payload = self.read()
        return key, self.decode(payload, convert_rgb=convert_rgb)
