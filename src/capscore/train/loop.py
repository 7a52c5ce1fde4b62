"""One small training loop shared by every recipe (nanoGPT style: read it top to bottom).

A recipe supplies ``step_fn(backbone, batch, *, step, state, rng) -> (loss, logs)``;
this loop owns everything else: the data order, AdamW with warmup + cosine decay,
gradient accumulation, mixed precision (``amp``: by default autocast on CUDA and fp32 on CPU;
``amp="bf16"`` autocasts on CPU too), deterministic kernels on request (``deterministic``), gradient all-reduce across
``torchrun`` processes, periodic evaluation, JSONL logs (+ TensorBoard when
installed and asked for), checkpoints and exact resume.

Exact resume: the data order and every random draw of a micro-batch are functions
of (seed, micro-batch index) only — the epoch permutation is ``randperm`` seeded
with ``seed·1000003 + epoch``, the recipe's ``rng`` is ``random.Random(f"{seed}|{k}")``
— so a checkpoint needs the step counter, the weights, the optimizer moments, the
recipe state (e.g. SPECS' margin) and the global torch/numpy/python RNG states (for
anything else that draws, e.g. dropout); all are saved and restored.

Multi-GPU: launch with ``torchrun --nproc-per-node N capscore train ...``. Each
process takes a 1/N slice of every global micro-batch and gradients are averaged
with ``all_reduce`` after backward — the same code path as one CPU process
(world size 1 skips the collective). As in open_clip without ``--gather-with-grad``,
contrastive losses see the local slice as their batch.
"""
from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
import shutil
from safetensors.torch import load_file, save_file

from capscore._log import open_bar
from capscore.backbones.base import Backbone
from capscore.errors import CapscoreError, param_error
from capscore.train.data import Example
from capscore.train.options import AMP_MODES  # auto, bf16, fp16, off

StepFn = Callable[..., tuple[torch.Tensor, dict]]


class ExampleStream(Protocol):
    """Training data that is never repeated: ``batch(k, batch_size)`` is global micro-batch ``k``,
    a pure function of (the stream's seed, k), so resume needs no data state."""

    def batch(self, k: int, batch_size: int) -> list[Example]: ...


@dataclass
class TrainConfig:
    steps: int = 100  # optimizer steps
    batch_size: int = 16  # examples per micro-batch (global, over all processes)
    accum: int = 1  # micro-batches per optimizer step
    lr: float = 1e-5
    min_lr_ratio: float = 0.0  # cosine decays to lr · min_lr_ratio
    warmup: int = 10
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-6
    grad_clip: float | None = None
    seed: int = 0
    eval_every: int = 0  # 0: only before and after training
    ckpt_every: int = 0  # 0: only at the end
    keep_checkpoints: int = 0  # keep only the N newest step-* folders (0: keep all); resume needs just the newest
    log_every: int = 1
    device: str = "cpu"
    tensorboard: bool = False
    no_decay: tuple[str, ...] = ()  # extra parameter-name substrings exempt from weight decay
    amp: str = "auto"  # autocast: "auto" (CUDA: bf16 where supported, else fp16; CPU: off), "bf16", "fp16", "off"
    deterministic: bool = False  # torch.use_deterministic_algorithms during the run (for CUDA; the CPU loop is exact anyway)


@dataclass
class TrainResult:
    steps: int
    history: list[dict] = field(default_factory=list)  # one entry per logged step
    evals: list[dict] = field(default_factory=list)  # {"step": k, **metrics}
    state: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- helpers


def autocast_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    """The dtype the loop autocasts its forward pass to (None: no autocast, fp32).

    ``auto`` is what mixed-precision CLIP training does on a GPU (open_clip's ``--precision amp``): bf16
    where the GPU supports it, else fp16 with a GradScaler; on CPU it trains in fp32. ``bf16`` autocasts
    on CPU too: weights, optimizer moments and gradients stay fp32, the towers' matmuls and convolutions
    run in bf16 (8-bit mantissa), the objectives stay fp32 (:mod:`capscore.train.objectives`). It pays on
    CPUs with bf16 units, and least where fp32 objectives such as the FILIP term are a large share of the
    step (``benchmarks/train_amp.py`` measures it; docs/train.md).
    ``fp16`` needs CUDA (CPU fp16 autocast has no loss scaler here)."""
    if amp not in AMP_MODES:
        raise param_error("amp", "train", " or ".join(map(repr, AMP_MODES)), amp)
    cuda = device.type == "cuda"
    if amp == "off" or (amp == "auto" and not cuda):
        return None
    if amp == "fp16" and not cuda:
        raise CapscoreError("amp='fp16' needs a CUDA device; on CPU use amp='bf16' or amp='off'")
    if amp == "bf16" or (amp == "auto" and torch.cuda.is_bf16_supported()):
        return torch.bfloat16
    return torch.float16


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to ``lr`` over ``warmup`` steps, then cosine to ``lr · min_lr_ratio``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def batch_indices(k: int, n: int, cfg: TrainConfig) -> list[int]:
    """Example indices of global micro-batch ``k``: epochs of a seeded permutation, last partial batch dropped."""
    per_epoch = n // cfg.batch_size
    if per_epoch == 0:
        raise CapscoreError(f"batch_size {cfg.batch_size} is larger than the {n} training examples")
    epoch, pos = divmod(k, per_epoch)
    g = torch.Generator().manual_seed(cfg.seed * 1000003 + epoch)
    perm = torch.randperm(n, generator=g)
    return perm[pos * cfg.batch_size : (pos + 1) * cfg.batch_size].tolist()


def param_groups(model: torch.nn.Module, weight_decay: float, no_decay_names: tuple[str, ...] = ()) -> list[dict]:
    """Decay matrices only: not biases, norms, logit_scale, or positional embeddings
    (the last keeps LongCLIP's frozen rows exactly frozen under AdamW), nor parameters whose
    name contains one of ``no_decay_names`` (a recipe's choice, e.g. scenes-tiny's "embedding")."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        skip = p.ndim < 2 or "logit_scale" in name or "positional_embedding" in name
        skip = skip or any(s in name for s in no_decay_names)
        (no_decay if skip else decay).append(p)
    if not decay and not no_decay:
        raise CapscoreError("nothing to train: every parameter is frozen")
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def encode_texts(backbone: Backbone, texts: list[str]) -> torch.Tensor:
    """Texts -> (B, D) joint-space vectors WITH gradients (tokenise, truncate, pad to longest)."""
    ids = [backbone.truncate(r) for r in backbone.tokenize(texts)]
    L = max(len(r) for r in ids) if backbone.pad_to_longest_exact else backbone.context_length
    x = torch.full((len(ids), L), backbone.pad_id, dtype=torch.long)  # (B, L)
    for i, r in enumerate(ids):
        x[i, : len(r)] = torch.tensor(r)
    lengths = torch.tensor([len(r) for r in ids])
    return backbone.forward_texts(x.to(backbone.device), lengths)[0]


def encode_texts_bucketed(backbone: Backbone, texts: list[str], *, chunk: int = 64, tokens: bool = False):
    """Like :func:`encode_texts`, but over length-sorted chunks each padded to its own longest
    (exact for towers with ``pad_to_longest_exact``: pads are never attended to). Captions of
    ~8 to ~60 tokens padded to one longest waste most of the text compute.

    Returns (B, D) in input order; with ``tokens=True`` also (B, L, D) token features (zeros
    past each text's length, L = the longest) and the (B,) lengths — FILIP's inputs.
    """
    ids = [backbone.truncate(r) for r in backbone.tokenize(texts)]
    lengths = torch.tensor([len(r) for r in ids])
    x = torch.full((len(ids), int(lengths.max())), backbone.pad_id, dtype=torch.long)  # (B, L)
    for i, r in enumerate(ids):
        x[i, : len(r)] = torch.tensor(r)
    order = torch.argsort(lengths)
    parts, tok_parts = [], []
    for idx in order.split(chunk):
        n = int(lengths[idx].max())
        g, t = backbone.forward_texts(x[idx, :n].to(backbone.device), lengths[idx], tokens=tokens)
        parts.append(g)
        if tokens:
            tok_parts.append(torch.nn.functional.pad(t, (0, 0, 0, x.shape[1] - n)))  # (b, L, D)
    back = torch.argsort(order)
    if not tokens:
        return torch.cat(parts)[back]
    tok = torch.cat(tok_parts)[back]
    mask = torch.arange(x.shape[1])[None, :] < lengths[:, None]  # (B, L)
    return torch.cat(parts)[back], tok * mask[..., None].to(tok.device, tok.dtype), lengths


class PixelCache:
    """Preprocessed pixels of training images, computed once (datasets here are small)."""

    def __init__(self, backbone: Backbone, max_items: int = 20000):
        self.backbone, self.max_items, self._d = backbone, max_items, {}

    def __call__(self, refs) -> torch.Tensor:
        out = []
        for ref in refs:
            key = ref.identity_hint()
            px = self._d.get(key)
            if px is None:
                px = self.backbone.preprocess(ref.load()[1])
                if len(self._d) < self.max_items:
                    self._d[key] = px
            out.append(px)
        return torch.stack(out).to(self.backbone.device, self.backbone.dtype)  # (B, C, H, W)


# ----------------------------------------------------------------------------- checkpoints
def _rng_state() -> tuple[dict, dict]:
    py = random.getstate()
    npst = np.random.get_state()
    meta = {"python": [py[0], list(py[1]), py[2]], "numpy": [npst[0], npst[1].tolist(), *npst[2:]]}
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors["cuda"] = torch.cuda.get_rng_state_all()
    return meta, tensors


def _set_rng_state(meta: dict, tensors: dict) -> None:
    v, st, g = meta["python"]
    random.setstate((v, tuple(st), g))
    name, keys, *rest = meta["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(tensors["torch"])
    if "cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(tensors["cuda"])


def save_checkpoint(folder: Path, backbone, optimizer, scaler, step: int, state: dict, cfg: TrainConfig) -> Path:
    """``folder/step-NNNNNN/``: model.safetensors, state.pt (optimizer + RNG tensors, loads with
    ``weights_only=True``), trainer.json (step, recipe state, config, python/numpy RNG)."""
    d = folder / f"step-{step:06d}"
    tmp = folder / f".tmp-step-{step:06d}"
    tmp.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in backbone.model.state_dict().items()},
              str(tmp / "model.safetensors"))
    meta, tensors = _rng_state()
    torch.save({"optimizer": optimizer.state_dict(), "rng": tensors,
                "scaler": scaler.state_dict() if scaler is not None else {}}, tmp / "state.pt")
    (tmp / "trainer.json").write_text(json.dumps({"step": step, "state": state, "rng": meta, "config": asdict(cfg)}))
    if d.exists():
        shutil.rmtree(d)
    tmp.rename(d)  # a crash mid-write never leaves a half checkpoint under the final name
    return d


def _checkpoints(folder: Path) -> list[Path]:
    """The ``step-*`` folders under ``folder``, oldest first."""
    return sorted(folder.glob("step-*"), key=lambda p: int(p.name.split("-")[1]))


def latest_checkpoint(folder: Path) -> Path | None:
    found = _checkpoints(folder)
    return found[-1] if found else None


def prune_checkpoints(folder: Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest ``step-*`` folders (``keep`` 0: none); returns those deleted.
    A checkpoint is ~3x the fp32 weights (weights + AdamW moments), so long runs with ``--ckpt-every``
    otherwise fill the disk."""
    if keep <= 0:
        return []
    gone = _checkpoints(folder)[:-keep]
    for d in gone:
        shutil.rmtree(d)
    return gone


def load_checkpoint(d: Path, backbone, optimizer, scaler, cfg: TrainConfig) -> tuple[int, dict]:
    info = json.loads((d / "trainer.json").read_text())
    saved = info["config"]
    for key in ("batch_size", "accum", "seed", "steps", "lr", "warmup", "amp"):
        was = saved.get(key, asdict(TrainConfig())[key])  # checkpoints from before a key existed: its default
        if was != asdict(cfg)[key]:
            raise CapscoreError(f"resume: {key} was {was} in {d}, now {asdict(cfg)[key]}; resume with the same "
                                "options")
    backbone.model.load_state_dict(load_file(str(d / "model.safetensors"), device=str(backbone.device)))
    # On the CPU: RNG states must be CPU byte tensors (torch.cuda.set_rng_state refuses CUDA ones), and
    # Optimizer.load_state_dict moves each moment to its parameter's device itself.
    st = torch.load(d / "state.pt", weights_only=True, map_location="cpu")
    optimizer.load_state_dict(st["optimizer"])
    if scaler is not None and st["scaler"]:
        scaler.load_state_dict(st["scaler"])
    _set_rng_state(info["rng"], st["rng"])
    backbone.invalidate_identity()
    return int(info["step"]), info["state"]


def _log_lines_until(log_path: Path, step: int) -> list[str]:
    """The complete lines of ``log.jsonl`` up to ``step``; a line cut short by a kill (the last one) is dropped."""
    keep = []
    lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    for n, ln in enumerate(lines, 1):
        if not ln.strip():
            continue
        try:
            entry = json.loads(ln)
            entry_step = int(entry["step"])
        except (ValueError, KeyError, TypeError, RecursionError):
            if n == len(lines):
                break  # half-written by the interrupted run: the step is logged again
            raise CapscoreError(f"{log_path}:{n}: not a training log line; expected a JSON object with 'step'") \
                from None
        if entry_step <= step:
            keep.append(ln)
    return keep


# ----------------------------------------------------------------------------- divergence
class TrainingDiverged(CapscoreError):
    """A run whose loss, gradient norm or weights stopped being finite; nothing of that step is saved."""


def finite_weights(params: list[torch.Tensor]) -> bool:
    """Whether every parameter is finite (one device sync for all of them)."""
    if not params:
        return True
    return bool(torch.stack([torch.isfinite(p.detach()).all() for p in params]).all())


def diverged(step: int, what: str, lr: float, ckpts: Path) -> TrainingDiverged:
    """The one-line stop of a diverged run, naming the checkpoint that is kept."""
    last = latest_checkpoint(ckpts) if ckpts.is_dir() else None
    kept = (f"the last checkpoint (finite weights), {last}, is kept" if last is not None
            else "no checkpoint had been saved (ckpt_every saves some along the way)")
    return TrainingDiverged(f"training diverged at step {step}: {what} (learning rate {lr:.3g}); the run stopped "
                            f"without saving this step and {kept}; try a lower learning rate, gradient clipping "
                            "or smaller loss weights")


# ----------------------------------------------------------------------------- the loop
def train(
    backbone: Backbone,
    step_fn: StepFn,
    examples: list[Example] | ExampleStream,
    cfg: TrainConfig,
    out: str | Path,
    *,
    state: dict | None = None,
    evaluate: Callable[[Backbone], dict] | None = None,
    resume: bool = False,
    stop_after: int | None = None,
) -> TrainResult:
    """Train ``backbone.model`` in place; ``stop_after`` ends early (for interruption tests)."""
    with deterministic_algorithms(cfg.deterministic, backbone.device):
        return _train(backbone, step_fn, examples, cfg, out, state=state, evaluate=evaluate, resume=resume,
                      stop_after=stop_after)


@contextmanager
def deterministic_algorithms(on: bool, device: torch.device):
    """``cfg.deterministic``: torch's deterministic algorithms for the run, the previous mode restored after.

    On the CPU the loop is already bit-reproducible for a seed (``tests/test_train_scenes_tiny.py``); on CUDA
    some kernels are not (atomic adds: e.g. ``scatter_add_`` in the FILIP term's backward, and cuBLAS's
    split reductions), and two identical runs drift apart (docs/train.md). This switches CUDA to the
    deterministic kernels torch has (``torch.use_deterministic_algorithms``, which covers ``scatter_add_``
    and cuDNN) and sets ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (cuBLAS's condition for reproducible GEMMs;
    a value the user set is kept). An operation that has no deterministic kernel on the device stops the
    run with a one-line error naming it, instead of training non-reproducibly."""
    if not on:
        yield
        return
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    was, was_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    except RuntimeError as e:
        msg = str(e)
        if "use_deterministic_algorithms" not in msg:
            raise
        raise CapscoreError(f"deterministic: {msg.split('. ')[0].strip()} on {device.type}; "
                            "train with deterministic=False") from None
    finally:
        torch.use_deterministic_algorithms(was, warn_only=was_warn)


def _train(backbone: Backbone, step_fn: StepFn, examples, cfg: TrainConfig, out, *, state, evaluate, resume,
           stop_after) -> TrainResult:
    out = Path(out)
    world, rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    if world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if cfg.device.startswith("cuda") else "gloo")
    main = rank == 0
    model = backbone.model
    optimizer = torch.optim.AdamW(param_groups(model, cfg.weight_decay, tuple(cfg.no_decay)), lr=cfg.lr,
                                  betas=cfg.betas, eps=cfg.eps)
    amp_dtype = autocast_dtype(cfg.amp, backbone.device)
    scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None
    params = [p for p in model.parameters() if p.requires_grad]  # model order: the clip norm's sum order
    state = dict(state or {})
    start, result = 0, TrainResult(cfg.steps, state=state)
    ckpts, log_path = out / "checkpoints", out / "log.jsonl"
    if resume:
        last = latest_checkpoint(ckpts)
        if last is None:
            raise CapscoreError(f"resume: no checkpoint under {ckpts}")
        start, state = load_checkpoint(last, backbone, optimizer, scaler, cfg)
        result.state = state
        if main and log_path.exists():  # drop lines written after that checkpoint: the log equals an uninterrupted run
            log_path.write_text("".join(ln + "\n" for ln in _log_lines_until(log_path, start)))
    elif main:
        out.mkdir(parents=True, exist_ok=True)
        log_path.write_text("")
    if not resume:
        torch.manual_seed(cfg.seed)
    tb = _tensorboard(out) if (cfg.tensorboard and main) else None
    pixels = PixelCache(backbone)

    def log(entry: dict) -> None:
        if main:
            with log_path.open("a") as f:
                f.write(json.dumps(entry) + "\n")
            if tb is not None:
                for k, v in entry.items():
                    if isinstance(v, (int, float)) and k != "step":
                        tb.add_scalar(k, v, entry["step"])

    def run_eval(step: int) -> None:
        if evaluate is None or not main:
            return
        model.eval()
        backbone.invalidate_identity()  # weights changed: never reuse cached vectors
        metrics = evaluate(backbone)
        model.train()
        result.evals.append({"step": step, **metrics})
        log({"step": step, "eval": metrics})

    if start == 0:
        run_eval(0)
    model.train()
    end = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    bar = open_bar(end - start, desc="training", unit="step", disable=None if main else True)
    for step in range(start, end):
        t0 = time.perf_counter()
        lr = lr_at(step, cfg)
        for g in optimizer.param_groups:
            g["lr"] = lr
        totals: dict[str, float] = {}
        for micro in range(cfg.accum):
            k = step * cfg.accum + micro  # global micro-batch index: fixes data and draws
            if isinstance(examples, list):
                batch = [examples[i] for i in batch_indices(k, len(examples), cfg)[rank::world]]
            else:  # a stream: micro-batch k is a pure function of (its seed, k), e.g. fresh synthetic scenes
                batch = examples.batch(k, cfg.batch_size)[rank::world]
            rng = random.Random(f"{cfg.seed}|{k}")
            with torch.autocast(backbone.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                loss, parts = step_fn(backbone, batch, step=step, state=state, rng=rng, pixels=pixels)
            loss = loss / cfg.accum
            (scaler.scale(loss) if scaler is not None else loss).backward()
            for name, v in {"loss": loss.item() * cfg.accum, **parts}.items():
                totals[name] = totals.get(name, 0.0) + float(v) / cfg.accum
        if world > 1:
            for p in params:
                if p.grad is not None:
                    torch.distributed.all_reduce(p.grad)
                    p.grad /= world
        if scaler is not None:
            scaler.unscale_(optimizer)
        if cfg.grad_clip:
            totals["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip))
        # fp16's scaler skips a step whose gradients overflowed (and lowers its scale): not a divergence
        watched = ("loss",) if scaler is not None else ("loss", "grad_norm")
        bad = next((k for k in watched if k in totals and not math.isfinite(totals[k])), None)
        if bad is not None:
            bar.close()
            raise diverged(step + 1, f"the {bad.replace('_', ' ')} is {totals[bad]}", lr, ckpts)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if not finite_weights(params):
            bar.close()
            raise diverged(step + 1, "the weights are no longer finite after the update", lr, ckpts)
        if isinstance(getattr(model, "logit_scale", None), torch.nn.Parameter):
            with torch.no_grad():  # as CLIP and open_clip: temperature at most 100
                model.logit_scale.clamp_(0, math.log(100))
        done = step + 1
        entry = {"step": done, "lr": lr, **totals, "sec": round(time.perf_counter() - t0, 4)}
        result.history.append(entry)
        bar.set_postfix(loss=f"{totals['loss']:.4f}", refresh=False)  # before update(), which draws the bar:
        bar.update(1)  # the bar shows this step's loss
        if done % cfg.log_every == 0 or done == cfg.steps:
            log({k: v for k, v in entry.items() if k != "sec"} | {"sec": entry["sec"]})
        if cfg.eval_every and done % cfg.eval_every == 0 and done != cfg.steps:
            run_eval(done)
        if main and ((cfg.ckpt_every and done % cfg.ckpt_every == 0) or done == cfg.steps):
            save_checkpoint(ckpts, backbone, optimizer, scaler, done, state, cfg)
            prune_checkpoints(ckpts, cfg.keep_checkpoints)
    bar.close()
    if end == cfg.steps:
        run_eval(cfg.steps)
    model.eval()
    backbone.invalidate_identity()
    if tb is not None:
        tb.close()
    return result


def _tensorboard(out: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415  (deferred: tensorboard)
    except ImportError:
        raise CapscoreError("tensorboard=True needs the 'tensorboard' package (pip install tensorboard)") from None
    return SummaryWriter(str(out / "tensorboard"))
