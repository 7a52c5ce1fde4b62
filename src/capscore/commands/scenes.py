"""``capscore scenes``: generate synthetic scenes and evaluate a model on them (see docs/scenes.md);
scenes-tiny is trained by the ``scenes-tiny`` recipe of ``capscore train``."""
from __future__ import annotations

import json
from pathlib import Path

from capscore.commands._args import add_common, add_device, add_model, output_dir, output_file, positive_int
from capscore.errors import CapscoreError


def configure(p) -> None:
    sub = p.add_subparsers(dest="scenes_command", metavar="ACTION", required=True)
    g = sub.add_parser("generate", help="write scenes as PNG files plus a JSONL of captions and ground truth")
    g.add_argument("--n", type=positive_int, default=16, help="number of scenes (default 16)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--split", default="all", choices=("train", "heldout", "all"))
    g.add_argument("--size", type=positive_int, default=None,
                   help="image side in pixels (default: the input size of the bundled scenes-tiny, 96)")
    g.add_argument("--out", required=True, metavar="DIR")
    g.add_argument("--videos", action="store_true",
                   help="write moving-object clips as .mp4 files (videos/) with graded motion captions and their "
                        "oracle scores (captions.jsonl) instead of still images; see docs/video.md")
    g.add_argument("--frames", type=int, default=None, metavar="N", help="--videos: frames per clip (default 8)")
    g.add_argument("--fps", type=float, default=None, help="--videos: frame rate (default 4)")
    g.add_argument("--codec", default=None, choices=("lossless", "h264"),
                   help="--videos: lossless RGB H.264 (default; decoded frames equal the rendered ones) or lossy H.264")

    e = sub.add_parser("eval", help="evaluate a model on held-out scenes (flips, retrieval; seen vs unseen)")
    add_model(e, single=True)
    add_device(e)
    e.add_argument("--n", type=positive_int, default=300, help="scenes per set (default 300)")
    e.add_argument("--seed", type=int, default=None, help="evaluation seed (default 12345)")
    e.add_argument("--prefix", default="", help="text prepended to every caption (default none)")
    e.add_argument("--by-objects", action="store_true",
                   help="also print each flip kind's accuracy by the number of objects in the scene")
    e.add_argument("--by-binding", action="store_true",
                   help="also print colour, shape, count and hallucination accuracy on free items and on bound "
                        "items (every value the error introduces is elsewhere in the scene: only binding tells)")
    e.add_argument("--out", metavar="FILE", help="also write the results as JSON")
    for action in (g, e):
        add_common(action)  # -q / --debug after the action too


def default_size(model: str = "scenes-tiny") -> int:
    """The input size of bundled ``model``, read from its files (the architecture its weights name, that
    architecture's open_clip config), without building the model."""
    from capscore.scenes.tiny import BUNDLED_FILES, WEIGHTS_DIR, weights_arch

    config = WEIGHTS_DIR.parents[1] / "backbones" / "configs" / f"{weights_arch(BUNDLED_FILES[model])}.json"
    return int(json.loads(config.read_text())["vision_cfg"]["image_size"])


def _generate(args) -> int:
    from capscore.scenes import generate_scenes, truth

    args.size = default_size() if args.size is None else args.size
    if args.n < 1:
        raise CapscoreError(f"--n must be >= 1; got {args.n}")
    out = output_dir(args.out)
    video_opts = {"frames": args.frames, "fps": args.fps, "codec": args.codec}
    if not args.videos and any(v is not None for v in video_opts.values()):
        raise CapscoreError("--frames, --fps and --codec apply to --videos only")
    if args.videos:
        from capscore.scenes.video import write_scenes_videos

        args.frames = 8 if args.frames is None else args.frames
        args.fps = 4.0 if args.fps is None else args.fps
        args.codec = args.codec or "lossless"
        if args.frames < 2 or args.fps <= 0:
            raise CapscoreError(f"--frames must be >= 2 and --fps > 0; got {args.frames}, {args.fps}")
        write_scenes_videos(out, args.n, seed=args.seed, frames=args.frames, fps=args.fps, size=args.size,
                            split=args.split, codec=args.codec)
        print(f"wrote {args.n} clips to {out}/ (videos/*.mp4 and captions.jsonl with oracle scores); score them with\n"
              f"  capscore score --videos {out}/videos --captions {out}/captions.jsonl --metric pac-s --out scores.jsonl")
        return 0
    (out / "images").mkdir(parents=True, exist_ok=True)
    with open(out / "scenes.jsonl", "w", encoding="utf-8") as f:
        for s in generate_scenes(args.n, seed=args.seed, split=args.split, size=args.size):
            s.render().save(out / "images" / f"{s.id}.png")
            row = {"id": s.id, "image": f"images/{s.id}.png", "caption": s.short_caption(),
                   "long_caption": s.long_caption(), "translations": s.translations(), "heldout": s.heldout,
                   "objects": [o.__dict__ for o in s.objects], "facts": sorted(map(repr, truth(s)))}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {args.n} scenes to {out}/ (images/ and scenes.jsonl)")
    return 0


def _eval(args) -> int:
    from capscore._log import is_quiet
    from capscore.backbones import load_backbone
    from capscore.embed.engine import Encoder
    from capscore.scenes.evaluate import EVAL_SEED, evaluate_scenes, format_report

    if args.out:
        output_file(args.out)  # a folder or an unwritable place fails now, not after the evaluation
    encoder = Encoder(load_backbone(args.model, device=args.device, dtype=args.dtype), progress=not is_quiet())
    res = evaluate_scenes(encoder, n=args.n, seed=EVAL_SEED if args.seed is None else args.seed,
                          prefix=args.prefix)
    print(format_report(res, by_objects=args.by_objects, by_binding=args.by_binding))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


def run(args) -> int:
    return {"generate": _generate, "eval": _eval}[args.scenes_command](args)
