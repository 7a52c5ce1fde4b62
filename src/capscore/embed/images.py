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

    def load(self) -> tuple[str, Image.Image]:
        """Decode to RGB; returns (content key, image). Raises InputError naming the file."""
        if self.image is not None:
            im = self.image.convert("RGB")
            h = hashlib.sha256(f"{im.size}".encode())
            h.update(im.tobytes())
            return "px:" + h.hexdigest(), im
        path = self.path
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise InputError(self.where(), "image file not found") from None
        except OSError as e:
            raise InputError(self.where(), f"cannot read image file ({e.strerror or e})") from None
        try:
            with Image.open(io.BytesIO(data)) as im:
                im.load()  # forces a full decode: truncated files fail here
                rgb = im.convert("RGB")
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
            msg = "not an image file" if isinstance(e, UnidentifiedImageError) else f"unreadable or truncated image ({e})"
            raise InputError(self.where(), msg) from None
        return "sha256:" + hashlib.sha256(data).hexdigest(), rgb
