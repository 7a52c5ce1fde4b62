"""``capscore models``: the --model grammar, the bundled models and what each is for."""
from __future__ import annotations


def configure(p) -> None:
    p.add_argument("--arch", action="store_true", help="also list open_clip architecture names")
    p.add_argument("--metrics", action="store_true",
                   help="list the registered metrics instead (built-in and plug-ins of the capscore.metrics "
                        "entry-point group), with what each needs")


def describe_metrics() -> str:
    """One line per registered metric (media, what it needs, its citation) and one per plug-in that failed."""
    from capscore.report.tables import format_table
    from capscore.scores.metric import PLUGIN_ERRORS, registry

    rows = []
    for name, m in registry().items():
        model = "own models (--metric-weights)" if m.own_models else "none (text only)" if m.text_only() else \
            "--model (a CLIP-style backbone)"
        rows.append({"metric": name, "scores": "/".join(m.media), "references": "yes" if m.needs_refs else "no",
                     "model": model, "citation": m.citation[:70]})
    lines = [format_table(rows, indent="  ")]
    lines += [f"  plug-in {name!r} not loaded: {why}" for name, why in PLUGIN_ERRORS.items()]
    return "\n".join(lines)


def run(args) -> int:
    from capscore.backbones.registry import describe_models

    if args.metrics:
        print("metrics (--metric):")
        print(describe_metrics())
        return 0
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
