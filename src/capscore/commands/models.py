"""``capscore models``: the --model grammar."""
from __future__ import annotations


def configure(p) -> None:
    p.add_argument("--arch", action="store_true", help="also list open_clip architecture names")


def run(args) -> int:
    from capscore.backbones.registry import describe_models

    print("--model grammar:")
    print(describe_models())
    if args.arch:
        import open_clip

        print("\nopen_clip architectures:", ", ".join(open_clip.list_models()))
    return 0
