"""``capscore models``: the --model grammar, the bundled models and what each is for."""
from __future__ import annotations


def configure(p) -> None:
    p.add_argument("--arch", action="store_true", help="also list open_clip architecture names")


def run(args) -> int:
    from capscore.backbones.registry import describe_models

    print("--model grammar:")
    print(describe_models())
    if args.arch:
        import textwrap

        import open_clip

        import capscore.backbones.openclip  # noqa: F401  (registers capscore's own architectures)

        names = open_clip.list_models()
        print(f"\nopen_clip architectures ({len(names)}; ARCH for random weights, ARCH/TAG with a pretrained tag):")
        print(textwrap.fill("  ".join(names), 100, initial_indent="  ", subsequent_indent="  ",
                            break_on_hyphens=False, break_long_words=False))
    return 0
