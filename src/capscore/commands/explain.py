"""``capscore explain``: token–patch similarity heat map of one word of a caption over an image.

The picture ABE-CLIP uses to show binding: where in the image the word's token
finds its best patches, before (default) or after (``--refined``) semantic
refinement. The K best patches (ABE's top-K) are outlined.
"""
from __future__ import annotations

from pathlib import Path

from capscore._optional import require
from capscore.commands._args import add_device, add_model, positive_int

COLOR_RANGE = (-1.0, 1.0)  # fixed, so two maps (words, images, models) share one colour scale
OVERLAY_ALPHA = 0.4  # the image stays readable under the heat map
PNG_KEY = "capscore-explain"  # PNG text chunk: JSON describing the map (read by `capscore report`)


def configure(p) -> None:
    add_model(p, single=True)
    p.add_argument("--image", required=True, help="image file")
    p.add_argument("--caption", required=True, help="caption text")
    p.add_argument("--word", required=True, help="a word of the caption")
    p.add_argument("--out", required=True, help="PNG file to write")
    p.add_argument("--refined", action="store_true", help="use the refined token t' (ABE semantic refinement)")
    p.add_argument("--k", type=positive_int, default=5, help="number of best patches to outline (ABE's K; default 5)")
    p.add_argument("--pool", default=None, help="concept pool file for --refined (default: bundled pool)")
    add_device(p)
    p.add_argument("--seed", type=int, default=0, help="seed for random-init architectures")
    p.add_argument("--color-range", type=float, nargs=2, default=COLOR_RANGE, metavar=("LOW", "HIGH"),
                   help="cosine values mapped to the ends of the colour scale, the same for every map so maps "
                        "compare (default -1 1, the whole cosine range)")


def run(args) -> int:
    from capscore.backbones import load_backbone
    from capscore.embed import Encoder
    from capscore.embed.images import ImageRef
    from capscore.errors import CapscoreError
    from capscore.scores.abe import AbeConfig, word_heatmap

    out = Path(args.out)
    if out.suffix.lower() != ".png":
        raise CapscoreError(f"--out must be a .png file; got {str(out)!r}")
    low, high = args.color_range
    if not low < high:
        raise CapscoreError(f"--color-range LOW HIGH needs LOW < HIGH; got {low} {high}")
    config = AbeConfig(k=args.k, pool=args.pool)
    encoder = Encoder(load_backbone(args.model, device=args.device, dtype=args.dtype, seed=args.seed))
    ref = ImageRef.of(args.image)
    heat = word_heatmap(encoder, ref, args.caption, args.word, config=config, refined=args.refined)
    _, image = ref.load()
    about = {"model": args.model, "image": str(args.image), "caption": args.caption, "word": heat.word,
             "refined": heat.refined, "k": args.k, "max": float(heat.grid.max()), "min": float(heat.grid.min())}
    draw_heatmap(image, heat, caption=args.caption, out=out, color_range=(low, high), about=about)
    print(f"wrote {out} (word {heat.word!r} -> tokens {list(heat.tokens)}, "
          f"max cos {float(heat.grid.max()):.3f}, min {float(heat.grid.min()):.3f})")
    return 0


def draw_heatmap(image, heat, *, caption: str, out: Path, color_range: tuple[float, float] = COLOR_RANGE,
                 about: dict | None = None) -> None:
    """The centre-cropped image, the heat map over it (one cell per patch), the top-K patches outlined.

    Colours: a diverging map centred on cosine 0 over the fixed ``color_range`` (not each map's own
    min..max, which made a uniformly weak map look as hot as a strong one), drawn at
    :data:`OVERLAY_ALPHA` so the image shows through. ``about`` is stored as JSON in the PNG's
    ``capscore-explain`` text chunk, so `capscore report` can caption the picture.
    """
    import json

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
