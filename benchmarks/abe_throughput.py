"""ABE-CLIP's wall time against CLIP-S on the same pairs, measured side by side in one run.

Data: 224x224 PNGs (score_throughput.py's generator), ``--per-image`` captions each
(default 5: 100 pairs = 20 images). ``--captions words`` (default) keeps that
generator's random-word captions (the project's throughput setup, 6-18 words);
``--captions attributes`` writes attribute-heavy ones ("a small red cube next to a
blue table"), where spaCy finds 1-3 attribute–object pairs in every caption and ABE
encodes ~10 short phrases per caption (its costliest case). Model:
random-init ViT-B-32 (open_clip, ``pretrained=None``, seed 0), fp32, CPU, 2 threads.

For each size in ``--sizes`` (pairs) it runs, each on a fresh persistent cache:

* CLIP-S cold: ``capscore.pipeline.score_all(..., "clip-s")`` — the ``capscore score`` path;
* ABE cold: ``score_all(..., "abe")`` on a cache that holds only the concept
  pool of this backbone (the pool is encoded once per backbone and machine; the
  first-ever run's extra cost is printed separately as "ABE cold, empty cache");

best of ``--repeats`` each, interleaved, and prints the ratio ABE/CLIP-S (target ≤ 1.5)
in wall and CPU seconds, with the load average.

Scores are compared with a reference: ``--save-reference FILE`` writes this run's ABE
and CLIP-S scores (run it on the code *before* a change), ``--reference FILE`` (default:
``benchmarks/data/abe_throughput_reference.json`` when present) checks that every score
matches within 1e-6.

    python benchmarks/abe_throughput.py                          # 100 and 1,000 pairs
    python benchmarks/abe_throughput.py --sizes 100 --repeats 1
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from score_throughput import make_data, timed  # noqa: E402

DEFAULT_REFERENCE = Path(__file__).parent / "data" / "abe_throughput_reference.json"
COLORS = "red blue green yellow black white brown gray orange purple pink".split()
SIZES = "small large big tiny tall short old young wooden metal".split()
NOUNS = ("cube sphere cylinder car bus dog cat man woman table chair cup plate bike horse boat tree "
         "house shirt hat bag ball book lamp door window bird sign truck").split()
PLACES = "on the grass|next to a {a} {n}|in front of a {a} {n}|on a {a} table|near the {n}|in the street".split("|")


def make_captions(rows: list[dict], seed: int = 0) -> list[dict]:
    """Replace the generator's random-word captions by attribute–object captions."""
    rng = np.random.default_rng(seed)
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    for r in rows:
        head = f"a {pick(SIZES)} {pick(COLORS)} {pick(NOUNS)}" if rng.random() < 0.5 else f"a {pick(COLORS)} {pick(NOUNS)}"
        tail = pick(PLACES).format(a=pick(COLORS), n=pick(NOUNS))
        r["caption"] = f"{head} {tail}" if rng.random() < 0.7 else f"{head} and a {pick(COLORS)} {pick(NOUNS)}"
    return rows


def run(bb, images_dir: Path, captions: Path, cache_dir: Path, metric: str):
    from capscore.data.captions import index_images, read_captions
    from capscore.embed import EmbeddingCache, Encoder
    try:
        from capscore.pipeline import score_all
    except ImportError:
        score_all = None
        from capscore.scores.scorer import score_pair_records, score_records

    enc = Encoder(bb, cache=EmbeddingCache(cache_dir))
    records = list(read_captions(captions, images=index_images(images_dir)))
    if score_all is not None:  # the Metric pipeline (after the registry merge)
        seconds, rows = timed(lambda: list(score_all(records, enc, metric, prefix="")))
    elif metric == "abe":
        seconds, rows = timed(lambda: score_pair_records(records, enc, "abe"))
    else:
        seconds, rows = timed(lambda: list(score_records(records, enc, metric, prefix="")))
    return seconds, [r["score"] for r in rows], enc


def warm_pool(bb, cache_dir: Path) -> None:
    """Put this backbone's concept-pool encodings into ``cache_dir`` (what one earlier ABE run leaves)."""
    from capscore.embed import EmbeddingCache, Encoder
    from capscore.scores.concepts import load_concept_pool

    enc = Encoder(bb, cache=EmbeddingCache(cache_dir))
    try:
        from capscore.scores.concepts import pool_vectors  # the cached matrix, where the code has it
    except ImportError:
        enc.encode_texts(list(load_concept_pool(None).words))
    else:
        pool_vectors(enc, load_concept_pool(None))
    enc.cache.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="100,1000", help="pair counts, comma-separated (default 100,1000)")
    p.add_argument("--per-image", type=int, default=5)
    p.add_argument("--captions", choices=("words", "attributes"), default="words")
    p.add_argument("--model", default="ViT-B-32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--save-reference", type=Path)
    p.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE if DEFAULT_REFERENCE.exists() else None)
    args = p.parse_args()

    from capscore.backbones import load_backbone

    torch.set_num_threads(args.threads)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bb = load_backbone(args.model, seed=0)
    with torch.inference_mode():
        for _ in range(2):
            bb.forward_images(torch.zeros(8, 3, 224, 224), patches=True)
            bb.forward_texts(torch.ones(64, 20, dtype=torch.long), torch.full((64,), 20), tokens=True)
    from capscore.nlp import load_spacy

    load_spacy(None)("warm up the parser")  # model loading is start-up, not throughput
    ref = json.loads(args.reference.read_text()) if args.reference and args.reference.is_file() else None
    saved: dict = {}
    print(f"{args.model} random init (seed 0), fp32, {torch.get_num_threads()} threads, {args.captions} captions; "
          f"load average before: {os.getloadavg()[0]:.2f}")
    worst = 0.0
    for n in [int(s) for s in args.sizes.split(",")]:
        work = Path(tempfile.mkdtemp(prefix="capscore-abe-bench-"))
        n_img = max(1, n // args.per_image)
        paths, rows = make_data(work / "images", n_img, args.per_image)
        if args.captions == "attributes":
            rows = make_captions(rows)
        captions = work / "captions.jsonl"
        captions.write_text("".join(json.dumps(r) + "\n" for r in rows))
        pool = work / "pool-cache"
        warm_pool(bb, pool)
        clips, abes = [], []
        for r in range(args.repeats):
            t, clip_scores, _ = run(bb, work / "images", captions, work / f"clip{r}", "clip-s")
            clips.append(t)
            shutil.copytree(pool, work / f"abe{r}")
            t, abe_scores, enc = run(bb, work / "images", captions, work / f"abe{r}", "abe")
            abes.append(t)
        t_empty, empty_scores, _ = run(bb, work / "images", captions, work / "abe-empty", "abe")
        t_clip, t_abe = min(clips), min(abes)
        assert max(abs(a - b) for a, b in zip(abe_scores, empty_scores)) <= 1e-6
        print(f"{n:6d} pairs ({n_img} images x {args.per_image}): CLIP-S cold {t_clip:7.2f} s wall {t_clip.cpu:7.2f} s cpu"
              f" | ABE cold {t_abe:7.2f} s wall {t_abe.cpu:7.2f} s cpu | ABE/CLIP-S = {t_abe / t_clip:.2f}x wall, "
              f"{t_abe.cpu / t_clip.cpu:.2f}x cpu (best of {args.repeats}; runs "
              + ", ".join(f"{a:.2f}/{c:.2f}" for a, c in zip(abes, clips)) + ")")
        print(f"{'':6s}        ABE cold, empty cache (concept pool encoded too): {t_empty:7.2f} s wall "
              f"= {t_empty / t_clip:.2f}x CLIP-S; load average now {os.getloadavg()[0]:.2f}")
        saved[f"{n}/{args.captions}/{args.per_image}"] = {"abe": abe_scores, "clip-s": clip_scores}
        rkey = f"{n}/{args.captions}/{args.per_image}"
        if ref is not None and rkey in ref:
            d = max(max(abs(a - b) for a, b in zip(abe_scores, ref[rkey]["abe"])),
                    max(abs(a - b) for a, b in zip(clip_scores, ref[rkey]["clip-s"])))
            worst = max(worst, d)
            print(f"{'':6s}        max |score - reference| = {d:.1e} ({'OK' if d <= 1e-6 else 'DIFFERENT'})")
        shutil.rmtree(work, ignore_errors=True)
        if args.save_reference:  # after each size: a long run interrupted keeps what it finished
            args.save_reference.parent.mkdir(parents=True, exist_ok=True)
            old = json.loads(args.save_reference.read_text()) if args.save_reference.exists() else {}
            args.save_reference.write_text(json.dumps({**old, **saved}))
            print(f"reference scores written to {args.save_reference}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if worst > 1e-6:
        sys.exit(1)


if __name__ == "__main__":
    main()
