"""Start-up cost of the ``capscore`` command, with its breakdown: what a small job waits for before its result.

Each figure is a fresh child process (best of ``--repeats``) running what the ``capscore`` console
script runs (``cli.main``, then ``cli.exit_fast``), wall and CPU seconds:

* ``--help``, ``--version``, ``models``, an argument error, a model-name typo and a missing
  input file, each with whether torch / open_clip / transformers got imported (target ≤ 0.5 s,
  none imported);
* one (image, caption) pair scored by ``capscore score`` with a warm cache (embedding cache and
  weights-hash cache filled by one earlier run), for ``--model`` (default: random-init ViT-B-32
  saved to a weights file and loaded as ``ViT-B-32/FILE``, the shape of a real checkpoint) and the
  bundled ``scenes-tiny`` (target ≤ 3 s on a quiet 2-core machine);
* capscore's own share of that warm run: the same command in one process, timed after ``import torch``
  (median and range over ``--repeats``), which is what capscore adds to torch's import;
* the breakdown of that warm run, phase by phase in one child: import capscore's CLI, import torch,
  ``load_backbone(lazy=True)`` (a stand-in built from the remembered facts: no open_clip, no model),
  one cached encode; then, for comparison, what the warm run no longer pays: import open_clip (and
  whether it pulled transformers), build + load the model, hash the weights.

Children write and read capscore's ``.pyc`` files, as a default Python does, even where the
environment sets ``PYTHONDONTWRITEBYTECODE`` (this project's sandbox does; every run would then
compile capscore's modules again, ~0.1 s); ``--as-env`` keeps the environment's setting.

    python benchmarks/startup.py
    python benchmarks/startup.py --model ViT-L-14 --repeats 3
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
PROBE = """
import atexit, json, sys
sys.argv = ["capscore"] + json.loads(sys.argv[1])
from capscore import cli
code = None

def report():  # at exit, which the console script's entry reaches through its atexit handlers too
    print("PROBE " + json.dumps({"code": code, "torch": "torch" in sys.modules, "open_clip": "open_clip" in sys.modules,
                      "transformers": "transformers" in sys.modules}), file=sys.stderr, flush=True)

atexit.register(report)
try:
    code = cli.main()
except SystemExit as e:
    code = e.code
cli.exit_fast(code)  # what the `capscore` console script does after main()
"""

BREAKDOWN = """
import json, sys, time, os
t0 = time.perf_counter(); c0 = time.process_time()
marks = []
def mark(name):
    marks.append((name, time.perf_counter() - t0, time.process_time() - c0))
import capscore.cli; mark("import capscore.cli")
import torch; mark("import torch")
from capscore.backbones import load_backbone
bb = load_backbone(sys.argv[1], lazy=True)
mark("load_backbone(lazy=True): " + ("stand-in, model not built" if type(bb).__name__ == "LazyBackbone" else "built"))
from capscore.embed import Encoder
enc = Encoder(bb, cache=sys.argv[2])
enc.encode_images([sys.argv[3]]); enc.encode_texts(["A photo depicts " + sys.argv[4]])
mark("cached encode (image + text)" + ("" if "open_clip" in sys.modules else "; open_clip not imported"))
import open_clip; mark("(cold path, for comparison) import open_clip" + (" (+transformers)" if "transformers" in sys.modules else ""))
real = load_backbone(sys.argv[1]); mark("(cold path, for comparison) build + load model")
from capscore.backbones.base import weights_hash
t = time.perf_counter(); weights_hash(real.model); hash_s = time.perf_counter() - t
print("BREAKDOWN " + json.dumps({"marks": marks, "hash_s": hash_s, "cached": enc.stats.images_cached + enc.stats.texts_cached}))
"""


KEEP_BYTECODE_SETTING = False  # --as-env: children inherit PYTHONDONTWRITEBYTECODE

SHARE = """
import json, sys, time, contextlib, io
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
sys.argv = ["capscore"] + json.loads(sys.argv[1])
from capscore.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main()
    except SystemExit:
        pass
print("SHARE " + json.dumps({"torch": t1 - t0, "capscore": time.perf_counter() - t1}))
"""


def child(code: str, *args: str) -> tuple[float, float, str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if not KEEP_BYTECODE_SETTING:  # as a default Python does: capscore's modules compiled once, then read
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    before = os.times()
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return wall, cpu, proc.stderr + proc.stdout


def best(n: int, code: str, *args: str):
    runs = [child(code, *args) for _ in range(n)]
    return min(runs, key=lambda r: r[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="ViT-B-32", help="open_clip architecture saved to a weights file (random init)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--as-env", action="store_true",
                   help="children inherit PYTHONDONTWRITEBYTECODE (default: they write and read .pyc files, as a "
                        "default Python does; with it set, every run compiles capscore's modules again, ~0.1 s)")
    args = p.parse_args()
    global KEEP_BYTECODE_SETTING
    KEEP_BYTECODE_SETTING = args.as_env
    work = Path(tempfile.mkdtemp(prefix="capscore-startup-"))
    no_pyc = bool(os.environ.get("PYTHONDONTWRITEBYTECODE")) and args.as_env
    print(f"load average before: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs); best of {args.repeats}; "
          f"bytecode cache {'off (PYTHONDONTWRITEBYTECODE)' if no_pyc else 'on'}")
    child(PROBE, json.dumps(["--version"]))  # the first child writes capscore's .pyc files

    def show(name, wall, cpu, out):
        probe = next((json.loads(line[6:]) for line in out.splitlines() if line.startswith("PROBE ")), {})
        heavy = [m for m in ("torch", "open_clip", "transformers") if probe.get(m)]
        print(f"  {name:34s} {wall:6.2f} s wall {cpu:6.2f} s cpu  exit {probe.get('code')}  "
              f"imports: {', '.join(heavy) or 'no torch/open_clip/transformers'}")

    print("cheap paths (target <= 0.5 s, no deep-learning imports):")
    missing = ["score", "--images", str(work / "nope"), "--captions", str(work / "nope.json"), "--out",
               str(work / "o.jsonl")]
    for name, argv in [("--help", ["--help"]), ("--version", ["--version"]), ("models", ["models"]),
                       ("argument error", ["score", "--batch-size", "0", "--out", "x.jsonl"]),
                       ("model typo", ["score", "--model", "ViT-B-99", "--out", "x.jsonl"]),
                       ("missing input file", missing)]:
        show(name, *best(args.repeats, PROBE, json.dumps(argv)))

    # one pair, warm cache
    from PIL import Image

    import numpy as np

    (work / "images").mkdir()
    Image.fromarray((np.random.default_rng(0).random((224, 224, 3)) * 255).astype("uint8")).save(work / "images" / "a.png")
    caption = "a red cube next to a blue ball"
    (work / "captions.json").write_text(json.dumps({"a": caption}))
    weights = work / f"{args.model}.pt"
    subprocess.run([sys.executable, "-c", f"""
import warnings, torch
from capscore.backbones import load_backbone
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    bb = load_backbone({args.model!r}, seed=0)
torch.save(bb.model.state_dict(), {str(weights)!r})
"""], check=True, env={**os.environ, "PYTHONPATH": SRC})
    env_cache = work / "cache"
    os.environ["CAPSCORE_CACHE"] = str(env_cache)  # the hash cache lives there too; children inherit it
    print("one pair, warm cache (target <= 3 s on a quiet 2-core machine):")
    wall, cpu, _ = best(args.repeats, "import torch")
    floor = "floor: python -c 'import torch'"
    print(f"  {floor:34s} {wall:6.2f} s wall {cpu:6.2f} s cpu  (with the interpreter's teardown)")
    wall, cpu, _ = best(args.repeats, "import os, torch; os._exit(0)")
    print(f"  {'  the same, without the teardown':34s} {wall:6.2f} s wall {cpu:6.2f} s cpu")
    for spec in (f"{args.model}/{weights}", "scenes-tiny"):
        argv = ["-q", "score", "--model", spec, "--images", str(work / "images"), "--captions",
                str(work / "captions.json"), "--out", str(work / "out.jsonl"), "--overwrite", "--cache-dir",
                str(env_cache)]
        child(PROBE, json.dumps(argv))  # fills the embedding and weights-hash caches
        label = args.model + "/FILE" if spec != "scenes-tiny" else spec
        show(f"score 1 pair {label}", *best(args.repeats, PROBE, json.dumps(argv)))
        shares = []  # the same run in one process, timed after `import torch`: capscore's own share
        for _ in range(args.repeats):
            out = child(SHARE, json.dumps(argv))[2]
            shares += [json.loads(line[6:]) for line in out.splitlines() if line.startswith("SHARE ")]
        if shares:
            own = sorted(x["capscore"] for x in shares)
            tor = sorted(x["torch"] for x in shares)
            print(f"      in one process: import torch {tor[len(tor) // 2]:.2f} s (median; {tor[0]:.2f}-{tor[-1]:.2f}), "
                  f"then capscore's own share {own[len(own) // 2]:.3f} s (median; {own[0]:.3f}-{own[-1]:.3f})")
        wall, cpu, out = child(BREAKDOWN, spec, str(env_cache), str(work / "images" / "a.png"), caption)
        info = next((json.loads(line[10:]) for line in out.splitlines() if line.startswith("BREAKDOWN ")), None)
        if info is None:
            print(out[-2000:])
            continue
        prev_w = prev_c = 0.0
        for name, w, c in info["marks"]:
            print(f"      {name:46s} +{w - prev_w:6.2f} s wall +{c - prev_c:6.2f} s cpu")
            prev_w, prev_c = w, c
        print(f"      {'(weights hash computed, for comparison)':46s}  {info['hash_s']:6.2f} s wall; "
              f"{info['cached']} vectors from the cache")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
