"""The ``scenes-tiny`` recipe: train a small CLIP from scratch on capscore's synthetic scenes.

``capscore train scenes-tiny --out DIR`` runs it through the one loop (:mod:`capscore.train.loop`), so
checkpoints, exact resume, logs, evaluation and the model card are those of every recipe. The output folder
also holds the bundled format, ``scenes-tiny.safetensors`` (fp16) and ``scenes-tiny.json``
(:func:`bundle_report`). The bundled models are this recipe with the settings of their recipe files
(``capscore/train/recipe_files/``); the training studies behind those settings are in
docs/research/scenes-training.md. Parameters (:class:`ScenesTinyParams`):

* data (:class:`SceneStream`): micro-batch ``k`` is ``generate_scenes(B, seed, split="train",
  start=k·B)`` -- a pure function of (seed, k); no scene repeats, held-out (shape, colour) pairs never
  appear, not even in negatives (:func:`capscore.scenes.make_flaw` avoids them in train scenes);
* each image gets one positive text (the correct twin of its hard negative, the short caption, a
  paraphrase or a prefix of the long caption, in a random template style) and one **hard negative**:
  the same kind of caption with one controlled error, its kind drawn among ``negative_kinds`` that apply
  to the scene -- uniformly, or by ``negative_weights``; ``prefix_p`` of the pairs carry CLIP-S's prompt
  prefix;
* **image twins** (``twins`` = p): after a scene, with probability p, its counterfactual twin
  (:func:`capscore.scenes.graph.counterfactual`: the scene edited so that its hard negative is true and
  the correct twin false) takes the next slot of the micro-batch, with the flawed caption as its positive
  and the exact correct caption as its negative -- a minimal pair both ways, so a text-only prior cannot
  win it. A micro-batch stays B examples;
* **several hard negatives per image** (``negatives_per_image`` = k): k − 1 further false captions per
  image, each a fresh draw of kind and error, as extra image→text columns of both terms (NegCLIP,
  Yuksekgonul et al. 2023, used one);
* **patch dropout** (``patch_dropout`` = r): in training forwards a random share r of each image's patch
  tokens is dropped after the stem and position embeddings (FLIP, Li et al. 2023, section 3, through
  open_clip's ``PatchDropout``); evaluation and export see all patches;
* loss: symmetric CLIP InfoNCE with the k·B hard negatives as extra image→text columns
  (:func:`capscore.train.objectives.hard_negative_contrastive_loss`), plus optionally ``dense_weight`` ×
  FILIP's token-wise max-similarity loss over patch and word tokens (``dense=filip``; Yao et al. 2022,
  section 3.1; :func:`capscore.train.objectives.filip_loss`), whose image→text columns are the B
  positives plus each image's own hard negatives (``dense_negatives=own``) or all k·B (``all``);
* **locked-text warm-up** (``lock_text_steps`` = N): for the first N steps the text tower stays at its
  init (texts encoded without gradient, so AdamW neither moves nor decays it); then both towers train.
  It counters feature suppression between jointly trained towers (Chen et al. 2021, "Intriguing
  Properties of Contrastive Losses"); LiT (Zhai et al. 2022) locks the image tower instead;
* **single-object curriculum** (``single_object_steps`` = N): micro-batches k < N (steps × accumulation)
  hold single-object scenes only, then scenes of ``min_objects`` .. 6 objects (curriculum learning,
  Bengio et al. 2009);
* **crowded scenes** (``min_objects`` = m): after the single-object phase the scenes hold m .. 6 objects
  (evaluation is unchanged: ``capscore scenes eval`` draws 1 .. 6);
* **bound negatives** (``bound_negatives`` = p): with probability p a colour, shape, count or
  hallucination negative is drawn among the *bound* errors of its scene (``make_flaw(bound=True)``: the
  new value is already on another object, so only binding tells the captions apart), where it has any;
* optimisation (the loop's; this recipe's defaults in :data:`OPTIM`, :data:`TRAIN_DEFAULTS`): AdamW, no
  weight decay on gains, biases, embeddings and the logit scale, linear warm-up then cosine decay to
  10 % of the peak rate, gradient clipping at 1.0; the model starts from the random init of
  ``openclip:ARCH`` with the run's seed (:data:`START_MODEL`), or from any model spec given.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import json
from open_clip.transformer import PatchDropout
from pathlib import Path
from safetensors.torch import save_file

from capscore.backbones.base import Backbone
from capscore.data.images import ImageRef
from capscore.errors import CapscoreError
from capscore.scenes.vocab import MAX_OBJECTS
from capscore.train import objectives as obj
from capscore.train.data import Example
from capscore.train.loop import encode_texts_bucketed
from capscore.train.options import RecipeParams, choice, non_negative, option, probability
from capscore.scenes import ERROR_KINDS, applicable_errors, generate_scenes, make_flaw, render_size
from capscore.scenes.captions import Caption, detail_units
from capscore.scenes.graph import counterfactual

HARD_NEGATIVE_KINDS = ("color", "shape", "count", "attribute_swap", "relation", "hallucination")
CLIP_S_PREFIX = "A photo depicts "
DENSE_TERMS = ("none", "filip")

# The v1 bundled model's optimisation (its MODEL_CARD): used where the user passes no option.
OPTIM = dict(lr=1e-3, batch_size=128, weight_decay=0.1)  # AdamW betas/eps: the loop's (0.9, 0.98), 1e-6
TRAIN_DEFAULTS = dict(steps=600, warmup=50, min_lr_ratio=0.1, grad_clip=1.0, no_decay=("embedding",))
START_MODEL = "openclip:scenes-tiny-v1"  # random init from the seed


def _kinds_ok(kinds: tuple[str, ...]) -> bool:
    return bool(kinds) and all(k in ERROR_KINDS for k in kinds)


@dataclass(frozen=True)
class ScenesTinyParams(RecipeParams):
    """The scenes-tiny recipe's parameters (each described in the module docstring)."""

    RECIPE = "scenes-tiny"
    negative_kinds: tuple[str, ...] = option(HARD_NEGATIVE_KINDS, "a list of the error kinds " +
                                             ", ".join(HARD_NEGATIVE_KINDS), _kinds_ok)
    negative_weights: tuple[float, ...] = ()  # one per negative kind; () = uniform
    prefix_p: float = option(0.25, "a probability in [0, 1]", probability)
    dense: str = choice(*DENSE_TERMS)
    dense_weight: float = option(0.0, "a float >= 0", non_negative)
    dense_negatives: str = choice("own", "all")
    twins: float = option(0.0, "a probability in [0, 1]", probability)
    lock_text_steps: int = option(0, "a number of steps >= 0", non_negative)
    single_object_steps: int = option(0, "a number of steps >= 0", non_negative)
    bound_negatives: float = option(0.0, "a probability in [0, 1]", probability)
    negatives_per_image: int = option(1, "a whole number >= 1", lambda v: v >= 1)
    patch_dropout: float = option(0.0, "a share of patches in [0, 1)", lambda v: 0.0 <= v < 1.0)
    min_objects: int = option(1, f"a whole number in [1, {MAX_OBJECTS}]", lambda v: 1 <= v <= MAX_OBJECTS)

    def check(self) -> None:
        w = self.negative_weights
        if w and (len(w) != len(self.negative_kinds) or min(w) < 0 or sum(w) <= 0):
            raise self.error("negative_weights", f"{len(self.negative_kinds)} non-negative numbers, one per "
                                                 "negative kind, not all zero (or none: uniform)")


def negative_mix(p: ScenesTinyParams) -> tuple[tuple[str, ...], np.ndarray | None]:
    """(kinds, weights or None for uniform) of the recipe parameters."""
    return p.negative_kinds, (np.array(p.negative_weights, dtype=float) if p.negative_weights else None)


def _positive_and_negative(scene, flaw, rng: np.random.Generator) -> tuple[str, str, str]:
    """A true caption and a false one. Half the time the exact twins (one edit apart); otherwise
    another true caption of the scene (short, paraphrase, long prefix) against the flawed twin. The third
    string is the exact correct twin in the negative's style (the negative of the scene's image twin)."""
    style = int(rng.integers(3))
    negative = flaw.flawed_caption.realise(style=style)
    twin = flaw.correct_caption.realise(style=style)
    r = rng.random()
    if r < 0.5:
        return twin, negative, twin
    if r < 0.65:
        return scene.short_caption(), negative, twin
    if r < 0.8:
        para = scene.paraphrases()
        return (para[int(rng.integers(len(para)))] if para else scene.short_caption()), negative, twin
    units = detail_units(scene)
    k = int(rng.integers(1, min(len(units), 4) + 1))  # short prefixes: cheap, and well inside 77 tokens
    return Caption(tuple(units[:k]), style=style).text, negative, twin


@dataclass(frozen=True)
class SceneStream:
    """Fresh training scenes with hard negatives; micro-batch ``k`` is a pure function of (seed, k)."""

    seed: int
    size: int = 64  # rendered image side (the model's input size)
    kinds: tuple[str, ...] = HARD_NEGATIVE_KINDS
    weights: np.ndarray | None = None  # None: uniform over the kinds that apply to each scene
    prefix_p: float = 0.25  # share of pairs with the CLIP-S prompt prefix, so CLIP-S scoring sees it
    twins: float = 0.0  # probability that a scene's image twin (capscore.scenes.graph.counterfactual) follows it
    single_until: int = 0  # micro-batches k < this hold single-object scenes (a curriculum); 0: none
    bound: float = 0.0  # probability that a colour/shape/count/hallucination negative is drawn bound (make_flaw)
    per_image: int = 1  # hard negatives per image: the first as before, the others in ``Example.more_negatives``
    min_objects: int = 1  # after the single-object phase, scenes hold min_objects .. MAX_OBJECTS objects

    def batch(self, k: int, batch_size: int) -> list[Example]:
        one = dict(min_objects=1, max_objects=1) if k < self.single_until else dict(min_objects=self.min_objects)
        scenes = generate_scenes(batch_size, seed=self.seed, split="train", size=self.size, start=k * batch_size,
                                 **one)
        rng = np.random.default_rng([self.seed, k, 17])
        out = []
        for s in scenes:
            if len(out) == batch_size:  # image twins fill slots: the last scenes go unused
                break
            kind, flaw = self._flaw(s, rng)
            pos, neg, right = _positive_and_negative(s, flaw, rng)
            prefix = CLIP_S_PREFIX if rng.random() < self.prefix_p else ""
            pos, neg, right = prefix + pos, prefix + neg, prefix + right
            more, flaws = self._more(s, rng, prefix)
            out.append(Example(ImageRef(image=s.render(), name=s.id), pos, source=s.id, negative=neg,
                               more_negatives=more, extra={"scene": s, "kind": kind, "flaw": flaw, "more_flaws": flaws}))
            if self.twins > 0 and len(out) < batch_size and rng.random() < self.twins:
                twin = counterfactual(s, flaw)
                if twin is not None:  # the flawed text is the twin's positive, the exact correct twin its negative
                    more, flaws = self._more(twin, rng, prefix)
                    out.append(Example(ImageRef(image=twin.render(), name=twin.id), neg, source=twin.id,
                                       negative=right, more_negatives=more,
                                       extra={"scene": twin, "kind": kind, "twin_of": s.id, "more_flaws": flaws}))
        return out

    def _flaw(self, s, rng: np.random.Generator):
        """(kind, flaw): a kind among those of ``kinds`` that apply to scene ``s`` (by ``weights``), one error of it."""
        ok = applicable_errors(s)
        idx = [i for i, kind in enumerate(self.kinds) if kind in ok]
        if not idx:  # no chosen kind applies to this scene: every scene still gets a negative
            raise CapscoreError(f"scene {s.id}: none of the negative kinds {self.kinds} applies; "
                                f"add one of {sorted(ok)} to negative_kinds")
        if self.weights is None:
            kind = self.kinds[idx[int(rng.integers(len(idx)))]]
        else:
            w = self.weights[idx]
            if w.sum() <= 0:
                w = np.ones(len(idx))
            kind = self.kinds[idx[int(rng.choice(len(idx), p=w / w.sum()))]]
        return kind, make_flaw(s, kind, rng, bound=self.bound > 0 and rng.random() < self.bound)

    def _more(self, s, rng: np.random.Generator, prefix: str) -> tuple[tuple[str, ...], tuple]:
        """(texts, flaws): ``per_image - 1`` further false captions of scene ``s``, each a fresh draw of kind
        and error, in a random template style, with the scene's prefix (so the prefix never tells a positive
        from a negative). Nothing is drawn when ``per_image`` is 1, so such runs keep their random stream."""
        flaws = tuple(self._flaw(s, rng)[1] for _ in range(self.per_image - 1))
        return tuple(prefix + f.flawed_caption.realise(style=int(rng.integers(3))) for f in flaws), flaws


def data(bb: Backbone, p: ScenesTinyParams, *, seed: int) -> SceneStream:
    kinds, weights = negative_mix(p)
    return SceneStream(seed, size=render_size(bb), kinds=kinds, weights=weights, prefix_p=p.prefix_p,
                       twins=p.twins, single_until=p.single_object_steps, bound=p.bound_negatives,
                       per_image=p.negatives_per_image, min_objects=p.min_objects)


def prepare(bb: Backbone, p: ScenesTinyParams) -> dict:
    """The checks that need the model (the parameters themselves were checked when they were built)."""
    if p.dense != "none" and not (bb.has_patch_tokens and bb.has_token_features):
        raise CapscoreError(f"{bb.spec}: dense={p.dense} needs patch tokens and token features "
                            "(an open_clip ViT with a causal text tower)")
    if p.patch_dropout > 0 and not hasattr(getattr(bb.model, "visual", None), "patch_dropout"):
        raise CapscoreError(f"{bb.spec}: patch_dropout needs an open_clip ViT image tower")
    return {}


@contextmanager
def _dropping_patches(bb: Backbone, prob: float):
    """FLIP's patch dropout (Li et al. 2023, "Scaling Language-Image Pre-training via Masking", section 3:
    a random share ``prob`` of each image's patch tokens is removed before the transformer, per image, in
    training only) through open_clip's ``PatchDropout``, switched on for one forward and restored after."""
    if prob <= 0:
        yield
        return

    visual = bb.model.visual
    old = visual.patch_dropout
    visual.patch_dropout = PatchDropout(prob)
    try:
        yield
    finally:
        visual.patch_dropout = old


def step(bb: Backbone, batch: list[Example], *, p: ScenesTinyParams, step: int = 0,
         **_) -> tuple[torch.Tensor, dict]:
    n = len(batch)
    text_grad = step >= p.lock_text_steps  # False: texts without gradient, a locked text tower
    px = torch.stack([bb.preprocess(e.image.image) for e in batch]).to(bb.device, bb.dtype)  # (B, 3, H, W)
    k = {len(e.more_negatives) for e in batch}
    if len(k) != 1:
        raise CapscoreError(f"scenes-tiny: every image needs the same number of hard negatives, got {sorted(k)}")
    more = [[e.more_negatives[j] for e in batch] for j in range(k.pop())]
    texts = [e.caption for e in batch] + [e.negative for e in batch] + sum(more, [])  # positives, then k blocks of negatives
    scale = bb.logit_scale.exp()
    with _dropping_patches(bb, p.patch_dropout):  # (B, D) and, for the dense term, (B, N, D): N kept patches
        img, patches = bb.forward_images(px, patches=p.dense != "none")
    if p.dense == "none":
        with torch.set_grad_enabled(text_grad):
            txt = encode_texts_bucketed(bb, texts)  # ((1+k)B, D)
        return obj.hard_negative_contrastive_loss(img, txt[:n], txt[n:], scale)
    with torch.set_grad_enabled(text_grad):
        txt, tokens, lengths = encode_texts_bucketed(bb, texts, tokens=True)  # ((1+k)B, D), ((1+k)B, L, D), ((1+k)B,)
    loss, parts = obj.hard_negative_contrastive_loss(img, txt[:n], txt[n:], scale)
    mask = torch.arange(tokens.shape[1], device=tokens.device)[None] < lengths[:, None].to(tokens.device)
    dense = obj.filip_loss(patches, tokens, mask, scale, negative_columns=p.dense_negatives)
    return loss + p.dense_weight * dense, {**parts, "global": loss.item(), "dense": dense.item()}


def export_bundled(bb: Backbone, path, metadata: dict) -> None:
    """fp16 safetensors in open_clip layout: a drop-in for ``capscore/scenes/weights/`` (metadata: strings)."""
    path = Path(path)
    state = {k: v.detach().cpu().to(torch.float16).contiguous() for k, v in bb.model.state_dict().items()
             if v.is_floating_point()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(state, str(tmp), metadata={k: str(v) for k, v in metadata.items()})
    tmp.replace(path)


def bundle_report(log_path, *, arch: str | None, command: str, config: dict, recipe_params: dict,
                  n_params: int, evaluation: dict | None, every: int = 50) -> dict:
    """The training report that sits beside a bundled weights file (``capscore/scenes/weights/NAME.json``;
    ``tests/test_scenes_tiny.py`` re-measures its ``evaluation``): the architecture, the command, the
    loop's config and the recipe's parameters, the parameter count, the training time (the sum of the
    logged per-step seconds, evaluations excluded), the loss log as means over blocks of ``every``
    steps, the torch version and thread count, and the ``capscore scenes eval`` result."""
    logged = [e for e in map(json.loads, Path(log_path).read_text().splitlines()) if "loss" in e]
    steps = sorted({e["step"]: e for e in logged}.values(), key=lambda e: e["step"])  # a resume may repeat steps
    history = []
    for end in range(every, len(steps) + 1, every):
        block = steps[end - every:end]
        row = {"step": block[-1]["step"]}
        for key in ("loss", "i2t_acc", "hardneg_acc", "global", "dense"):
            if all(key in e for e in block):
                row[key] = sum(e[key] for e in block) / len(block)
        history.append({**row, "lr": block[-1]["lr"]})
    return {"arch": arch, "command": command, "config": config, "recipe_params": recipe_params,
            "params": n_params, "wall_s": sum(e.get("sec", 0.0) for e in steps), "history": history,
            "torch": torch.__version__, "threads": torch.get_num_threads(), "evaluation": evaluation}
