"""One prepared GPU check (run it where a GPU is lent; not run on CPU-only machines).

Everything on one GPU, in one run, random-init weights (open_clip ``pretrained=None``, seed 0), so
no download is needed:

1. pairs/s of capscore's scoring path (``capscore score``'s encoder + CLIP-S, images decoded from
   PNG files, cold in-memory cache) against torchmetrics ``CLIPScore`` given the same weights
   (converted to a Hugging Face folder), for ViT-B-32 and ViT-L-14, fp32 and fp16; with
   max |Δcos| between the two (expected ≤ 1e-5 in fp32, ≤ 1e-2 in fp16);
2. the Ray engine with CUDA actors (``capscore score --engine ray --device cuda`` on generated
   WebDataset shards, one actor per GPU): pairs/s, marginal over two sizes so start-up cancels;
3. ABE-CLIP on the GPU (ViT-B-32, fp32): pairs/s, and its ratio to CLIP-S on the same pairs;
4. FLEUR (``capscore.scores.judge``) on a random-weight LLaVA-1.5 of the real size (``--fleur-size 13b``,
   the paper's; ``7b``), fp16 and bf16, batch sizes ``--fleur-batches``: pairs/s of the whole judge
   (image padding and processing, prompt building, batched greedy generation, score reading and
   smoothing). Random weights never stop on their own, so a logits processor forces the answer
   "0.85</s>" (5 tokens, a typical FLEUR answer) — the prefill of ~640 tokens (576 image tokens) is
   the work being measured.

Results go to ``$OUT/gpu_check.json`` and ``$OUT/gpu_check.txt`` (``--out`` or ``$OUT``, default
``./gpu_check_out``). Reference points for docs/scale.md: clip-retrieval publishes ~2,500 pairs/s
(B/32) and ~312 pairs/s (L/14) per A100.

    OUT=/tmp/out python benchmarks/gpu_check.py                      # ~5-8 min on one H100/H200
    python benchmarks/gpu_check.py --images 400 --skip-ray           # quicker
    python benchmarks/gpu_check.py --parts fleur                     # FLEUR only (~3 min on one H200)
    python benchmarks/gpu_check.py --device cpu --images 4 --ray-shards 2 --ray-per-shard 10 --batch 16
                                          # checks on a CPU that the script runs (~13 min on 2 cores)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from score_throughput import make_data  # noqa: E402

RESULTS: dict = {}
LINES: list[str] = []


def say(line: str) -> None:
    print(line, flush=True)
    LINES.append(line)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def score_capscore(bb, rows, images_dir: Path, metric: str, batch: int):
    """The `capscore score` path: read_captions -> Encoder (cold, in memory) -> metric rows."""
    from capscore.data.captions import index_images, read_captions
    from capscore.embed import Encoder, MemoryCache

    enc = Encoder(bb, batch_size=batch, cache=MemoryCache(), workers=8)
    caps = images_dir.parent / "captions.jsonl"
    caps.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = list(read_captions(caps, images=index_images(images_dir)))
    try:  # the Metric pipeline (after the registry merge), else the older scorer
        from capscore.pipeline import score_all

        run = lambda: list(score_all(records, enc, metric, prefix=""))  # noqa: E731
    except ImportError:
        from capscore.scores.scorer import score_pair_records, score_records

        run = ((lambda: score_pair_records(records, enc, "abe")) if metric == "abe"  # noqa: E731
               else (lambda: list(score_records(records, enc, metric, prefix=""))))
    sync()
    t = time.perf_counter()
    out = run()
    sync()
    return time.perf_counter() - t, out, enc


def torchmetrics_pairs(hf_dir: Path, paths, rows, dtype: torch.dtype, device: str, batch_images: int = 64,
                       per_image: int = 5):
    from torchmetrics.functional.multimodal.clip_score import _clip_score_update
    from transformers import CLIPModel, CLIPProcessor
    from PIL import Image

    class Wrapped(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model, self.config = model, model.config

        def get_image_features(self, pixel_values):
            out = self.model.get_image_features(pixel_values=pixel_values.to(self.model.dtype))
            return out if isinstance(out, torch.Tensor) else out.pooler_output

        def get_text_features(self, input_ids, attention_mask=None):
            out = self.model.get_text_features(input_ids=input_ids, attention_mask=attention_mask)
            return out if isinstance(out, torch.Tensor) else out.pooler_output

    model = Wrapped(CLIPModel.from_pretrained(str(hf_dir)).eval().to(device, dtype))
    proc = CLIPProcessor.from_pretrained(str(hf_dir))
    by_name = {p.name: torch.from_numpy(np.array(Image.open(p).convert("RGB"))).permute(2, 0, 1) for p in paths}
    step = batch_images * per_image
    scores = []
    sync()
    t = time.perf_counter()
    with torch.inference_mode():
        for s in range(0, len(rows), step):
            part = rows[s : s + step]
            sc, _ = _clip_score_update([by_name[r["image"]] for r in part], [r["caption"] for r in part], model, proc)
            scores.append(sc.float().cpu())
    sync()
    return time.perf_counter() - t, torch.cat(scores).double() / 100.0


def part_throughput(work: Path, args) -> None:
    from capscore.backbones import load_backbone
    from capscore.backbones.hf_convert import save_open_clip_as_hf

    paths, rows = make_data(work / "images", args.images, 5)
    for arch in ("ViT-B-32", "ViT-L-14"):
        hf_dir = work / f"hf-{arch}"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cpu_bb = load_backbone(arch, seed=0)
            save_open_clip_as_hf(cpu_bb, hf_dir)
        del cpu_bb
        for dtype in ("fp32", "fp16"):
            key = f"{arch}/{dtype}"
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    bb = load_backbone(arch, seed=0, device=args.device, dtype=dtype)
                score_capscore(bb, rows[:50], work / "images", "clip-s", args.batch)  # warm-up (kernels, cuDNN)
                t_cap, cap_rows, _ = score_capscore(bb, rows, work / "images", "clip-s", args.batch)
                cap_cos = torch.tensor([r["score"] / 2.5 for r in cap_rows], dtype=torch.float64)
                td = torch.float16 if dtype == "fp16" else torch.float32
                torchmetrics_pairs(hf_dir, paths[:10], rows[:50], td, args.device)  # warm-up
                t_tm, tm_cos = torchmetrics_pairs(hf_dir, paths, rows, td, args.device)
                pos = cap_cos > 0  # capscore reports 2.5*max(cos, 0): compare where cos > 0
                d = float((cap_cos[pos] - tm_cos[pos]).abs().max()) if pos.any() else float("nan")
                RESULTS[key] = {"pairs": len(rows), "capscore_pairs_s": len(rows) / t_cap,
                                "torchmetrics_pairs_s": len(rows) / t_tm, "speedup": t_tm / t_cap, "max_dcos": d}
                say(f"{key:14s} capscore {len(rows) / t_cap:8.1f} pairs/s   torchmetrics {len(rows) / t_tm:8.1f} "
                    f"pairs/s   capscore x{t_tm / t_cap:.2f}   max|dcos| {d:.1e}")
                del bb
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            except Exception as e:  # noqa: BLE001  (one failed configuration must not lose the others)
                RESULTS[key] = {"error": repr(e)}
                say(f"{key}: FAILED {e!r}")
                traceback.print_exc()


def part_abe(work: Path, args) -> None:
    from capscore.backbones import load_backbone

    paths, rows = make_data(work / "abe-images", max(20, args.images // 5), 5)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            bb = load_backbone("ViT-B-32", seed=0, device=args.device, dtype="fp32")
        score_capscore(bb, rows[:20], work / "abe-images", "abe", args.batch)  # warm-up (spaCy, kernels)
        t_abe, abe_rows, _ = score_capscore(bb, rows, work / "abe-images", "abe", args.batch)
        t_clip, _, _ = score_capscore(bb, rows, work / "abe-images", "clip-s", args.batch)
        RESULTS["abe/ViT-B-32/fp32"] = {"pairs": len(rows), "abe_pairs_s": len(rows) / t_abe,
                                        "clip_s_pairs_s": len(rows) / t_clip, "abe_over_clip_s": t_abe / t_clip}
        say(f"ABE ViT-B-32 fp32: {len(rows) / t_abe:8.1f} pairs/s; CLIP-S {len(rows) / t_clip:8.1f} pairs/s; "
            f"ABE/CLIP-S time {t_abe / t_clip:.2f}x ({len(rows)} pairs)")
    except Exception as e:  # noqa: BLE001
        RESULTS["abe/ViT-B-32/fp32"] = {"error": repr(e)}
        say(f"ABE: FAILED {e!r}")
        traceback.print_exc()


class ForcedAnswer:
    """Makes every row answer ``answer`` then end-of-sequence (random weights would ramble to the limit):
    the next token is the answer's token after the longest answer prefix the row already ends with."""

    def __init__(self, tokenizer, answer: str):
        self.ids = tokenizer(answer, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]

    def __call__(self, input_ids, scores):
        forced = torch.full_like(scores, -1e4)
        for row, ids in enumerate(input_ids[:, -len(self.ids):].tolist()):
            k = max(j for j in range(len(self.ids)) if j == 0 or ids[-j:] == self.ids[:j])
            forced[row, self.ids[k]] = 0.0
        return forced


def llava_parts(size: str, device: str):
    """A random-weight LLaVA-1.5 (transformers layout) with a test tokenizer and CLIP image processor."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import (CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, PreTrainedTokenizerFast)

    from capscore.scores.judge import FLEUR_PROMPT

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([FLEUR_PROMPT, "USER: ASSISTANT: a dog on the grass 0 1 2 3 4 5 6 7 8 9 ."] * 3,
                            trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>", "<pad>", "<image>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                        unk_token="<unk>")
    if size == "tiny":
        text = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=1024)
        vision = CLIPVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                  image_size=56, patch_size=14)
    else:  # llava-hf/llava-1.5-{7b,13b}-hf: Vicuna (Llama) + CLIP ViT-L/14-336, 576 image tokens
        h, layers, heads, ffn = (5120, 40, 40, 13824) if size == "13b" else (4096, 32, 32, 11008)
        text = LlamaConfig(vocab_size=32064, hidden_size=h, intermediate_size=ffn, num_hidden_layers=layers,
                           num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=4096,
                           rms_norm_eps=1e-5)
        vision = CLIPVisionConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                                  num_attention_heads=16, image_size=336, patch_size=14, projection_dim=768)
    text.bos_token_id, text.eos_token_id, text.pad_token_id = 1, 2, 3
    cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_index=4, vision_feature_layer=-2,
                      vision_feature_select_strategy="default", projector_hidden_act="gelu")
    torch.manual_seed(0)
    with torch.device(device):
        model = LlavaForConditionalGeneration._from_config(cfg, dtype=torch.float16 if device != "cpu" else torch.float32)
    side = vision.image_size
    proc = CLIPImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    return model.eval(), tokenizer, proc


def part_fleur(work: Path, args) -> None:
    from capscore.backbones.vlm import judge_from_parts
    from capscore.scores.judge import judge

    size = "tiny" if args.device == "cpu" else args.fleur_size
    try:
        t = time.perf_counter()
        model, tokenizer, proc = llava_parts(size, args.device)
        say(f"FLEUR: random LLaVA-1.5 ({size}) built in {time.perf_counter() - t:.0f} s")
    except Exception as e:  # noqa: BLE001
        RESULTS["fleur"] = {"error": repr(e)}
        say(f"FLEUR: FAILED to build the model {e!r}")
        traceback.print_exc()
        return
    rng = np.random.default_rng(0)
    n = max(args.fleur_batches) * 2 if args.device != "cpu" else 4
    images = [Image.fromarray((rng.random((300 + 7 * (i % 5), 400, 3)) * 255).astype("uint8")) for i in range(n)]
    captions = [f"a dog on the grass {i}" for i in range(n)]
    dtypes = ("fp16", "bf16") if args.device != "cpu" else ("fp32",)
    for dtype in dtypes:
        td = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
        model.to(td)
        vlm = judge_from_parts(model, tokenizer, proc, name=f"random-llava-{size}")
        for b in (args.fleur_batches if args.device != "cpu" else (1, 2)):
            key = f"fleur/{size}/{dtype}/b{b}"
            try:
                force = ForcedAnswer(tokenizer, "0.85")
                judge(vlm, "fleur", images[:b], captions[:b], batch_size=b, logits_processor=[force])  # warm-up
                sync()
                t = time.perf_counter()
                out = judge(vlm, "fleur", images, captions, batch_size=b, logits_processor=[force])
                sync()
                dt = time.perf_counter() - t
                ok = sum(not np.isnan(v.score) for v in out)
                mem = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
                RESULTS[key] = {"pairs": n, "pairs_s": n / dt, "scored": ok, "peak_gib": mem}
                say(f"{key:24s} {n / dt:8.2f} pairs/s  ({n} pairs, {ok} scored, peak {mem:.1f} GiB)")
            except Exception as e:  # noqa: BLE001  (one failed configuration must not lose the others)
                RESULTS[key] = {"error": repr(e)}
                say(f"{key}: FAILED {e!r}")
                traceback.print_exc()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    del model


def part_ray(work: Path, args) -> None:
    from ray_scale import make_shards

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    out = {}
    for shards in (args.ray_shards // 2, args.ray_shards):
        pattern = make_shards(work / f"shards{shards}", shards, args.ray_per_shard)
        dest = work / f"ray-out{shards}"
        cmd = [sys.executable, "-m", "capscore.cli", "-q", "score", "--engine", "ray", "--webdataset", pattern,
               "--model", "ViT-B-32", "--metric", "clip-s", "--device", args.device, "--dtype", "fp16", "--no-cache",
               "--batch-size", str(args.batch), "--out", str(dest)]
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        out[shards] = time.perf_counter() - t
        if proc.returncode:
            RESULTS["ray"] = {"error": proc.stderr[-2000:]}
            say(f"Ray: FAILED (exit {proc.returncode}): {proc.stderr[-500:]}")
            return
    a, b = args.ray_shards // 2, args.ray_shards
    marginal = (b - a) * args.ray_per_shard / max(out[b] - out[a], 1e-9)
    RESULTS["ray"] = {"gpus": torch.cuda.device_count(), "pairs": b * args.ray_per_shard, "wall_s": out[b],
                      "pairs_s_overall": b * args.ray_per_shard / out[b], "pairs_s_marginal": marginal,
                      "startup_s": out[a] - a * args.ray_per_shard / marginal}
    say(f"Ray, CUDA actors ({torch.cuda.device_count()} GPU), ViT-B-32 fp16: {b * args.ray_per_shard} pairs in "
        f"{out[b]:.1f} s = {b * args.ray_per_shard / out[b]:.0f} pairs/s overall, {marginal:.0f} pairs/s marginal")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=2000, help="images (x5 captions each) for part 1")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--ray-shards", type=int, default=8)
    p.add_argument("--ray-per-shard", type=int, default=1000)
    p.add_argument("--skip-ray", action="store_true")
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS), help="which parts to run")
    p.add_argument("--fleur-size", default="13b", choices=["13b", "7b"], help="LLaVA-1.5 size for the FLEUR part")
    p.add_argument("--fleur-batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_check_out")))
    p.add_argument("--device", default="cuda", help="cuda (default); cpu only to check that the script runs "
                   "(with tiny sizes: --images 4 --ray-shards 2 --ray-per-shard 10); its figures mean nothing")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu_check.py needs a CUDA GPU (torch.cuda.is_available() is False); "
                         "--device cpu only checks that it runs")
    name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "CPU (a smoke run, not a measurement)"
    RESULTS["device"] = {"name": name, "count": torch.cuda.device_count(), "torch": torch.__version__,
                         "cpus": os.cpu_count()}
    say(f"GPU: {name} x{torch.cuda.device_count()}, torch {torch.__version__}, {os.cpu_count()} CPUs; "
        f"load average {os.getloadavg()[0]:.2f}")
    work = Path(tempfile.mkdtemp(prefix="capscore-gpu-"))
    try:
        for part in [PARTS[name] for name in args.parts if not (name == "ray" and args.skip_ray)]:
            t = time.perf_counter()
            part(work, args)
            say(f"  ({part.__name__}: {time.perf_counter() - t:.0f} s)")
            (args.out / "gpu_check.json").write_text(json.dumps(RESULTS, indent=1))  # after each part
            (args.out / "gpu_check.txt").write_text("\n".join(LINES) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"load average after: {os.getloadavg()[0]:.2f}; results in {args.out}")
    (args.out / "gpu_check.txt").write_text("\n".join(LINES) + "\n")


PARTS = {"throughput": part_throughput, "abe": part_abe, "ray": part_ray, "fleur": part_fleur}

if __name__ == "__main__":
    main()
