"""CaptionScore.update per batch against the bare forward passes of the same backbone, measured in one run.

``CaptionScore.update`` (the torchmetrics shell) scores a batch with the functional core
(``capscore.scores.functional.batch_values``): one argument check, pixels -> PIL, the backbone's
preprocessing, the engine's dedupe/cache bookkeeping, tokenisation and pad-to-longest batching,
the two forwards and the CLIP-S formula. Its peer is the bare work a hand-written loop cannot
avoid: ``model.encode_image`` on the batch *already preprocessed* plus ``model.encode_text`` on
the captions *already tokenised* (padded to the batch's longest caption, as capscore pads), through
the backbone adapter's two forwards under ``torch.inference_mode``; open_clip's own
``encode_image`` + ``encode_text`` with its tokenizer's 77-token padding is printed beside it.
The ratio update / bare is the shell's overhead (target <= 1.1); the preprocessing alone (PIL ->
tensor, outside both) is printed too, since update has to do it and the bare peer does not.

Batches are distinct uint8 ``(N, 3, 224, 224)`` tensors of random pixels with random-word captions
(as a validation loop feeds them), so no vector comes from the cache; CaptionScore keeps its
default in-memory cache. Models: ``capscore-test-tiny`` (the test fixture architecture: the forward
is tiny, so the ratio shows the fixed cost) and a random-init ``ViT-B-32`` (open_clip,
``pretrained=None``, seed 0), fp32 on the CPU with ``--threads`` torch threads. Each batch is timed
for both paths back to back (update first, then bare, alternating the order each batch) after one
warm-up batch; medians over ``--batches``. The load average is printed with the result.

    python benchmarks/caption_score_overhead.py                        # both models, 32 pairs, 6 batches
    python benchmarks/caption_score_overhead.py --models ViT-B-32 --batch 16 --batches 4
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# the test fixture architecture capscore-test-tiny lives in tests/configs (registered like the tests do)
os.environ["CAPSCORE_MODEL_CONFIGS"] = os.pathsep.join(
    filter(None, [str(Path(__file__).resolve().parents[1] / "tests" / "configs"),
                  os.environ.get("CAPSCORE_MODEL_CONFIGS", "")]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

WORDS = ("a the red blue green small large dog cat car bus man woman table chair cup ball tree house street "
         "grass sits runs next to under on in front of near two three old young wooden").split()


def make_batches(n_batches: int, size: int, seed: int = 0) -> list[tuple[torch.Tensor, list[str]]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_batches):
        pixels = torch.from_numpy((rng.random((size, 3, 224, 224)) * 255).astype(np.uint8))
        caps = [" ".join(rng.choice(WORDS, size=int(rng.integers(6, 13)))) for _ in range(size)]
        out.append((pixels, caps))
    return out


def bare_inputs(backbone, pixels: torch.Tensor, caps: list[str], *, longest: bool):
    """What the bare forward receives: preprocessed pixels and token ids (not timed as the forward)."""
    from PIL import Image

    px = torch.stack([backbone.preprocess(Image.fromarray(p.permute(1, 2, 0).numpy())) for p in pixels])
    ids = backbone.tokenize(caps)
    L = max(len(r) for r in ids) if longest else backbone.context_length
    tok = torch.full((len(ids), L), backbone.pad_id, dtype=torch.long)
    for j, r in enumerate(ids):
        tok[j, : len(r)] = torch.tensor(r[:L])
    return px, tok


def bare_forward(backbone, px: torch.Tensor, tok: torch.Tensor, *, native: bool) -> None:
    """The two forwards: the backbone adapter's (what the engine calls; texts padded to the longest), or with
    ``native`` open_clip's own ``encode_image`` / ``encode_text`` (77-token padding)."""
    with torch.inference_mode():
        if native:
            backbone.model.encode_image(px)
            backbone.model.encode_text(tok)
        else:
            backbone.forward_images(px)
            backbone.forward_texts(tok, (tok != backbone.pad_id).sum(-1))


def measure(name: str, batches, *, batch: int) -> dict:
    from capscore.backbones import load_backbone
    from capscore.integrations.torchmetrics import CaptionScore

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        backbone = load_backbone(name, seed=0)
        metric = CaptionScore(backbone, "clip-s", batch_size=batch)
    times = {"update": [], "bare": [], "bare77": [], "preprocess": []}
    for k, (pixels, caps) in enumerate(batches):
        t = time.perf_counter()
        px, tok = bare_inputs(backbone, pixels, caps, longest=True)
        prep = time.perf_counter() - t
        _, tok77 = bare_inputs(backbone, pixels, caps, longest=False)

        def run_update():
            t0 = time.perf_counter()
            metric.update(pixels, caps)
            return time.perf_counter() - t0

        def run_bare(tokens, native=False):
            t0 = time.perf_counter()
            bare_forward(backbone, px, tokens, native=native)
            return time.perf_counter() - t0

        if k % 2 == 0:
            upd, bare = run_update(), run_bare(tok)
        else:
            bare, upd = run_bare(tok), run_update()
        bare77 = run_bare(tok77, native=True)
        if k == 0:
            continue  # warm-up: first calls allocate
        times["update"].append(upd)
        times["bare"].append(bare)
        times["bare77"].append(bare77)
        times["preprocess"].append(prep)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["capscore-test-tiny", "ViT-B-32"])
    ap.add_argument("--batch", type=int, default=32, help="pairs per update (default 32)")
    ap.add_argument("--batches", type=int, default=6, help="batches per model, the first a warm-up (default 6)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    batches = make_batches(max(2, args.batches), args.batch)
    load_before = os.getloadavg()
    rows = [(name, measure(name, batches, batch=args.batch)) for name in args.models]
    load_after = os.getloadavg()
    print(f"CaptionScore.update vs bare forward: {args.batch} pairs per batch, uint8 224x224, fp32 CPU, "
          f"{args.threads} torch thread(s), median of {max(2, args.batches) - 1} batches")
    print(f"{'model':<20} {'update s':>9} {'bare s':>9} {'ratio':>7} {'bare77 s':>9} {'ratio77':>8} {'preproc s':>10}")
    for name, m in rows:
        print(f"{name:<20} {m['update']:>9.4f} {m['bare']:>9.4f} {m['update'] / m['bare']:>6.2f}x "
              f"{m['bare77']:>9.4f} {m['update'] / m['bare77']:>7.2f}x {m['preprocess']:>10.4f}")
    print("ratio: update / (image forward on preprocessed pixels + text forward padded to the longest caption); "
          "ratio77: against open_clip's encode_image + encode_text (77-token padding); preproc: PIL -> tensor, "
          "not in bare")
    print("load average before: {:.2f} {:.2f} {:.2f}; after: {:.2f} {:.2f} {:.2f}".format(*load_before, *load_after))


if __name__ == "__main__":
    main()
