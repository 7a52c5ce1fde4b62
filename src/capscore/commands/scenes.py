"""``capscore scenes``: generate synthetic scenes and evaluate a model on them (see docs/scenes.md);
scenes-tiny is trained by the ``scenes-tiny`` recipe of ``capscore train``."""
from __future__ import annotations

import json

from capscore.commands._args import add_common, add_device, add_model, output_dir, output_file, positive_int, seed
from capscore.errors import CapscoreError


def configure(p) -> None:
    sub = p.add_subparsers(dest="scenes_command", metavar="ACTION", required=True)
    g = sub.add_parser("generate", help="write scenes as PNG files plus a JSONL of captions and ground truth")
    g.add_argument("--n", type=positive_int, default=16, help="number of scenes (default 16)")
    g.add_argument("--seed", type=seed, default=0)
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
    e.add_argument("--seed", type=seed, default=None, help="evaluation seed (default 12345)")
    e.add_argument("--prefix", default="", help="text prepended to every caption (default none)")
    e.add_argument("--by-objects", action="store_true",
                   help="also print each flip kind's accuracy by the number of objects in the scene")
    e.add_argument("--by-binding", action="store_true",
                   help="also print colour, shape, count and hallucination accuracy on free items and on bound "
                        "items (every value the error introduces is elsewhere in the scene: only binding tells)")
    e.add_argument("--out", metavar="FILE", help="also write the results as JSON")
    for action in (g, e):
        add_common(action)  # -q / --debug after the action too


def _generate(args) -> int:
    from capscore.scenes.tiny import input_size

    args.size = input_size() if args.size is None else args.size
    out = output_dir(args.out)
    video_opts = {"frames": args.frames, "fps": args.fps, "codec": args.codec}
    if not args.videos and any(v is not None for v in video_opts.values()):
        raise CapscoreError("--frames, --fps and --codec apply to --videos only")
    if args.videos:
        from capscore.scenes.video import write_scenes_videos

        write_scenes_videos(out, args.n, seed=args.seed, size=args.size, split=args.split,
                            **{k: v for k, v in video_opts.items() if v is not None})
        print(f"wrote {args.n} clips to {out}/ (videos/*.mp4 and captions.jsonl with oracle scores); score them with\n"
              f"  capscore score --videos {out}/videos --captions {out}/captions.jsonl --metric pac-s --out scores.jsonl")
        return 0
    from capscore.scenes.files import write_scenes

    write_scenes(out, args.n, seed=args.seed, split=args.split, size=args.size)
    print(f"wrote {args.n} scenes to {out}/ (images/ and scenes.jsonl)")
    return 0


def _eval(args) -> int:
    from capscore._log import is_quiet
    from capscore.backbones import load_backbone
    from capscore.embed.engine import Encoder
    from capscore.scenes.evaluate import EVAL_SEED, evaluate_scenes, format_report

    out = output_file(args.out) if args.out else None  # a folder or an unwritable place fails now, not at the end
    encoder = Encoder(load_backbone(args.model, device=args.device, dtype=args.dtype), progress=not is_quiet())
    res = evaluate_scenes(encoder, n=args.n, seed=EVAL_SEED if args.seed is None else args.seed,
                          prefix=args.prefix)
    print(format_report(res, by_objects=args.by_objects, by_binding=args.by_binding))
    if out:
        out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


def run(args) -> int:
    return {"generate": _generate, "eval": _eval}[args.scenes_command](args)
