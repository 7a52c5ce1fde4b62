"""Train the bundled ``scenes-tiny`` model from scratch on synthetic scenes (``capscore scenes train``).

Recipe (see ``MODEL_CARD.md``):

* data: ``generate_scenes(B, seed=seed, split="train", start=step * B)`` — batch ``step`` is a pure
  function of (seed, step), so the data order is fixed by the seed and no scene repeats; held-out
  (shape, colour) pairs never appear, not even in negatives (:func:`capscore.scenes.make_flaw` avoids
  them in train scenes);
* each image gets one positive text (the correct twin of its hard negative, the short caption, a
  paraphrase or a prefix of the long caption, in a random template style) and one **hard negative**:
  the same kind of caption with one controlled error from :data:`HARD_NEGATIVE_KINDS`;
* loss: symmetric CLIP InfoNCE. Image->text logits are (B, 2B): the B positives and the B hard
  negatives are all candidate columns; text->image logits are (B, B) over positives only;
* AdamW (no weight decay on gains, biases, embeddings and the logit scale), linear warm-up then
  cosine decay to 10 % of the peak rate; fp32 on CPU; ``torch.manual_seed(seed)`` before the model
  is built.
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ARCH = "scenes-tiny"
HARD_NEGATIVE_KINDS = ("color", "shape", "count", "attribute_swap", "relation", "hallucination")
CLIP_S_PREFIX = "A photo depicts "


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 600
    batch_size: int = 128
    seed: int = 0
    lr: float = 1e-3
    warmup: int = 50
    weight_decay: float = 0.1
    min_lr_ratio: float = 0.1
    prefix_p: float = 0.25  # share of pairs trained with the CLIP-S prompt prefix, so CLIP-S scoring sees it
    log_every: int = 50
    save_every: int = 250
    threads: int = 2


@dataclass(frozen=True)
class Pair:
    """One training row: an image and its positive / hard-negative texts."""

    scene_id: str
    positive: str
    negative: str
    kind: str


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def _positive_and_negative(scene, flaw, rng: np.random.Generator) -> tuple[str, str]:
    """A true caption and a false one. Half the time the exact twins (one edit apart); otherwise
    another true caption of the scene (short, paraphrase, long prefix) against the flawed twin."""
    from capscore.scenes.captions import Caption, detail_units

    style = int(rng.integers(3))
    negative = flaw.flawed_caption.realise(style=style)
    r = rng.random()
    if r < 0.5:
        return flaw.correct_caption.realise(style=style), negative
    if r < 0.65:
        return scene.short_caption(), negative
    if r < 0.8:
        para = scene.paraphrases()
        return (para[int(rng.integers(len(para)))] if para else scene.short_caption()), negative
    units = detail_units(scene)
    k = int(rng.integers(1, min(len(units), 4) + 1))  # short prefixes: cheap, and well inside 77 tokens
    return Caption(tuple(units[:k]), style=style).text, negative


def make_batch(step: int, cfg: TrainConfig, *, size: int = 64) -> tuple[list, list[Pair]]:
    """Scenes and (positive, hard negative) texts of batch ``step``: a pure function of (cfg.seed, step)."""
    from capscore.scenes import applicable_errors, generate_scenes, make_flaw

    scenes = generate_scenes(cfg.batch_size, seed=cfg.seed, split="train", size=size, start=step * cfg.batch_size)
    rng = np.random.default_rng([cfg.seed, step, 17])
    pairs = []
    for s in scenes:
        kinds = [k for k in HARD_NEGATIVE_KINDS if k in applicable_errors(s)]
        kind = kinds[int(rng.integers(len(kinds)))]
        flaw = make_flaw(s, kind, rng)
        pos, neg = _positive_and_negative(s, flaw, rng)
        if rng.random() < cfg.prefix_p:
            pos, neg = CLIP_S_PREFIX + pos, CLIP_S_PREFIX + neg
        pairs.append(Pair(s.id, pos, neg, kind))
    return scenes, pairs


class _Tokens:
    """Token ids per text (cached: the scene language is small), padded to the batch's longest."""

    def __init__(self, backbone):
        self.bb = backbone
        self.cache: dict[str, list[int]] = {}

    def __call__(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        new = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if new:
            for t, ids in zip(new, self.bb.tokenize(new)):
                self.cache[t] = self.bb.truncate(ids)
        rows = [self.cache[t] for t in texts]
        x = torch.full((len(rows), max(map(len, rows))), self.bb.pad_id, dtype=torch.long)  # (N, L)
        for i, r in enumerate(rows):
            x[i, : len(r)] = torch.tensor(r)
        return x, torch.tensor([len(r) for r in rows])


def encode_texts_bucketed(bb, ids: torch.Tensor, lengths: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """forward_texts over length-sorted chunks, each padded to its own longest (exact for the causal
    tower: pads are never attended to); returns (N, D) in input order. Captions vary from ~8 to ~60
    tokens, so one batch padded to its longest wastes most of the text compute."""
    order = torch.argsort(lengths)
    parts = []
    for idx in order.split(chunk):
        g, _ = bb.forward_texts(ids[idx, : int(lengths[idx].max())], lengths[idx])
        parts.append(g)
    return torch.cat(parts)[torch.argsort(order)]


def build_untrained(seed: int):
    """A randomly initialised scenes-tiny backbone (weights from ``seed``)."""
    import open_clip

    from capscore.backbones.openclip import OpenClipBackbone  # registers capscore's configs

    torch.manual_seed(seed)
    model, _, preprocess = open_clip.create_model_and_transforms(ARCH, pretrained=None)
    return OpenClipBackbone(model, preprocess, open_clip.get_tokenizer(ARCH), spec=f"{ARCH}#untrained")


def _param_groups(model: torch.nn.Module, wd: float) -> list[dict]:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.ndim < 2 or "embedding" in name or "logit_scale" in name or name.endswith("class_embedding"):
            no_decay.append(p)
        else:
            decay.append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def contrastive_loss(img: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, scale: torch.Tensor):
    """Symmetric InfoNCE; img, pos, neg are (B, D) normalised. Image->text over [pos; neg] (B, 2B)."""
    target = torch.arange(img.shape[0])
    i2t = scale * img @ torch.cat([pos, neg]).T  # (B, 2B)
    t2i = scale * pos @ img.T  # (B, B)
    loss = (F.cross_entropy(i2t, target) + F.cross_entropy(t2i, target)) / 2
    with torch.no_grad():
        stats = {"i2t_acc": (i2t.argmax(1) == target).float().mean().item(),
                 "hardneg_acc": ((img * pos).sum(1) > (img * neg).sum(1)).float().mean().item()}
    return loss, stats


def save_weights(model: torch.nn.Module, path: Path, metadata: dict) -> None:
    """fp16 safetensors (the bundled format); metadata values are strings."""
    from safetensors.torch import save_file

    state = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()
             if v.is_floating_point()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(state, str(tmp), metadata={k: str(v) for k, v in metadata.items()})
    tmp.replace(path)


def train(cfg: TrainConfig, out: Path, *, command: str = "", eval_scenes: int = 300, log=print) -> dict:
    """Train, save ``out`` (fp16 safetensors) and ``out.with_suffix('.json')`` (recipe, log, evaluation)."""
    torch.set_num_threads(cfg.threads)
    bb = build_untrained(cfg.seed)
    model = bb.model.train()
    opt = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-6)
    tokens = _Tokens(bb)
    history, t0, window = [], time.perf_counter(), []
    meta = {"arch": ARCH, "config": json.dumps(asdict(cfg)), "command": command,
            "hard_negative_kinds": ",".join(HARD_NEGATIVE_KINDS)}
    for step in range(cfg.steps):
        ts = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        scenes, pairs = make_batch(step, cfg)
        px = torch.stack([bb.preprocess(s.render()) for s in scenes])  # (B, 3, 64, 64), rendered once
        ids, lengths = tokens([p.positive for p in pairs] + [p.negative for p in pairs])  # (2B, L)
        img, _ = bb.forward_images(px)
        txt = encode_texts_bucketed(bb, ids, lengths)
        img, txt = F.normalize(img, dim=-1), F.normalize(txt, dim=-1)
        B = len(pairs)
        loss, stats = contrastive_loss(img, txt[:B], txt[B:], model.logit_scale.exp())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))
        window.append((loss.item(), stats["i2t_acc"], stats["hardneg_acc"], time.perf_counter() - ts))
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            w = np.array(window)
            row = {"step": step + 1, "loss": float(w[:, 0].mean()), "i2t_acc": float(w[:, 1].mean()),
                   "hardneg_acc": float(w[:, 2].mean()), "lr": lr_at(step, cfg),
                   "logit_scale": model.logit_scale.exp().item(), "s_per_step": float(w[:, 3].mean()),
                   "elapsed_s": time.perf_counter() - t0}
            history.append(row)
            window = []
            log(f"step {row['step']:5d}/{cfg.steps}  loss {row['loss']:.3f}  batch i2t {row['i2t_acc']:.3f}  "
                f"pos>hardneg {row['hardneg_acc']:.3f}  lr {row['lr']:.2e}  scale {row['logit_scale']:.1f}  "
                f"{row['s_per_step']:.2f} s/step  {row['elapsed_s'] / 60:.1f} min")
        if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < cfg.steps:
            save_weights(model, out, {**meta, "steps_done": step + 1})
    wall = time.perf_counter() - t0
    model.eval()
    save_weights(model, out, {**meta, "steps_done": cfg.steps, "wall_s": f"{wall:.0f}"})
    log(f"saved {out} ({out.stat().st_size / 1e6:.1f} MB) after {cfg.steps} steps in {wall / 60:.1f} min")
    report = {"arch": ARCH, "config": asdict(cfg), "command": command, "wall_s": wall,
              "params": sum(p.numel() for p in model.parameters()), "history": history,
              "torch": torch.__version__, "threads": cfg.threads}
    if eval_scenes:
        from capscore.scenes.evaluate import evaluate_scenes, format_report
        from capscore.scenes.tiny import backbone_from_file

        res = evaluate_scenes(backbone_from_file(out, spec=str(out)), n=eval_scenes)
        log(format_report(res))
        report["evaluation"] = res
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - `capscore scenes train` is the entry
    from capscore.cli import main as cli

    return cli(["scenes", "train", *(argv if argv is not None else sys.argv[1:])])
