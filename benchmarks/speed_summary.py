"""The four speed figures users wait on, measured in one run, each against its peer and target.

Runs, one after the other in child processes (so one's caches and threads do not help the next):

* ``score_throughput.py --images 40 --skip-torchmetrics``: capscore's CLIP-S path against the bare
  model forward of the same pairs (roofline ratio, target <= 1.1x);
* ``abe_throughput.py --sizes 100,1000 --captions attributes`` and ``--sizes 100 --captions words``:
  ABE-CLIP against CLIP-S on the same pairs, cold (target <= 1.5x), scores checked against the
  stored reference (<= 1e-6);
* ``startup.py --repeats 3``: one (image, caption) pair through ``capscore score`` with a warm cache
  (target <= 3 s wall);
* ``video_throughput.py``: a warm re-run of a video set with another metric against the cold run
  (target >= 20x), scores checked against that metric computed cold.

It prints each benchmark's own lines, then one table with the figure, the target and the load
average around each. A ratio is only comparable within its own run; run it on a quiet machine.

    python benchmarks/speed_summary.py
    python benchmarks/speed_summary.py --quick      # 100 pairs only, fewer repeats
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def bench(script: str, *args: str) -> tuple[str, float, float, float]:
    """Run one benchmark; (its output, wall seconds, load before, load after)."""
    before = os.getloadavg()[0]
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, str(HERE / script), *args], capture_output=True, text=True)
    wall = time.perf_counter() - t
    out = proc.stdout + (proc.stderr if proc.returncode else "")
    print(f"$ python benchmarks/{script} {' '.join(args)}   (exit {proc.returncode}, {wall:.0f} s)")
    print("\n".join(line for line in out.splitlines() if line.strip() and "Warning" not in line))
    print()
    return out, wall, before, os.getloadavg()[0]


def grab(pattern: str, text: str, group: int = 1) -> str:
    found = re.findall(pattern, text)
    if not found:
        return "not found"
    last = found[-1]
    return last if isinstance(last, str) else last[group - 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100 ABE pairs only and fewer repeats")
    args = ap.parse_args()
    rows = []

    out, _, lo, hi = bench("score_throughput.py", "--images", "40", "--skip-torchmetrics")
    rows.append(("CLIP-S path / bare forward (roofline)", grab(r"time = ([\d.]+x) wall", out), "<= 1.1x", lo, hi))

    sizes = "100" if args.quick else "100,1000"
    out, _, lo, hi = bench("abe_throughput.py", "--sizes", sizes, "--captions", "attributes",
                           "--repeats", "2" if args.quick else "3")
    for n, ratio in re.findall(r"^\s*(\d+) pairs .*ABE/CLIP-S = ([\d.]+x) wall", out, flags=re.M):
        rows.append((f"ABE / CLIP-S, {n} attribute captions", ratio, "<= 1.5x", lo, hi))
    ok = "OK" if "DIFFERENT" not in out and "OK" in out else "check the output"
    rows.append(("  ABE scores vs reference (<= 1e-6)", ok, "OK", lo, hi))
    out, _, lo, hi = bench("abe_throughput.py", "--sizes", "100", "--captions", "words", "--repeats", "2")
    for n, ratio in re.findall(r"^\s*(\d+) pairs .*ABE/CLIP-S = ([\d.]+x) wall", out, flags=re.M):
        rows.append((f"ABE / CLIP-S, {n} random-word captions", ratio, "(<= 1.5x)", lo, hi))

    out, _, lo, hi = bench("startup.py", "--repeats", "3")
    for model, wall in re.findall(r"score 1 pair (\S+)\s+([\d.]+ s) wall", out):
        rows.append((f"one pair, warm cache, {model}", wall, "<= 3 s", lo, hi))
    rows.append(("  of which python -c 'import torch' alone", grab(r"import torch'\s+([\d.]+ s) wall", out), "", lo, hi))
    for own in re.findall(r"capscore's own share ([\d.]+) s", out)[:1]:
        rows.append(("  capscore's own share, after import torch (B/32)", f"{own} s", "", lo, hi))

    out, _, lo, hi = bench("video_throughput.py")
    rows.append(("video: warm re-run, another metric, vs cold", grab(r"([\d.]+x) wall, [\d.]+x cpu faster", out),
                 ">= 20x", lo, hi))
    rows.append(("  its scores vs that metric cold", grab(r"max \|delta score\| vs \S+ cold ([\d.e+-]+)", out),
                 "0", lo, hi))

    print(f"{'figure':48s} {'measured':>10s} {'target':>10s}   load before/after")
    for name, value, target, lo, hi in rows:
        print(f"{name:48s} {value:>10s} {target:>10s}   {lo:.2f}/{hi:.2f}")


if __name__ == "__main__":
    main()
