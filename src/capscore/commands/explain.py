"""``capscore explain``: token–patch similarity heat map of one word of a caption over an image, before
(default) or after (``--refined``) ABE's semantic refinement (:mod:`capscore.probes.explain`)."""
from __future__ import annotations

from capscore.commands._args import add_device, add_model, positive_int, seed
from capscore.report.explain import COLOR_RANGE


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
    p.add_argument("--seed", type=seed, default=0, help="seed for random-init architectures")
    p.add_argument("--color-range", type=float, nargs=2, default=COLOR_RANGE, metavar=("LOW", "HIGH"),
                   help="cosine values mapped to the ends of the colour scale, the same for every map so maps "
                        "compare (default -1 1, the whole cosine range)")


def run(args) -> int:
    from capscore.errors import CapscoreError
    from capscore.probes.explain import explain_word

    low, high = args.color_range
    if not low < high:
        raise CapscoreError(f"--color-range LOW HIGH needs LOW < HIGH; got {low} {high}")
    heat = explain_word(args.model, args.image, args.caption, args.word, out=args.out, refined=args.refined, k=args.k,
                        pool=args.pool, device=args.device, dtype=args.dtype, seed=args.seed, color_range=(low, high))
    print(f"wrote {args.out} (word {heat.word!r} -> tokens {list(heat.tokens)}, "
          f"max cos {float(heat.grid.max()):.3f}, min {float(heat.grid.min()):.3f})")
    return 0
