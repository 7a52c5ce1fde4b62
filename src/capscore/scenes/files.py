"""Synthetic scenes as files: ``images/ID.png`` and ``scenes.jsonl`` (one row per scene: its short and long
captions, translations, objects and ground-truth facts), for scoring with ``capscore score``."""
from __future__ import annotations

import json
from pathlib import Path

from capscore.errors import param_error
from capscore.scenes import generate_scenes, truth


def write_scenes(out: Path, n: int, *, seed: int = 0, split: str = "all", size: int = 64) -> int:
    """Draw ``n`` scenes of ``split`` at ``size`` px and write them under the folder ``out`` -> n."""
    if n < 1:
        raise param_error("n", "write_scenes", "an integer >= 1", n)
    (out / "images").mkdir(parents=True, exist_ok=True)
    with open(out / "scenes.jsonl", "w", encoding="utf-8") as f:
        for s in generate_scenes(n, seed=seed, split=split, size=size):
            s.render().save(out / "images" / f"{s.id}.png")
            row = {"id": s.id, "image": f"images/{s.id}.png", "caption": s.short_caption(),
                   "long_caption": s.long_caption(), "translations": s.translations(), "heldout": s.heldout,
                   "objects": [o.__dict__ for o in s.objects], "facts": sorted(map(repr, truth(s)))}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return n
