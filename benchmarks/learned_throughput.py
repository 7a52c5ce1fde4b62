"""Polos and DENEB: capscore against the authors' own code, same random weights, same pairs, one run.

The authors' code (keio-smilab24/Polos, Ka2ukiMatsuda/DENEB) runs from a scratch copy under /tmp made
from the fetched git mirrors (``--polos-repo`` / ``--deneb-repo``: a git directory or a checkout); it is
imported by this script only, never by capscore. It needs ``pytorch-nlp`` 0.5.0 (pure Python), which
the script looks for in ``--authors-site`` (install it there once:
``pip install --no-deps --target /tmp/capscore-authors-site pytorch-nlp==0.5.0``). What its imports need
and this environment lacks is stood in for, none of it on the numeric path: ``pytorch_lightning``
(a ``LightningModule`` that is an ``nn.Module``), ``fairseq`` (only imported by the XLM-R encoder,
unused); weight downloads are redirected to local random files (``clip.load``'s download, read through its
own non-TorchScript fallback, open_clip's
``pretrained=``, DENEB's ``experiments/openClip_ViT-L-14.pth``), ``AutoModel.from_pretrained`` builds
from the local config (the checkpoint's weights are loaded over it), ``Module.cuda`` is a no-op on CPU.

Weights: the authors' estimator is built with random initialisation (seed 0), its ``state_dict()`` is
saved as a Lightning-style checkpoint and capscore loads that file with its own loader — so the parity
check also checks capscore's reading of the authors' layout.

Data (``--images`` × ``--captions`` distinct captions, each repeated ``--ratings`` times as
Flickr8k-Expert repeats a caption once per expert, ``--refs`` references per image): the authors'
``model.predict(samples, batch_size=B)`` gets one sample per row with the decoded PIL image; capscore
gets the same rows and PIL objects and encodes each distinct image and text once (its encoders in batches
of 64, the engine's default; its head in the authors' batches of B). Timed: the authors'
``predict``; capscore with ``layer_norm="batch"`` (the authors' batch statistics, same ``B``: the parity
run) and with the default ``layer_norm="sentence"``, after one warm-up call of each on two batches, best
of ``--repeats`` interleaved runs. Printed: seconds, pairs/s, ratio, max |Δ| of the scores, the load
average before, during and after.

    python benchmarks/learned_throughput.py                                  # real sizes, Polos
    python benchmarks/learned_throughput.py --metrics polos deneb --images 4
    python benchmarks/learned_throughput.py --sizes tiny --metrics polos deneb   # quick check that it runs
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import types
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("CAPSCORE_MODEL_CONFIGS", str(ROOT / "tests" / "configs"))  # capscore-test-tiny

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from score_throughput import WORDS  # noqa: E402

MIRRORS = Path("/work/.mirror")
SIZES = {  # (RoBERTa: hidden, layers, heads, ffn), CLIP architecture per metric, Polos/DENEB MLP hidden sizes
    "real": {"roberta": (768, 12, 12, 3072), "polos_clip": "ViT-B-32-quickgelu", "deneb_clip": "ViT-L-14",
             "polos_hidden": "2304,1152", "deneb_hidden": "1536, 768"},
    "tiny": {"roberta": (32, 2, 4, 64), "polos_clip": "bench-tiny-clip-512", "deneb_clip": "bench-tiny-clip",
             "polos_hidden": "24,12", "deneb_hidden": "24, 12"},
}
# Small CLIPs that OpenAI's build_model can rebuild (heads = width // 64): DENEB's joint space must be the
# tiny RoBERTa's width (32); Polos' head hard-codes a 512-wide one (input 4·D + 512·6).
TINY_CLIP = {"embed_dim": 32, "quick_gelu": True,
             "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "head_width": 64, "patch_size": 8},
             "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 1, "layers": 2}}
TINY_CLIPS = {"bench-tiny-clip": TINY_CLIP, "bench-tiny-clip-512": {**TINY_CLIP, "embed_dim": 512}}


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# ------------------------------------------------------------------------------------ the authors' code
def scratch_tree(repo: Path, name: str, scratch: Path) -> Path:
    """A copy of the repository's files under ``scratch/name`` (``git archive`` of a mirror, or the checkout)."""
    dest = scratch / name
    if (dest / ".complete").exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    if (repo / "HEAD").exists() and not (repo / ".git").exists():  # a bare git directory (the fetched mirror)
        with tempfile.TemporaryFile() as tar:
            subprocess.run(["git", "--git-dir", str(repo), "archive", "HEAD"], stdout=tar, check=True)
            tar.seek(0)
            with tarfile.open(fileobj=tar) as t:
                t.extractall(dest, filter="data")
    else:
        import shutil

        shutil.copytree(repo, dest, dirs_exist_ok=True)
    (dest / ".complete").write_text("ok")
    return dest


def stand_ins() -> None:
    """Modules the authors' imports need that this environment lacks (none on the numeric path)."""
    if "pytorch_lightning" not in sys.modules:
        ptl = types.ModuleType("pytorch_lightning")

        class LightningModule(torch.nn.Module):
            trainer = None

            @property
            def device(self):
                p = next(self.parameters(), None)
                return p.device if p is not None else torch.device("cpu")

            def freeze(self):
                for p in self.parameters():
                    p.requires_grad = False
                self.eval()

        ptl.LightningModule = LightningModule
        sys.modules["pytorch_lightning"] = ptl
    if "pkg_resources" not in sys.modules:  # polos/clip.py reads packaging.version from it (a version check)
        import packaging.version

        pkg = types.ModuleType("pkg_resources")
        pkg.packaging = packaging
        sys.modules["pkg_resources"] = pkg
    for name in ("fairseq", "fairseq.models", "fairseq.models.roberta"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["fairseq.models.roberta"].XLMRModel = object
    import transformers

    if not getattr(transformers.AutoModel.from_pretrained, "_bench", False):
        def from_local_config(path, *a, **k):  # the checkpoint's weights are loaded over it afterwards
            return transformers.AutoModel.from_config(transformers.AutoConfig.from_pretrained(path))

        from_local_config._bench = True
        transformers.AutoModel.from_pretrained = from_local_config
    torch.nn.Module.cuda = lambda self, *a, **k: self  # DENEB calls .cuda() on its CLIP


def authors_models(args, folder: Path, scratch: Path, metrics: list[str]):
    """The authors' estimators, random weights (seed 0), on CPU."""
    import open_clip

    stand_ins()
    sys.path[:0] = [str(args.authors_site)]
    import json

    for name, cfg in TINY_CLIPS.items():
        (scratch / f"{name}.json").write_text(json.dumps(cfg))
        open_clip.add_model_config(scratch / f"{name}.json")
    sizes = SIZES[args.sizes]
    out = {}
    base = {"encoder_model": "BERT", "pretrained_model": str(folder), "layer": "mix", "scalar_mix_dropout": 0.1,
            "pool": "cls", "dropout": 0.1, "activations": "Tanh", "final_activation": False, "nr_frozen_epochs": 100000,
            "batch_size": args.batch_size}
    if "polos" in metrics:
        tree = scratch_tree(args.polos_repo, "Polos", scratch)
        sys.path.insert(0, str(tree))
        import polos.clip as pclip
        from polos.models import PolosEstimator

        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = open_clip.create_model(sizes["polos_clip"], pretrained=None)
        clip_file = scratch / f"polos-clip-{args.sizes}.pt"
        torch.save(ref.state_dict(), clip_file)
        pclip._download = lambda url, root=None: str(clip_file)  # clip.load("ViT-B/32") reads this file
        torch.manual_seed(0)
        hp = PolosEstimator.ModelConfig({**base, "model": "PolosEstimator", "hidden_sizes": sizes["polos_hidden"]})
        jit_load = torch.jit.load

        def not_jit(*a, **k):  # the file is a plain state dict: clip.load's own fallback reads it from the start
            raise RuntimeError("not a TorchScript archive")

        torch.jit.load = not_jit
        try:
            out["polos"] = PolosEstimator(hp.namespace()).eval()
        finally:
            torch.jit.load = jit_load
    if "deneb" in metrics:
        tree = scratch_tree(args.deneb_repo, "DENEB", scratch)
        sys.path.insert(0, str(tree))
        from deneb.models import DenebEstimator

        real_create = open_clip.create_model_and_transforms
        arch = sizes["deneb_clip"]

        def create(name, pretrained=None, **k):  # DENEB asks for ViT-L-14/laion2b_s32b_b82k: no download
            model, a, _ = real_create(arch, pretrained=None, **k)
            size = model.visual.image_size  # the laion2b_s32b_b82k transform: mean = std = 0.5
            return model, a, open_clip.image_transform(size, is_train=False, mean=(0.5,) * 3, std=(0.5,) * 3)

        open_clip.create_model_and_transforms = create
        real_tokenizer = open_clip.get_tokenizer
        open_clip.get_tokenizer = lambda name: real_tokenizer(arch)
        torch.manual_seed(1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pacs = real_create(arch, pretrained=None)[0]
        cwd = os.getcwd()
        (scratch / "experiments").mkdir(exist_ok=True)
        torch.save({"state_dict": pacs.state_dict()}, scratch / "experiments" / "openClip_ViT-L-14.pth")
        os.chdir(scratch)
        try:
            torch.manual_seed(0)
            hp = DenebEstimator.ModelConfig({**base, "model": "DenebEstimator", "hidden_sizes": sizes["deneb_hidden"]})
            out["deneb"] = DenebEstimator(hp.namespace()).eval()
        finally:
            os.chdir(cwd)
    return out


# ------------------------------------------------------------------------------------ data and weights
def roberta_folder(folder: Path, corpus: list[str], size: str) -> Path:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaConfig

    if (folder / "config.json").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=1000, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], show_progress=False)
    bpe.save_model(str(folder))
    import json

    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "RobertaTokenizer"}))
    hidden, layers, heads, ffn = SIZES[size]["roberta"]
    RobertaConfig(vocab_size=50265 if size == "real" else 1000, hidden_size=hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, intermediate_size=ffn, max_position_embeddings=514, type_vocab_size=1,
                  pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5).save_pretrained(str(folder))
    return folder


def make_rows(args) -> list[dict]:
    rng = np.random.default_rng(0)
    sentence = lambda: " ".join(rng.choice(WORDS, int(rng.integers(6, 16))))  # noqa: E731
    rows = []
    for i in range(args.images):
        low = rng.random((7, 7, 3))
        arr = (np.kron(low, np.ones((40, 48, 1))) * 200 + rng.random((280, 336, 3)) * 55).astype("uint8")
        img = Image.fromarray(arr)
        refs = [sentence() for _ in range(args.refs)]
        for _ in range(args.captions):
            cap = sentence()
            rows += [{"img": img, "mt": cap, "refs": list(refs)} for _ in range(args.ratings)]
    return rows


def save_checkpoint(model, path: Path) -> Path:
    torch.save({"state_dict": {k: v.detach().clone() for k, v in model.state_dict().items()},
                "hyper_parameters": {k: v for k, v in vars(model.hparams).items()
                                     if isinstance(v, (str, int, float, bool, type(None)))}}, path)
    return path


# ------------------------------------------------------------------------------------ the run
def timed(fn):
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t, time.process_time() - c


def run_metric(name: str, authors, args, folder: Path, scratch: Path, rows: list[dict]) -> None:
    from capscore.scores import deneb as dn
    from capscore.scores import polos as pl

    ckpt = save_checkpoint(authors, scratch / f"{name}-{args.sizes}.ckpt")
    weights = scratch / f"weights-{args.sizes}"
    (weights / "sup-simcse-roberta-base").mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        target = weights / "sup-simcse-roberta-base" / f.name
        if not target.exists():
            target.write_bytes(f.read_bytes())
    if name == "polos":
        model = pl.load_polos(weights, checkpoint=ckpt)
        score = pl.score_polos
    else:
        model = dn.load_deneb(weights, checkpoint=ckpt, clip_arch=SIZES[args.sizes]["deneb_clip"])
        score = dn.score_deneb
    images, caps, refs = [r["img"] for r in rows], [r["mt"] for r in rows], [r["refs"] for r in rows]
    samples = lambda: [dict(r) for r in rows]  # noqa: E731  (predict writes into its samples)
    print(f"\n{name} ({args.sizes} sizes): {len(rows)} rows = {args.images} images x {args.captions} captions x "
          f"{args.ratings} ratings, {args.refs} references each; batch size {args.batch_size}; "
          f"{torch.get_num_threads()} threads; load {load()}")
    few = min(len(rows), 2 * args.batch_size)  # warm-up: first calls pay for kernel selection and page faults
    with torch.inference_mode():
        authors.predict([dict(r) for r in rows[:few]], cuda=False, show_progress=False, batch_size=args.batch_size)
    score(model, images[:few], caps[:few], refs[:few], batch_size=args.batch_size)
    best = {}
    for rep in range(args.repeats):  # interleaved, best of each
        with torch.inference_mode():
            (_, a_scores), ta, ca = timed(lambda: authors.predict(samples(), cuda=False, show_progress=False,
                                                                  batch_size=args.batch_size))
        b_scores, tb, cb = timed(lambda: score(model, images, caps, refs, layer_norm="batch", batch_size=args.batch_size))
        s_scores, ts, cs = timed(lambda: score(model, images, caps, refs, batch_size=args.batch_size))
        for key, val in (("authors", (ta, ca)), ("batch", (tb, cb)), ("sentence", (ts, cs))):
            if key not in best or val[0] < best[key][0]:
                best[key] = val
        print(f"  repeat {rep + 1}: authors {ta:7.2f} s   capscore (batch stats) {tb:7.2f} s   "
              f"capscore (sentence) {ts:7.2f} s   load {load()}")
    a = np.asarray([float(np.asarray(x).reshape(-1)[0]) for x in a_scores], dtype=np.float64)
    d_batch = float(np.max(np.abs(a - np.asarray(b_scores))))
    d_sent = float(np.max(np.abs(a - np.asarray(s_scores))))
    ta, ca = best["authors"]
    for key, label in (("batch", "layer_norm='batch' (parity)"), ("sentence", "layer_norm='sentence' (default)")):
        t, c = best[key]
        print(f"  capscore {label:32s} {t:7.2f} s  {len(rows) / t:7.1f} pairs/s   x{ta / t:.2f} wall, "
              f"x{ca / c:.2f} CPU vs the authors ({ta:.2f} s, {len(rows) / ta:.1f} pairs/s)")
    print(f"  max |score - authors'|: layer_norm='batch' {d_batch:.2e}   layer_norm='sentence' {d_sent:.2e}   "
          f"(scores span {a.min():.4f}..{a.max():.4f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--metrics", nargs="+", default=["polos"], choices=["polos", "deneb"])
    p.add_argument("--sizes", default="real", choices=sorted(SIZES))
    p.add_argument("--images", type=int, default=8)
    p.add_argument("--captions", type=int, default=2, help="distinct captions per image")
    p.add_argument("--ratings", type=int, default=3, help="rows per caption (Flickr8k-Expert: 3 experts)")
    p.add_argument("--refs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--polos-repo", type=Path, default=MIRRORS / "keio-smilab24+Polos" / "repo")
    p.add_argument("--deneb-repo", type=Path, default=MIRRORS / "Ka2ukiMatsuda+DENEB" / "repo")
    p.add_argument("--authors-site", type=Path, default=Path("/tmp/capscore-authors-site"),
                   help="folder holding pytorch-nlp (torchnlp)")
    p.add_argument("--scratch", type=Path, default=Path(tempfile.gettempdir()) / "capscore-learned-bench")
    args = p.parse_args()
    if not (args.authors_site / "torchnlp").is_dir():
        raise SystemExit(f"{args.authors_site}/torchnlp not found: pip install --no-deps --target {args.authors_site} "
                         "pytorch-nlp==0.5.0")
    torch.set_num_threads(args.threads)
    args.scratch.mkdir(parents=True, exist_ok=True)
    rows = make_rows(args)
    corpus = [r["mt"] for r in rows] + [x for r in rows for x in r["refs"]]
    folder = roberta_folder(args.scratch / f"roberta-{args.sizes}", corpus, args.sizes)
    print(f"load average before: {load()}")
    models = authors_models(args, folder, args.scratch, args.metrics)
    for name in args.metrics:
        run_metric(name, models[name], args, folder, args.scratch, rows)
    print(f"\nload average after: {load()}")


if __name__ == "__main__":
    main()
