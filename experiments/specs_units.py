"""SPECS detail units: the three chunk grammars of ``capscore.probes.segment`` side by side.

``capscore`` (capscore's grammar and merge rules), ``paper`` (SPECS App. A's grammar with the §4.2 rules) and
``reference`` (the authors' chunker, ``data/preprocessing/chunk_preprocessing.py``) on two caption sets:
``--n`` long captions of generated scenes (``generate_scenes(n, seed=--seed, split="train")``, English) and
the hand-written captions below (natural long-caption phrasing: several sentences, leading prepositional
phrases, possessives, a decimal number, abbreviations). Per grammar: units per caption, words per unit,
units of at most two words, units with no noun, pronoun or number (fragments such as "There is" or "The
image shows"), and agreement with the other grammars: captions cut identically, and the F1 of the cut
positions (character offsets between units) against capscore's.

    python experiments/specs_units.py --n 200 --seed 0 --out docs/research/specs-detail-units.md
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

GRAMMARS = ("capscore", "paper", "reference")
HANDWRITTEN = (
    "A British Shorthair cat with plush, bluish-gray fur is lounging on a deep green velvet sofa. The cat is "
    "partially tucked under a multi-colored woven blanket with fringed edges.",
    "A front view of a statue on cement in a park.",
    "To the left of the car there is a box. In the corner, a tall lamp stands next to an old wooden chair.",
    "The image shows a busy street at night. The shop's neon sign is glowing red and blue. On the sidewalk are "
    "two people holding umbrellas.",
    "A 3.5 inch screen sits on the desk... Behind it, Mr. Smith's coffee mug is half empty.",
    "Two dogs are running across a grassy field under a cloudy sky. The larger dog is brown, and the smaller one "
    "is white with black spots.",
    "In this photograph, a young woman in a yellow raincoat walks down a narrow cobblestone alley. Above her, "
    "laundry hangs between the buildings. The walls are painted in faded pastel colors.",
    "A close-up of a plate of pasta with tomato sauce, basil leaves and grated parmesan. The fork rests on the "
    "left side of the plate, next to a glass of red wine.",
    "The kitchen is bright and modern. Out of the window, you can see a garden with roses. Up on the shelf, "
    "there are jars of spices.",
    "An aerial view of a coastal town with white houses and red roofs. The sea is calm and turquoise, and "
    "several boats are moored in the small harbor.",
    "A man is sitting on a bench. He is reading a newspaper while a pigeon pecks at crumbs near his feet.",
    "The cat sleeps. The dog barks loudly at the mailman, who is standing by the gate.",
    "Under the bridge, the river flows slowly. Next to the bank is a small red boat tied to a post.",
    "A snowy mountain peak rises above a pine forest; in the foreground, a frozen lake reflects the pale blue sky.",
)


def _cuts(spans: list[tuple[int, int]]) -> set[int]:
    """Where one unit ends and the next begins (the start offset of every unit but the first)."""
    return {a for a, _ in spans[1:]}


def _f1(a: set[int], b: set[int]) -> float:
    if not a and not b:
        return 1.0
    return 2 * len(a & b) / (len(a) + len(b))


def measure(captions: list[str], nlp) -> list[dict]:
    from capscore.probes.segment import detail_unit_spans

    spans = {g: [detail_unit_spans(c, nlp=nlp, grammar=g) for c in captions] for g in GRAMMARS}
    rows = []
    for g in GRAMMARS:
        units = [c[a:b] for c, ss in zip(captions, spans[g]) for a, b in ss]
        docs = list(nlp.pipe(units))
        fragment = [not any(t.pos_ in ("NOUN", "PROPN", "PRON", "NUM") for t in d) for d in docs]
        words = np.array([len(u.split()) for u in units])
        row = {"grammar": g, "captions": len(captions), "units": len(units),
               "units per caption": len(units) / len(captions), "words per unit": float(words.mean()),
               "units <= 2 words": float(np.mean(words <= 2)), "no noun/pronoun/number": float(np.mean(fragment))}
        for other in GRAMMARS:
            if other != g:
                row[f"same cuts as {other}"] = sum(x == y for x, y in zip(spans[g], spans[other]))
        row["cut F1 vs capscore"] = float(np.mean([_f1(_cuts(x), _cuts(y))
                                                   for x, y in zip(spans[g], spans["capscore"])]))
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        cells = [(f"{r[k]:.3f}" if isinstance(r.get(k), float) else str(r.get(k, "—"))) for k in keys]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    from capscore.probes.segment import detail_units, load_parser
    from capscore.scenes import generate_scenes

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200, help="scene long captions")
    ap.add_argument("--seed", type=int, default=0, help="scenes seed (train split)")
    ap.add_argument("--out", help="write the Markdown report here too")
    ap.add_argument("--examples", type=int, default=4, help="hand-written captions to print cut by each grammar")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    nlp = load_parser()
    scenes = [s.long_caption() for s in generate_scenes(a.n, seed=a.seed, split="train")]
    parts = [f"## {a.n} scene long captions (seed {a.seed}, train split)\n", table(measure(scenes, nlp)),
             f"\n## {len(HANDWRITTEN)} hand-written captions\n", table(measure(list(HANDWRITTEN), nlp)),
             "\n## Examples\n"]
    for c in HANDWRITTEN[: a.examples]:
        parts.append(f"*{c}*\n")
        parts += [f"- {g}: " + " \\| ".join(detail_units(c, nlp=nlp, grammar=g)) for g in GRAMMARS]
        parts.append("")
    parts.append(f"spaCy model: {nlp.meta['lang']}_{nlp.meta['name']} {nlp.meta['version']}; "
                 f"{time.perf_counter() - t0:.1f} s")
    text = "\n".join(parts) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
