"""Image references: a path on disk or an in-memory PIL image, each with a content key."""
from __future__ import annotations

import hashlib
import io
import os
import stat
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from capscore.errors import InputError

# Images over PIL's limit are refused by check_dimensions with a one-line error naming the file;
# PIL's own warning for them would only be a second, redundant line.
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)

ImageInput = "str | Path | Image.Image | ImageRef"

#: Largest image accepted, in pixels (PIL's own decompression-bomb threshold, ~89.5 MP). Checked from the
#: file header before anything is decoded, so a 48 KB PNG claiming 20000x20000 costs nothing.
MAX_PIXELS = 89_478_485
#: Largest accepted ratio of the long side to the short side. CLIP preprocessing resizes the *short* side
#: to the model's input size (e.g. 224) before cropping, so a 1x100000 strip would be blown up to
#: 224x22.4M pixels; 50:1 keeps that intermediate image below ~2.5 MP.
MAX_ASPECT = 50
#: Largest image file read into memory, in bytes (1 GiB); checked with stat before the file is opened.
MAX_FILE_BYTES = 2**30


def check_dimensions(size: tuple[int, int], where: str) -> None:
    """Refuse images over :data:`MAX_PIXELS` or :data:`MAX_ASPECT` (an :class:`InputError` naming the file)."""
    w, h = size
    if w < 1 or h < 1:
        raise InputError(where, f"image has no pixels ({w}x{h})")
    if w * h > MAX_PIXELS:
        raise InputError(where, f"image is {w}x{h} = {w * h / 1e6:.0f} megapixels, over the {MAX_PIXELS / 1e6:.1f} megapixel "
                                "limit (decompression-bomb guard); downscale it first")
    if max(w, h) > MAX_ASPECT * min(w, h):
        raise InputError(where, f"image is {w}x{h}, an aspect ratio over {MAX_ASPECT}:1 (resizing its short side "
                                "would blow it up in memory); crop or pad it first")


def to_rgb(im: Image.Image, where: str = "<image>") -> Image.Image:
    """Convert to 8-bit RGB *by value range*, not by truncation.

    PIL's ``convert("RGB")`` clips 16-bit and 32-bit integer images at 255 and
    float images likewise, so a 16-bit grayscale PNG would come out almost white.
    Rules: 16-bit integer modes (``I;16*``, and ``I`` with values in [0, 65535])
    are divided by 257 (65535 -> 255); float images (``F``) with values in
    [0, 1] are multiplied by 255, those in [0, 255] are kept; anything else
    (negative, NaN, larger) is refused rather than guessed.
    """
    if im.mode in ("RGB",):
        return im
    if im.mode.startswith("I;16") or im.mode in ("I", "F"):
        import numpy as np  # noqa: PLC0415  (deferred: numpy)

        a = np.asarray(im, dtype=np.float64)
        if not np.isfinite(a).all():
            raise InputError(where, f"{im.mode}-mode image contains NaN or infinite values")
        lo, hi = (float(a.min()), float(a.max())) if a.size else (0.0, 0.0)
        if im.mode == "F" and lo >= 0 and hi <= 1:
            a = a * 255.0
        elif im.mode == "F" and lo >= 0 and hi <= 255:
            pass
        elif im.mode != "F" and lo >= 0 and hi <= 65535:
            a = a / 257.0
        else:
            kind = "float" if im.mode == "F" else "integer"
            want = "[0, 1] or [0, 255]" if im.mode == "F" else "[0, 65535]"
            raise InputError(where, f"{kind} image values span [{lo:g}, {hi:g}]; expected {want}")
        gray = Image.fromarray(np.clip(np.rint(a), 0, 255).astype(np.uint8), mode="L")
        return gray.convert("RGB")
    return im.convert("RGB")


@dataclass(frozen=True)
class ImageRef:
    """An image to encode. ``path`` for files; ``image`` for in-memory pictures (scenes);
    ``data`` for encoded file bytes held in memory (a WebDataset/Parquet/HF-dataset sample)."""

    path: Path | None = None
    image: Image.Image | None = field(default=None, compare=False, repr=False)
    name: str = ""  # shown in errors (e.g. the manifest line, or shard:key)
    data: bytes | None = field(default=None, compare=False, repr=False)

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
        if self.data is not None:  # the same picture stored twice in a shard is encoded once
            return "bytes:" + hashlib.blake2b(self.data, digest_size=16).hexdigest()
        return f"obj:{id(self.image)}"

    def read(self) -> tuple[str, bytes | Image.Image]:
        """Read without decoding: (content key, file bytes or in-memory image).

        The key is the SHA-256 of the file's bytes (or of the pixels), so the
        cache can be consulted before paying for a decode.
        """
        if self.image is not None:
            im = to_rgb(self.image, self.where())
            h = hashlib.sha256(f"{im.size}".encode())
            h.update(im.tobytes())
            return "px:" + h.hexdigest(), im
        if self.data is not None:  # same key as the same bytes read from a file
            return "sha256:" + hashlib.sha256(self.data).hexdigest(), self.data
        try:
            st = os.stat(self.path)  # before opening: opening a FIFO blocks, /dev/zero never ends
            if not stat.S_ISREG(st.st_mode):
                raise InputError(self.where(), "not a regular file (a FIFO, device or folder); expected an image file")
            if st.st_size > MAX_FILE_BYTES:
                raise InputError(self.where(), f"image file is {st.st_size:,} bytes, over the {MAX_FILE_BYTES:,}-byte "
                                               "limit (capscore.data.images.MAX_FILE_BYTES)")
            data = self.path.read_bytes()
        except FileNotFoundError:
            raise InputError(self.where(), "image file not found") from None
        except (OSError, ValueError) as e:  # ValueError: a path with a NUL byte
            raise InputError(self.where(), f"cannot read image file ({getattr(e, 'strerror', None) or e})") from None
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
                check_dimensions(im.size, self.where())  # from the header, before decoding
                im.load()  # forces a full decode: truncated files fail here
                return to_rgb(im, self.where()) if convert_rgb else im.copy()
        except Image.DecompressionBombError as e:
            raise InputError(self.where(), f"image is over the {MAX_PIXELS / 1e6:.1f} megapixel limit "
                                           f"(decompression-bomb guard: {e}); downscale it first") from None
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
            msg = "not an image file" if isinstance(e, UnidentifiedImageError) else f"unreadable or truncated image ({e})"
            raise InputError(self.where(), msg) from None

    def load(self, *, convert_rgb: bool = True) -> tuple[str, Image.Image]:
        """Read and decode: (content key, RGB image). Raises InputError naming the file."""
        key, payload = self.read()
        return key, self.decode(payload, convert_rgb=convert_rgb)
