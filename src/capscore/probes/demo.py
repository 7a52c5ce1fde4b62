"""The ``capscore demo`` run: offline, no downloads, under a minute.

:func:`run_demo` generates a small set of synthetic scenes (exact ground truth, :mod:`capscore.scenes`),
writes their images, scores each scene's correct captions and their controlled-error twins with CLIP-S
(Hessel et al. 2021, eq. 1: w = 2.5, prefix "A photo depicts ") through the same encoder and scoring loop
as ``capscore score``, and runs one probe: for each error kind, the share of pairs where the correct
caption scores strictly higher than its flawed twin. Re-runs with the same options give the same numbers.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
import numpy as np

from capscore.errors import CapscoreError, param_error
from capscore.backbones import load_backbone
from capscore.data.records import Record
from capscore.embed.engine import Encoder
from capscore.pipeline import Summary, score_all
from capscore.report.tables import format_table
from capscore.scenes import applicable_errors, generate_scenes, make_flaw, render_size
from capscore.scenes.captions import short

DEMO_KINDS = ("color", "shape", "count", "attribute_swap", "relation", "hallucination")


@dataclass(frozen=True)
class DemoResult:
    """What the demo measured and how (written to ``summary.json``)."""

    model: str
    backbone_identity: str
    metric: str
    seed: int
    n_scenes: int
    mean_clip_s: dict[str, float]  # "correct" (short captions), "<kind>:correct", "<kind>:flawed"
    probe: dict[str, dict[str, float]]  # kind -> {"n", "correct_wins", "mean_gap"}
    oracle_f1: dict[str, float]  # mean oracle F1 of the short captions and of the flawed captions


def build_records(scenes, image_dir: Path, *, seed: int):
    """One record per caption: each scene's short caption plus, per applicable kind, a correct/flawed twin pair."""
    records, meta = [], {}
    for s in scenes:
        path = image_dir / f"{s.id}.png"
        s.render().save(path)
        records.append(Record.make(f"{s.id}/short", path, s.short_caption(), system="correct"))
        meta[f"{s.id}/short"] = (s, None, "correct")
        ok = applicable_errors(s)
        for k, kind in enumerate(DEMO_KINDS):
            if kind not in ok:
                continue
            flaw = make_flaw(s, kind, np.random.default_rng([seed, s.index, k]))
            for which, cap in (("correct", flaw.correct_caption), ("flawed", flaw.flawed_caption)):
                rid = f"{s.id}/{kind}/{which}"
                records.append(Record.make(rid, path, cap.text, system=f"{kind}:{which}"))
                meta[rid] = (s, cap, which)
    return records, meta


def run_demo(out: Path, *, n: int = 60, seed: int = 7, model: str = "scenes-tiny", device: str = "cpu",
             dtype: str = "fp32", log=print) -> DemoResult:
    if n < 2:
        raise param_error("n", "run_demo", "an integer >= 2", n)
    if out.exists() and not out.is_dir():
        raise param_error("out", "run_demo", "a folder (not an existing file)", str(out))
    backbone = load_backbone(model, device=device, dtype=dtype)  # before touching out: a bad model leaves nothing behind
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CapscoreError(f"{out}: cannot create the folder ({e.strerror or e})") from None
    (out / "images").mkdir(exist_ok=True)
    scenes = generate_scenes(n, seed=seed, split="all", size=render_size(backbone))
    records, meta = build_records(scenes, out / "images", seed=seed)
    encoder = Encoder(backbone, batch_size=128)
    summary = Summary("clip-s")
    rows = []
    with open(out / "scores.jsonl", "w", encoding="utf-8") as f:
        for row in score_all(records, encoder, "clip-s"):
            s, cap, _ = meta[row["id"]]
            row["oracle_f1"] = s.oracle(cap if cap is not None else short(s)).f1
            summary.add(row)
            rows.append(row)
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    by_id = {r["id"]: r for r in rows}
    probe = {}
    for kind in DEMO_KINDS:
        pairs = [(by_id[f"{s.id}/{kind}/correct"]["score"], by_id[f"{s.id}/{kind}/flawed"]["score"])
                 for s in scenes if f"{s.id}/{kind}/correct" in by_id]
        if pairs:
            a = np.array(pairs)
            probe[kind] = {"n": len(a), "correct_wins": float((a[:, 0] > a[:, 1]).mean()),
                           "mean_gap": float((a[:, 0] - a[:, 1]).mean())}
    flawed_f1 = [r["oracle_f1"] for r in rows if r["system"].endswith(":flawed")]
    result = DemoResult(
        model=model, backbone_identity=backbone.identity, metric="clip-s (w=2.5, prefix 'A photo depicts ')",
        seed=seed, n_scenes=n, mean_clip_s=summary.system_means(), probe=probe,
        oracle_f1={"short": float(np.mean([r["oracle_f1"] for r in rows if r["system"] == "correct"])),
                   "flawed": float(np.mean(flawed_f1)) if flawed_f1 else float("nan")},
    )
    (out / "summary.json").write_text(json.dumps(asdict(result), indent=1) + "\n")
    return result


def format_summary(res: DemoResult, out: Path) -> str:
    m = res.mean_clip_s
    lines = [
        f"capscore demo — {res.n_scenes} synthetic scenes (seed {res.seed}), model {res.model}, {res.metric}",
        f"  mean CLIP-S of the short captions: {m.get('correct', float('nan')):.3f}"
        f"   (oracle F1 {res.oracle_f1['short']:.2f}: true but incomplete)",
        "",
        "  probe: does the correct caption outscore its twin with one controlled error?",
        format_table([{"error kind": kind, "pairs": p["n"], "correct wins": f"{p['correct_wins']:.1%}",
                       "mean CLIP-S gap": p["mean_gap"]} for kind, p in res.probe.items()], digits=3),
    ]
    lines += ["", f"  wrote {out}/summary.json, {out}/scores.jsonl (one row per caption, with its oracle F1) "
              f"and {out}/images/"]
    return "\n".join(lines)
