"""Throughput of capscore's classic-metric engine against pycocoevalcap called directly, in the same run.

A COCO-Karpathy-sized text set is generated (``--images`` 5,000 images x 5 references, one candidate each;
tests/classic_sets.py's seeded generator, no downloads) and scored by each side in its own child process:

* pycocoevalcap as the COCO evaluation calls it: ``PTBTokenizer().tokenize`` on the references and on the
  candidates, then ``Bleu(4)``, ``Rouge()``, ``Cider()``, ``Meteor()`` ``compute_score`` (METEOR's time
  includes starting its jar);
* capscore's engine (:class:`capscore.scores.classic.ClassicSession`): one PTB pass over every distinct text
  (``prepare``), then each metric on its own call, then BLEU, ROUGE-L and CIDEr-D in one call, as a run
  scores them (BLEU and CIDEr-D share one n-gram interning); METEOR in a session of its own, started and
  closed inside its clock (so the jar's CPU time is counted, as it is for pycocoevalcap's).

Per metric it prints wall seconds and CPU seconds (the process and its Java children), the ratio
pycocoevalcap / capscore, the peak RSS of each side (Python, and the largest Java child), at ``--images``
and at ``--small`` images (memory should grow with the texts, not faster), and the load average before and
after. It also checks that both sides' corpus headlines agree to 1e-12.

Then the whole command against the whole script, each a process timed from start to exit (wall, and the CPU
of the process and its Java children): ``capscore score --captions C.json --refs R.json --metric …`` (text
only: no images, no model; it writes every row and its summary) beside a Python script that does what the
COCO evaluation does with pycocoevalcap from the same two files (read them, tokenise, ``compute_score`` each
metric); the CLI's recorded headlines are checked against the script's.

    python benchmarks/classic_throughput.py                  # 5,000 images, memory also at 1,000
    python benchmarks/classic_throughput.py --images 500 --small 100 --no-meteor
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # classic_sets: the seeded caption generator
TEXT = ["bleu1", "bleu2", "bleu3", "bleu4", "rouge-l", "cider"]


class Clock:
    """Wall and CPU seconds (this process and its reaped children) of a block."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), self._cpu()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, self._cpu() - self.cpu

    @staticmethod
    def _cpu() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system


def side_pycocoevalcap(cands, refs, meteor: bool) -> tuple[dict, dict]:
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.meteor.meteor import Meteor
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    times, heads = {}, {}
    with Clock() as c:
        tok = PTBTokenizer()
        gts = tok.tokenize({i: [{"caption": r} for r in rs] for i, rs in enumerate(refs)})
        res = tok.tokenize({i: [{"caption": x}] for i, x in enumerate(cands)})
    times["ptb"] = c
    with Clock() as c:
        corpus, _ = Bleu(4).compute_score(gts, res, verbose=0)
    times["bleu1-4"] = c
    heads.update({f"bleu{k + 1}": corpus[k] for k in range(4)})
    for name, scorer in (("rouge-l", Rouge), ("cider", Cider)) + ((("meteor", Meteor),) if meteor else ()):
        with Clock() as c:
            s = scorer()
            heads[name] = float(s.compute_score(gts, res)[0])
            del s  # METEOR's __del__ ends its jar
        times[name] = c
    return times, heads


def side_capscore(cands, refs, meteor: bool) -> tuple[dict, dict]:
    from capscore.scores.classic import ClassicSession

    times, heads = {}, {}
    with ClassicSession() as s:
        with Clock() as c:
            s.prepare(cands + [r for rs in refs for r in rs])
        times["ptb"] = c
        for label, group in (("bleu1-4", TEXT[:4]), ("rouge-l", ["rouge-l"]), ("cider", ["cider"])):
            with Clock() as c:
                got = s.score(group, cands, refs)
            times[label] = c
            heads.update({m: v.corpus() for m, v in got.items()})
    with ClassicSession() as s:  # a fresh session: the one above remembers the sets it scored
        with Clock() as c:
            s.score(TEXT, cands, refs)
        times["one call: bleu+rouge+cider"] = c
    if meteor:
        with Clock() as c:  # its own session, closed inside the clock: the jar's CPU is counted once it ends
            with ClassicSession() as s:
                heads["meteor"] = s.score(["meteor"], cands, refs)["meteor"].corpus()
        times["meteor"] = c
    return times, heads


def pycoco_script(folder: Path, meteor: bool) -> None:
    """What a COCO-style evaluation script does with pycocoevalcap, from the captions and references files."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.meteor.meteor import Meteor
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    cands = json.loads((folder / "captions.json").read_text())
    refs = json.loads((folder / "refs.json").read_text())
    tok = PTBTokenizer()
    gts = tok.tokenize({k: [{"caption": r} for r in rs] for k, rs in refs.items()})
    res = tok.tokenize({k: [{"caption": c}] for k, c in cands.items()})
    heads = dict(zip(TEXT[:4], Bleu(4).compute_score(gts, res, verbose=0)[0]))
    for name, scorer in (("rouge-l", Rouge), ("cider", Cider)) + ((("meteor", Meteor),) if meteor else ()):
        heads[name] = float(scorer().compute_score(gts, res)[0])
    print(json.dumps({"heads": heads}))


def whole(cmd: list[str]) -> tuple[float, float, str]:
    """(wall s, CPU s of the process and the Java children it waited for, its stdout) of one command."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT / "src"),
                                                                                 os.environ.get("PYTHONPATH", "")])}
    before, t = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    wall, after = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd[:4])} ... failed:\n{out.stderr[-3000:]}")
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), out.stdout


def cli_against_script(n: int, meteor: bool) -> None:
    """The CLI (text only) and a pycocoevalcap script, each a whole process, on the same two files."""
    import tempfile

    from classic_sets import coco_like

    cands, refs = coco_like(n, seed=0)
    metrics = TEXT[:4] + ["rouge-l", "cider"] + (["meteor"] if meteor else [])
    with tempfile.TemporaryDirectory(prefix="capscore-bench-") as tmp:
        folder = Path(tmp)
        (folder / "captions.json").write_text(json.dumps({str(i): c for i, c in enumerate(cands)}))
        (folder / "refs.json").write_text(json.dumps({str(i): rs for i, rs in enumerate(refs)}))
        script = whole([sys.executable, __file__, "--side", "pycoco-script", "--folder", tmp]
                       + ([] if meteor else ["--no-meteor"]))
        cli = whole([sys.executable, "-m", "capscore.cli", "-q", "score", "--captions", str(folder / "captions.json"),
                     "--refs", str(folder / "refs.json"), "--metric", *metrics, "--out", str(folder / "o.jsonl")])
        summary = json.loads((folder / "o.jsonl.summary.json").read_text())
    heads = json.loads(script[2].strip().splitlines()[-1])["heads"]
    mine = {r["metric"]: r["aggregate"]["value"] for r in summary["runs"]}
    print(f"\nwhole process, {n} images from two JSON files (start, read, tokenise, score; the CLI also writes "
          f"{n * len(metrics):,} rows and the summary), metrics {' '.join(metrics)}")
    print(f"{'':<52}{'wall s':>8}{'cpu s':>8}")
    print(f"  {'pycocoevalcap script (as the COCO evaluation)':<50}{script[0]:>8.2f}{script[1]:>8.2f}")
    print(f"  {'capscore score (CLI, text only, no model)':<50}{cli[0]:>8.2f}{cli[1]:>8.2f}")
    print(f"  {'ratio pycocoevalcap / capscore':<50}{script[0] / cli[0]:>7.1f}x{script[1] / cli[1]:>7.1f}x")
    worst = max(abs(heads[m] - mine[m]) for m in metrics)
    print(f"headlines the CLI records, max |pycocoevalcap - capscore| over {len(metrics)} metrics: {worst:.1e}")


def child(side: str, n: int, meteor: bool) -> None:
    from classic_sets import coco_like

    cands, refs = coco_like(n, seed=0)
    if side == "capscore":
        import capscore.scores.classic  # noqa: F401  (imports are not what is timed)
    else:
        import pycocoevalcap.bleu.bleu  # noqa: F401
    times, heads = (side_capscore if side == "capscore" else side_pycocoevalcap)(cands, refs, meteor)
    print(json.dumps({"times": {k: [v.wall, v.cpu] for k, v in times.items()}, "heads": heads,
                      "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "java_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))


def run_side(side: str, n: int, meteor: bool) -> dict:
    cmd = [sys.executable, __file__, "--side", side, "--images", str(n)] + ([] if meteor else ["--no-meteor"])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT / "src"),
                                                                                 os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        sys.exit(f"{side} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=5000)
    ap.add_argument("--small", type=int, default=1000, help="a second size for the memory comparison")
    ap.add_argument("--no-meteor", action="store_true", help="leave METEOR out (its jar dominates the time)")
    ap.add_argument("--no-cli", action="store_true", help="leave out the whole-process CLI/script comparison")
    ap.add_argument("--side", choices=["capscore", "pycocoevalcap", "pycoco-script"], help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    args = ap.parse_args()
    meteor = not args.no_meteor
    if args.side == "pycoco-script":
        return pycoco_script(Path(args.folder), meteor)
    if args.side:
        return child(args.side, args.images, meteor)

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs")
    print(f"{args.images} images x 5 references, one candidate each; each side in its own process\n")
    ref = run_side("pycocoevalcap", args.images, meteor)
    cap = run_side("capscore", args.images, meteor)
    rows = ["ptb", "bleu1-4", "rouge-l", "cider"] + (["meteor"] if meteor else [])
    print(f"{'metric':<28}{'pycocoevalcap s':>16}{'capscore s':>12}{'ratio':>8}   {'cpu: pycoco':>11}{'capscore':>10}"
          f"{'ratio':>8}")

    def line(label, a, b):
        print(f"{label:<28}{a[0]:>16.2f}{b[0]:>12.2f}{a[0] / b[0]:>7.1f}x   {a[1]:>11.2f}{b[1]:>10.2f}"
              f"{a[1] / b[1]:>7.1f}x")

    for r in rows:
        line(r, ref["times"][r], cap["times"][r])
    three = [sum(ref["times"][r][i] for r in ("bleu1-4", "rouge-l", "cider")) for i in (0, 1)]
    line("bleu+rouge-l+cider", three, cap["times"]["one call: bleu+rouge+cider"])
    total_ref = [sum(ref["times"][r][i] for r in rows) for i in (0, 1)]
    total_cap = [sum(cap["times"][r][i] for r in ("ptb", "one call: bleu+rouge+cider") + (("meteor",) if meteor
                                                                                           else ())) for i in (0, 1)]
    line("total", total_ref, total_cap)
    worst = max(abs(ref["heads"][m] - cap["heads"][m]) for m in ref["heads"])
    print(f"\ncorpus headlines, max |pycocoevalcap - capscore| over {len(ref['heads'])} metrics: {worst:.1e}")
    small_ref = run_side("pycocoevalcap", args.small, meteor)
    small_cap = run_side("capscore", args.small, meteor)
    print(f"\npeak RSS, MB (Python process / largest Java child)   {args.small} images   {args.images} images")
    for name, s, big in (("pycocoevalcap", small_ref, ref), ("capscore", small_cap, cap)):
        print(f"  {name:<50}{s['rss_mb']:>6.0f} / {s['java_rss_mb']:<6.0f}{big['rss_mb']:>7.0f} / "
              f"{big['java_rss_mb']:.0f}")
    if not args.no_cli:
        cli_against_script(args.images, meteor)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
