"""Do reduced precision and another device change the scores? (a check for a machine with a GPU)

Scores the same captions with ``capscore.score`` (the engine every metric uses) on the CPU in fp32 and on
each ``--device``/``--dtype`` asked for, and prints, per model and metric, the largest and mean absolute
difference per caption from the CPU fp32 scores and Kendall's τ-b between the two score lists (scipy),
with each run's wall time. The inputs are ``--n`` held-out synthetic scenes drawn at the model's size;
each scene has two candidates, its correct caption and a caption with one controlled error of a random
applicable kind (``capscore.scenes.make_flaw``), and up to three paraphrases as references.

    python benchmarks/dtype_agreement.py --size 96             # scenes-tiny, scenes-tiny-v4, openclip:ViT-B-32
    python benchmarks/dtype_agreement.py --model ViT-B-32/openai --metric clip-s refclip-s

Without CUDA only the CPU fp32 line runs (the others print the one-line error). Results: README
"Caching, devices and precision" (an H200, 2026-11-27).
"""
from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from scipy.stats import kendalltau

RUNS = (("cuda", "fp32"), ("cuda", "fp16"), ("cuda", "bf16"))


def inputs(n: int, size: int, seed: int):
    from capscore.scenes import applicable_errors, generate_scenes, make_flaw

    rng = np.random.default_rng(0)  # the error kinds and values drawn
    images, captions, refs = [], [], []
    for s in generate_scenes(n, seed=seed, split="heldout", size=size):
        kinds = sorted(applicable_errors(s))
        flaw = make_flaw(s, kinds[int(rng.integers(len(kinds)))], rng)
        images.append(s.render())
        captions.append([flaw.correct_caption.text, flaw.flawed_caption.text])
        refs.append(s.paraphrases()[:3] or [s.short_caption()])
    return images, captions, refs


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", nargs="+", default=["scenes-tiny", "scenes-tiny-v4", "openclip:ViT-B-32"])
    ap.add_argument("--metric", nargs="+", default=["clip-s", "refclip-s", "abe"])
    ap.add_argument("--n", type=int, default=128, help="scenes (two candidates each)")
    ap.add_argument("--seed", type=int, default=7, help="scene seed")
    ap.add_argument("--size", type=int, default=None,
                    help="draw the scenes at this side in px (default: the model's input size)")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    import capscore
    from capscore.backbones import load_backbone
    from capscore.scenes import render_size

    for model in args.model:
        data = inputs(args.n, args.size or render_size(load_backbone(model)), args.seed)
        for metric in args.metric:
            base = None
            for dev, dt in (("cpu", "fp32"),) + RUNS:
                t = time.perf_counter()
                try:
                    frame = capscore.score(*data, model=model, metric=metric, device=dev, dtype=dt, as_frame=True)
                except Exception as e:  # noqa: BLE001 — report and go on to the next run
                    print(f"{model:18s} {metric:9s} {dev}/{dt}: {type(e).__name__}: {str(e)[:160]}", flush=True)
                    continue
                v, wall = frame["score"].to_numpy(float), time.perf_counter() - t
                if base is None:
                    base = v
                    print(f"{model:18s} {metric:9s} {dev}/{dt}: mean score {v.mean():.4f} ({wall:.1f} s)", flush=True)
                    continue
                d = np.abs(v - base)
                print(f"{model:18s} {metric:9s} {dev}/{dt}: max|diff| {d.max():.2e} mean|diff| {d.mean():.2e} "
                      f"tau-b {kendalltau(v, base).statistic:.4f} ({wall:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
