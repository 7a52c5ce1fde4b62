"""Training step time with CPU bf16 autocast (``capscore train --amp bf16``) against fp32, in the same run.

Runs the same ``scenes-tiny`` recipe steps from the same start with ``amp="off"`` (fp32, the CPU default)
and with ``amp="bf16"``, through the one training loop (:func:`capscore.train.loop.train`), in
``--rounds`` rounds whose order alternates (off, bf16, then bf16, off, ...: whichever runs first in a
process pays warm-up costs, so one order alone flatters the second), and prints the mean seconds per step
of each run and mode (the loop's own per-step timer, first ``--skip`` steps of each run dropped), the
speed ratio, and how far the two modes' losses drift apart.

The default settings are the bundled model's stage 2 (``capscore/scenes/MODEL_CARD.md``: FILIP term 0.5,
image twins 0.5, negative weights 1,3,3,1,1,1, batch 128, lr 7.5e-4) from the bundled ``scenes-tiny``.
The speed-up needs a CPU with native bf16 (AVX512-BF16 or AMX); elsewhere bf16 may be slower.

    python benchmarks/train_amp.py                      # 20 steps per run, 2 rounds, scenes-tiny, 2 threads
    python benchmarks/train_amp.py --steps 40 --threads 4
"""
from __future__ import annotations

import argparse
import statistics


def run(model: str, amp: str, steps: int, batch: int, seed: int) -> list[dict]:
    from scenes_step_cost import run as stage2_steps  # the same recipe settings, start and loop

    return stage2_steps(model, {}, steps, batch, seed, amp=amp)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="scenes-tiny")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--skip", type=int, default=3, help="first steps left out of the timing (warm-up)")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of one run per mode, order alternating")
    args = ap.parse_args()
    if not 0 <= args.skip < args.steps:
        ap.error("need 0 <= --skip < --steps")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")

    import torch

    torch.set_num_threads(args.threads)
    print(f"scenes-tiny recipe (stage-2 settings), {args.model}, batch {args.batch_size}, {args.threads} threads, "
          f"{args.steps} steps per run (first {args.skip} not timed), {args.rounds} rounds; torch {torch.__version__}")
    hist: dict[str, list] = {"off": [], "bf16": []}
    for r in range(args.rounds):
        for amp in (("off", "bf16") if r % 2 == 0 else ("bf16", "off")):
            h = run(args.model, amp, args.steps, args.batch_size, args.seed)
            hist[amp].append(h)
            print(f"  round {r + 1} amp={amp:<4}  {statistics.mean(e['sec'] for e in h[args.skip:]):.3f} s/step   "
                  f"loss first {h[0]['loss']:.4f}  last {h[-1]['loss']:.4f}")
    sec = {amp: statistics.mean(e["sec"] for h in hs for e in h[args.skip:]) for amp, hs in hist.items()}
    print(f"  mean: amp=off {sec['off']:.3f} s/step, amp=bf16 {sec['bf16']:.3f} s/step")
    drift = max(abs(a["loss"] - b["loss"]) for a, b in zip(hist["off"][0], hist["bf16"][0]))
    print(f"  bf16 speed-up: {sec['off'] / sec['bf16']:.2f}x fp32; largest per-step loss difference {drift:.4f}")


if __name__ == "__main__":
    main()
