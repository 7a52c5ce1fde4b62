"""The ``capscore explain`` picture: a token–patch similarity heat map of one word over an image.

The picture ABE-CLIP (Zhang et al., abe-clip.txt) uses to show binding: where in the image the word's
token finds its best patches, before or after semantic refinement (the map itself is
:func:`capscore.scores.abe.word_heatmap`); the K best patches (ABE's top-K) are outlined. A description of
the map is stored in the PNG's ``capscore-explain`` text chunk, which ``capscore report`` reads.
"""
from __future__ import annotations

from pathlib import Path
import json

from capscore.report.runs import EXPLAIN_PNG_KEY as PNG_KEY
from capscore._optional import require

COLOR_RANGE = (-1.0, 1.0)  # fixed, so two maps (words, images, models) share one colour scale
OVERLAY_ALPHA = 0.4  # the image stays readable under the heat map


def draw_heatmap(image, heat, *, caption: str, out: Path, color_range: tuple[float, float] = COLOR_RANGE,
                 about: dict | None = None) -> None:
    """The centre-cropped image, the heat map over it (one cell per patch), the top-K patches outlined.

    Colours: a diverging map centred on cosine 0 over the fixed ``color_range`` (not each map's own
    min..max, which made a uniformly weak map look as hot as a strong one), drawn at
    :data:`OVERLAY_ALPHA` so the image shows through. ``about`` is stored as JSON in the PNG's
    ``capscore-explain`` text chunk, so `capscore report` can caption the picture.
    """
    matplotlib = require("matplotlib", purpose="capscore explain")

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    side = heat.grid.shape[0]
    w, h = image.size
    m = min(w, h)  # CLIP preprocessing: resize the short side, then centre-crop a square
    square = image.crop(((w - m) // 2, (h - m) // 2, (w - m) // 2 + m, (h - m) // 2 + m)).resize((side * 32, side * 32))
    cell = square.width / side
    fig, axes = plt.subplots(1, 2, figsize=(8, 4.4))
    axes[0].imshow(square)
    axes[0].set_title("image")
    axes[1].imshow(square)
    im = axes[1].imshow(heat.grid.numpy(), cmap="coolwarm", vmin=color_range[0], vmax=color_range[1],
                        alpha=OVERLAY_ALPHA, extent=(0, square.width, square.height, 0), interpolation="nearest")
    for idx in heat.topk:
        r, c = divmod(idx, side)
        axes[1].add_patch(Rectangle((c * cell, r * cell), cell, cell, fill=False, edgecolor="black", linewidth=2))
    kind = "refined t'" if heat.refined else "token"
    axes[1].set_title(f"cos({kind} '{heat.word}', patch)")
    fig.colorbar(im, ax=axes[1], fraction=0.046)
    for ax in axes:
        ax.axis("off")
    fig.suptitle(caption if len(caption) < 90 else caption[:87] + "...", fontsize=9)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {PNG_KEY: json.dumps({**(about or {}), "color_range": list(color_range)}, ensure_ascii=False)}
    fig.savefig(out, dpi=100, bbox_inches="tight", metadata=meta)
    plt.close(fig)
