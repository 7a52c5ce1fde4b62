"""Recipes: which weights train, what a batch becomes, which objective it feeds.

Each recipe is data (:class:`Recipe`): the example fields it needs, its
hyper-parameters with defaults (``--set key=value`` overrides them), a
``prepare`` (model surgery, freezing) and a ``step`` (batch -> loss). The loop in
:mod:`capscore.train.loop` is shared.

===============  ========================================================================
``contrastive``  CLIP InfoNCE on (image, caption); ``stretch=1`` first stretches a 77-token
                 tower to 248 (LongCLIP long-caption fine-tuning, without LongCLIP's
                 short-caption principal-component term)
``specs``        SPECS: (image, c_j, c_j + d⁺, c_j + d⁻) with the dynamic margin; stretches
                 to 248 first when the tower has 77 positions (SPECS builds on LongCLIP)
``prmcs``        PR-MCS: ``distill_steps`` of multilingual distillation of a student text
                 tower (a copy of the CLIP text tower) into the frozen teacher, then
                 PR-MCS fine-tuning of the student with the five perturbations; the image
                 tower is frozen throughout
``pacs``         PAC-S: real pairs + generated images + generated captions
``scenes-tiny``  the bundled model from scratch: fresh synthetic scenes, one hard-negative
                 caption per image, optional FILIP dense term (:mod:`capscore.train.scenes_tiny`)
===============  ========================================================================
"""
from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from capscore.backbones.base import Backbone
from capscore.errors import CapscoreError, unknown_name
from capscore.train import objectives as obj
from capscore.train import scenes_tiny
from capscore.train.data import Example, negative_detail
from capscore.train.loop import encode_texts
from capscore.train.surgery import freeze, freeze_tower, stretch_text_tower


@dataclass(frozen=True)
class Recipe:
    name: str
    needs: tuple[str, ...]
    params: dict
    prepare: Callable[[Backbone, dict], dict]  # returns the initial recipe state
    step: Callable[..., tuple[torch.Tensor, dict]]
    export: str = "ckpt"  # what the trained model is exported as
    citation: str = ""
    notes: dict = field(default_factory=dict)
    # A recipe that makes its own data (a stream) and starts from its own model with its own
    # TrainConfig defaults (used where the user passes no option): the scenes-tiny recipe.
    data: Callable | None = None  # (backbone, params, *, seed) -> ExampleStream
    start_model: str | None = None  # default --model
    train_defaults: dict = field(default_factory=dict)


def _scale(bb: Backbone) -> torch.Tensor:
    return bb.logit_scale.exp()


def _common_prepare(bb: Backbone, p: dict) -> None:
    if p.get("stretch") and bb.context_length < 248:
        stretch_text_tower(bb)
    if p.get("freeze_image"):
        freeze_tower(bb, "image")
    if p.get("freeze_text"):
        freeze_tower(bb, "text")
    if p.get("freeze"):
        freeze(bb.model, [s for s in str(p["freeze"]).split(",") if s])


# ----------------------------------------------------------------------------- contrastive
def _contrastive_prepare(bb, p):
    _common_prepare(bb, p)
    return {}


def _contrastive_step(bb, batch, *, p, pixels, **_):
    img, _ = bb.forward_images(pixels([e.image for e in batch]))  # (B, D)
    txt = encode_texts(bb, [e.caption for e in batch])  # (B, D)
    return obj.contrastive_loss(img, txt, _scale(bb)), {}


# ----------------------------------------------------------------------------- SPECS
def _specs_prepare(bb, p):
    _common_prepare(bb, p)
    return {"margin": 0.0}


def _specs_step(bb, batch, *, p, pixels, state, rng, **_):
    details = [e.detail for e in batch]
    neg = [negative_detail(details, i, rng, shuffle_prob=p["shuffle_prob"]) for i in range(len(batch))]
    texts = [e.caption for e in batch] + [e.base for e in batch]
    texts += [f"{e.base} {e.detail}" for e in batch] + [f"{e.base} {n}" for e, n in zip(batch, neg)]
    t = encode_texts(bb, texts).view(4, len(batch), -1)  # (4, B, D): caption, c_j, c_j+d⁺, c_j+d⁻
    img, _ = bb.forward_images(pixels([e.image for e in batch]))
    out = obj.specs_loss(img, t[0], t[1], t[2], t[3], _scale(bb), margin=state["margin"],
                         fixed_margin=p["fixed_margin"], alpha=p["alpha"], beta=p["beta"], gamma=p["gamma"],
                         margin_max=p["margin_max"], symmetric=bool(p["symmetric"]))
    state["margin"] = out.margin
    return out.loss, {"contrastive": out.contrastive.item(), "detail": out.detail.item(),
                      "negative": out.negative.item(), "margin": out.margin}


# ----------------------------------------------------------------------------- PR-MCS
def _prmcs_prepare(bb, p):
    # The teacher: a frozen copy of the backbone as it is now; the student text tower starts from it.
    teacher = copy.deepcopy(bb)
    teacher.model.eval().requires_grad_(False)
    bb.teacher = teacher
    freeze_tower(bb, "image")
    bb.model.logit_scale.requires_grad_(False)
    return {}


def _teacher_texts(bb, texts):
    with torch.no_grad():
        return encode_texts(bb.teacher, texts)


def _perturb(text: str, lang: str, rng: random.Random, p: dict) -> str:
    from capscore.perturb.prmcs import PERTURBATIONS, perturb

    kinds = list(PERTURBATIONS)
    rng.shuffle(kinds)
    for kind in kinds:  # substitution needs nouns (spaCy, English) — fall through to another kind
        if kind == "substitution" and lang != "en":
            continue
        out = perturb(text, kind, p=p["perturb_p"], seed=rng.randrange(2**31))
        if out.ok:
            return out.text
    return text + " " + text  # pragma: no cover - one-word captions


def _prmcs_step(bb, batch, *, p, pixels, step, rng, **_):
    langs = [[lang for lang, _ in e.translations] for e in batch]
    tr = [dict(e.translations) for e in batch]
    if step < p["distill_steps"]:  # stage 1: student(translation) -> teacher(English)
        pick = [rng.choice(ls) for ls in langs]
        student = encode_texts(bb, [t[lang] for t, lang in zip(tr, pick)])
        teacher = _teacher_texts(bb, [t.get("en", e.caption) for t, e in zip(tr, batch)])
        loss = obj.distillation_loss(student, teacher)
        return loss, {"distill": loss.item()}
    pick = [rng.choice(ls) for ls in langs]  # stage 2: PR-MCS on a random language per example
    orig = [t[lang] for t, lang in zip(tr, pick)]
    pert = [_perturb(o, lang, rng, p) for o, lang in zip(orig, pick)]
    t = encode_texts(bb, orig + pert).view(2, len(batch), -1)  # (2, B, D)
    img, _ = bb.forward_images(pixels([e.image for e in batch]))
    out = obj.prmcs_loss(img, t[0], t[1], _scale(bb), margin=p["margin"],
                         lambdas=(p["lambda1"], p["lambda2"], p["lambda3"]))
    return out.loss, {"clip": out.clip.item(), "align": out.align.item(),
                      "image_perturbed": out.image_perturbed.item(), "text_perturbed": out.text_perturbed.item()}


# ----------------------------------------------------------------------------- PAC-S
def _pacs_step(bb, batch, *, p, pixels, **_):
    n = len(batch)
    img, _ = bb.forward_images(pixels([e.image for e in batch] + [e.gen_image for e in batch]))
    img = img.view(2, n, -1)  # (2, B, D): real, generated
    txt = encode_texts(bb, [e.caption for e in batch] + [e.gen_caption for e in batch]).view(2, n, -1)
    out = obj.pacs_loss(img[0], txt[0], img[1], txt[1], _scale(bb), lambda_v=p["lambda_v"], lambda_t=p["lambda_t"])
    return out.loss, {"real": out.real.item(), "gen_images": out.generated_images.item(),
                      "gen_texts": out.generated_texts.item()}


COMMON = {"stretch": 0, "freeze_image": 0, "freeze_text": 0, "freeze": ""}
RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in [
        Recipe("contrastive", ("caption",), dict(COMMON), _contrastive_prepare, _contrastive_step,
               citation="Radford et al., 2021 (CLIP)"),
        Recipe("specs", ("caption", "base", "detail"),
               dict(COMMON, stretch=1, alpha=1.0, beta=8.0, gamma=0.8, fixed_margin=None, margin_max=1.5,
                    shuffle_prob=0.9, symmetric=0),
               _specs_prepare, _specs_step, citation="Chen, Salazar, Kementchedjhieva, 2025 (SPECS), eqs. 3-4"),
        Recipe("prmcs", ("caption", "translations"),
               dict(distill_steps=50, margin=0.1, lambda1=0.1, lambda2=0.05, lambda3=0.05, perturb_p=0.4),
               _prmcs_prepare, _prmcs_step, citation="Kim et al., 2023 (PR-MCS), sections 3.1 and 3.4"),
        Recipe("pacs", ("caption", "gen_image", "gen_caption"), dict(COMMON, lambda_v=0.05, lambda_t=0.05),
               _contrastive_prepare, _pacs_step, citation="Sarto et al., CVPR 2023 (PAC-S), eq. 2"),
        Recipe("scenes-tiny", ("caption", "negative"), dict(scenes_tiny.PARAMS), scenes_tiny.prepare,
               scenes_tiny.step, export="scenes-tiny", data=scenes_tiny.data, start_model=scenes_tiny.START_MODEL,
               train_defaults=dict(scenes_tiny.TRAIN_DEFAULTS),
               citation="Radford et al., 2021 (CLIP) + one hard negative per image; optional dense term: "
                        "Yao et al., 2021 (FILIP), section 3.1"),
    ]
}


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise unknown_name("recipe", name, RECIPES)
    return RECIPES[name]


def resolve_params(recipe: Recipe, overrides: dict[str, str]) -> dict:
    """Defaults updated with ``--set key=value`` strings, parsed to the default's type."""
    p = dict(recipe.params)
    for key, raw in overrides.items():
        if key not in p:
            raise unknown_name(f"parameter of recipe {recipe.name!r}", key, p)
        default = p[key]
        try:
            if raw.lower() in ("none", "null"):
                p[key] = None
            elif isinstance(default, bool) or isinstance(default, int) and not isinstance(default, bool):
                p[key] = int(raw)
            elif isinstance(default, float) or default is None:
                p[key] = float(raw)
            else:
                p[key] = raw
        except ValueError:
            raise CapscoreError(f"--set {key}={raw}: expected a {type(default).__name__}") from None
    return p


def make_step(recipe: Recipe, params: dict):
    def step_fn(bb, batch: list[Example], *, step, state, rng, pixels):
        return recipe.step(bb, batch, p=params, step=step, state=state, rng=rng, pixels=pixels)

    return step_fn
