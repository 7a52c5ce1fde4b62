"""Recipes: which weights train, what a batch becomes, which objective it feeds.

Each recipe is data (:class:`Recipe`): the example fields it needs, the frozen dataclass of its
parameters (:mod:`capscore.train.options`: typed, checked once; a recipe file's ``[params]`` or
``--set key=value`` set them), a ``prepare`` (model surgery, freezing) and a ``step`` (batch -> loss).
The loop in :mod:`capscore.train.loop` is shared.

===============  ========================================================================
``contrastive``  CLIP InfoNCE on (image, caption); ``stretch=1`` first stretches a 77-token
                 tower to 248 (LongCLIP long-caption fine-tuning, without LongCLIP's
                 short-caption principal-component term)
``specs``        SPECS: (image, c_j, c_j + d⁺, c_j + d⁻) with the dynamic margin; stretches
                 to 248 first when the tower has 77 positions (SPECS builds on LongCLIP);
                 without ``base``/``detail`` the caption's detail units give the triplets.
                 ``theta`` (logit | cosine) and ``margin`` (carried | per-batch) choose
                 between the reference code (default) and the printed eqs. 3-4; ``negatives``
                 (batch | controlled) between the paper's d⁻ and a scene unit made false
``prmcs``        PR-MCS: ``distill_steps`` of multilingual distillation of a student text
                 tower (a copy of the CLIP text tower) into the frozen teacher, then
                 PR-MCS fine-tuning of the student with the five perturbations (or the
                 data's human-written ``perturbed`` captions); every batch mixes English
                 and the translations; the image tower is frozen throughout
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
from capscore.errors import InputError, unknown_name
from capscore.train import objectives as obj
from capscore.train import scenes_tiny
from capscore.train.data import Example, negative_detail
from capscore.train.loop import encode_texts
from capscore.train.options import RecipeParams, choice, non_negative, option, probability
from capscore.train.surgery import freeze, freeze_tower, stretch_text_tower
from capscore.perturb.prmcs import PERTURBATIONS, perturb
from capscore.probes.segment import GRAMMARS


@dataclass(frozen=True)
class Recipe:
    name: str
    needs: tuple[str, ...]
    params_type: type[RecipeParams]  # the frozen dataclass of its parameters
    prepare: Callable[[Backbone, RecipeParams], dict]  # returns the initial recipe state
    step: Callable[..., tuple[torch.Tensor, dict]]
    export: str = "ckpt"  # what the trained model is exported as
    citation: str = ""
    notes: dict = field(default_factory=dict)
    # optimiser / batch defaults of the paper, used where the user passes none (``capscore train``)
    optim: dict = field(default_factory=dict)
    # A recipe that makes its own data (a stream) and starts from its own model with its own
    # schedule defaults (used where the user passes no option): the scenes-tiny recipe.
    data: Callable | None = None  # (backbone, params, *, seed) -> ExampleStream
    start_model: str | None = None  # default model
    train_defaults: dict = field(default_factory=dict)  # steps, warmup, grad_clip, min_lr_ratio, no_decay

    def defaults(self) -> RecipeParams:
        """The recipe's parameters at their defaults."""
        return self.params_type()


# ----------------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class CommonParams(RecipeParams):
    """Model surgery every fine-tuning recipe but PR-MCS takes."""

    stretch: bool = False  # stretch a 77-token text tower to 248 positions first (LongCLIP)
    freeze_image: bool = False
    freeze_text: bool = False
    freeze: tuple[str, ...] = ()  # parameter-name prefixes to freeze (capscore.train.surgery.freeze)


@dataclass(frozen=True)
class ContrastiveParams(CommonParams):
    RECIPE = "contrastive"


# Where the specs recipe's d⁻ comes from: "batch" is the paper's (§4.3: "randomly sampling a detail unit from
# another image-caption pair in the batch", word-shuffled with ``shuffle_prob``); "controlled" is not in
# the paper: d⁺ made false about the image (``Example.false_units``, scene examples only), the minimal
# false fact that ``experiments/replicate.py`` evaluates SR_neg on -- a diagnostic of whether the paper's
# negatives are what keeps SR_neg down in the miniature (docs/research/replications.md).
SPECS_NEGATIVES = ("batch", "controlled")


@dataclass(frozen=True)
class SpecsParams(CommonParams):
    """SPECS (eqs. 3-4): weights, margins and where d⁻ comes from (:func:`capscore.train.objectives.specs_loss`)."""

    RECIPE = "specs"
    stretch: bool = True  # SPECS builds on LongCLIP
    alpha: float = option(1.0, "a float >= 0", non_negative)
    beta: float = option(8.0, "a float >= 0", non_negative)
    gamma: float = option(0.8, "a float >= 0", non_negative)
    fixed_margin: float | None = option(None, "a float >= 0 or none", non_negative)
    margin_max: float = option(1.5, "a float >= 0", non_negative)
    shuffle_prob: float = option(0.9, "a probability in [0, 1]", probability)
    symmetric: bool = False
    theta: str = choice(*obj.SPECS_THETAS)
    margin: str = choice(*obj.SPECS_MARGINS)
    grammar: str = "capscore"
    negatives: str = choice(*SPECS_NEGATIVES)

    def check(self) -> None:
        if self.grammar not in GRAMMARS:
            raise self.error("grammar", " or ".join(repr(g) for g in GRAMMARS))


@dataclass(frozen=True)
class PrmcsParams(RecipeParams):
    """PR-MCS (sections 3.1 and 3.4): distillation steps, the margin m and the λ weights."""

    RECIPE = "prmcs"
    distill_steps: int = option(50, "a whole number >= 0", non_negative)
    margin: float = 0.1
    lambda1: float = option(0.1, "a float >= 0", non_negative)
    lambda2: float = option(0.05, "a float >= 0", non_negative)
    lambda3: float = option(0.05, "a float >= 0", non_negative)
    perturb_p: float = option(0.4, "a probability in [0, 1]", probability)


@dataclass(frozen=True)
class PacsParams(CommonParams):
    """PAC-S (eq. 2): the weights of the generated-image and generated-caption terms."""

    RECIPE = "pacs"
    lambda_v: float = option(0.05, "a float >= 0", non_negative)
    lambda_t: float = option(0.05, "a float >= 0", non_negative)
    infonce_mean: bool = False  # halve L as CLIP does ("mean" of the two directions)


def _scale(bb: Backbone) -> torch.Tensor:
    return bb.logit_scale.exp()


def _common_prepare(bb: Backbone, p: CommonParams) -> None:
    if p.stretch and bb.context_length < 248:
        stretch_text_tower(bb)
    if p.freeze_image:
        freeze_tower(bb, "image")
    if p.freeze_text:
        freeze_tower(bb, "text")
    if p.freeze:
        freeze(bb.model, list(p.freeze))


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


def specs_triplet(e: Example, rng: random.Random) -> tuple[str, str]:
    """(c_j, d⁺) of one example: its ``base``/``detail`` when given, else a prefix of its
    detail units of random length j (1 <= j < m, uniform) and unit j + 1 (SPECS §3.1:
    "every subsequence of detail units, built cumulatively from left to right,
    constitutes a valid caption"; §4.3 does not say how the j of a draw is chosen --
    capscore draws one per example per step, so an epoch sees each image once)."""
    return _specs_draw(e, rng)[:2]


def _specs_draw(e: Example, rng: random.Random) -> tuple[str, str, int | None]:
    """:func:`specs_triplet` and the index of d⁺ among ``e.units`` (None for a given base/detail)."""
    if e.base and e.detail:
        return e.base, e.detail, None
    j = rng.randrange(1, len(e.units))
    return " ".join(e.units[:j]), e.units[j], j




def specs_triplets(batch: list[Example], rng: random.Random, *, negatives: str = "batch",
                   shuffle_prob: float = 0.9) -> tuple[list[tuple[str, str]], list[str]]:
    """(c_j, d⁺) per example (:func:`specs_triplet`) and d⁻ per example (``negatives``:
    :data:`SPECS_NEGATIVES`)."""
    draws = [_specs_draw(e, rng) for e in batch]
    trip = [(b, d) for b, d, _ in draws]
    if negatives == "batch":
        details = [d for _, d in trip]
        return trip, [negative_detail(details, i, rng, shuffle_prob=shuffle_prob) for i in range(len(batch))]
    neg = []
    for e, (_, _, j) in zip(batch, draws):
        if j is None or len(e.false_units) != len(e.units):
            raise InputError(e.source or "example", "negatives=controlled needs scene examples (their units made "
                             "false come from the scene graph); this one has none", got=e.detail or e.caption)
        neg.append(e.false_units[j])
    return trip, neg


def _specs_step(bb, batch, *, p, pixels, state, rng, **_):
    trip, neg = specs_triplets(batch, rng, negatives=p.negatives, shuffle_prob=p.shuffle_prob)
    texts = [e.caption for e in batch] + [b for b, _ in trip]
    texts += [f"{b} {d}" for b, d in trip] + [f"{b} {n}" for (b, _), n in zip(trip, neg)]
    t = encode_texts(bb, texts).view(4, len(batch), -1)  # (4, B, D): caption, c_j, c_j+d⁺, c_j+d⁻
    img, _ = bb.forward_images(pixels([e.image for e in batch]))
    out = obj.specs_loss(img, t[0], t[1], t[2], t[3], _scale(bb), margin=state["margin"],
                         fixed_margin=p.fixed_margin, alpha=p.alpha, beta=p.beta, gamma=p.gamma,
                         margin_max=p.margin_max, symmetric=p.symmetric, theta=p.theta, margin_mode=p.margin)
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


def _perturb(text: str, lang: str, rng: random.Random, p: PrmcsParams) -> str:
    kinds = list(PERTURBATIONS)
    rng.shuffle(kinds)
    for kind in kinds:  # substitution needs nouns (spaCy, English) — fall through to another kind
        if kind == "substitution" and lang != "en":
            continue
        out = perturb(text, kind, p=p.perturb_p, seed=rng.randrange(2**31), ensure_change=True)
        if out.ok:
            return out.text
    return text + " " + text  # pragma: no cover - one-word captions


def languages_of(e: Example) -> dict[str, str]:
    """{lang: caption}: the translations plus ``caption`` itself as English when no "en" is given."""
    tr = dict(e.translations)
    tr.setdefault("en", e.caption)
    return tr


def _given_perturbed(e: Example, lang: str, text: str) -> tuple[str, ...]:
    """Human-written perturbed captions for ``text`` in ``lang`` (PR-MCS §5.4, M-FineCap3k few-shot)."""
    by_lang = dict(e.perturbed_by_lang)
    if lang in by_lang:
        return by_lang[lang]
    return e.perturbed if text == e.caption else ()


def batch_languages(batch: list[Example], rng: random.Random) -> list[str]:
    """One language per example such that every batch mixes English and the translated languages
    (PR-MCS §5.1: MSCOCO captions "translated into four other languages"; every batch holds all
    five): example i takes language (i + offset) mod L of the sorted languages, offset random per
    batch; an example lacking that language takes one of its own at random."""
    langs = sorted({lang for e in batch for lang in languages_of(e)})
    off = rng.randrange(len(langs))
    out = []
    for i, e in enumerate(batch):
        own = languages_of(e)
        want = langs[(i + off) % len(langs)]
        out.append(want if want in own else rng.choice(sorted(own)))
    return out


def _prmcs_step(bb, batch, *, p, pixels, step, rng, **_):
    tr = [languages_of(e) for e in batch]
    if step < p.distill_steps:  # stage 1: student(translation) -> teacher(English)
        pick = batch_languages(batch, rng)
        student = encode_texts(bb, [t[lang] for t, lang in zip(tr, pick)])
        teacher = _teacher_texts(bb, [t["en"] for t in tr])
        loss = obj.distillation_loss(student, teacher)
        return loss, {"distill": loss.item()}
    pick = batch_languages(batch, rng)  # stage 2: PR-MCS, the batch mixes all languages
    orig = [t[lang] for t, lang in zip(tr, pick)]
    pert, given = [], 0
    for e, o, lang in zip(batch, orig, pick):
        human = _given_perturbed(e, lang, o)
        if human:  # the data's own perturbed captions win over generated ones
            pert.append(rng.choice(human))
            given += 1
        else:
            pert.append(_perturb(o, lang, rng, p))
    t = encode_texts(bb, orig + pert).view(2, len(batch), -1)  # (2, B, D)
    img, _ = bb.forward_images(pixels([e.image for e in batch]))
    out = obj.prmcs_loss(img, t[0], t[1], _scale(bb), margin=p.margin, lambdas=(p.lambda1, p.lambda2, p.lambda3))
    return out.loss, {"clip": out.clip.item(), "align": out.align.item(),
                      "image_perturbed": out.image_perturbed.item(), "text_perturbed": out.text_perturbed.item(),
                      "perturbed_from_data": given / len(batch)}


# ----------------------------------------------------------------------------- PAC-S
def _pacs_step(bb, batch, *, p, pixels, **_):
    n = len(batch)
    img, _ = bb.forward_images(pixels([e.image for e in batch] + [e.gen_image for e in batch]))
    img = img.view(2, n, -1)  # (2, B, D): real, generated
    txt = encode_texts(bb, [e.caption for e in batch] + [e.gen_caption for e in batch]).view(2, n, -1)
    out = obj.pacs_loss(img[0], txt[0], img[1], txt[1], _scale(bb), lambda_v=p.lambda_v, lambda_t=p.lambda_t,
                        directions="mean" if p.infonce_mean else "sum")
    return out.loss, {"real": out.real.item(), "gen_images": out.generated_images.item(),
                      "gen_texts": out.generated_texts.item()}


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in [
        Recipe("contrastive", ("caption",), ContrastiveParams, _contrastive_prepare, _contrastive_step,
               citation="Radford et al., 2021 (CLIP)"),
        Recipe("specs", ("caption",), SpecsParams, _specs_prepare, _specs_step,
               citation="Chen, Salazar, Kementchedjhieva, 2025 (SPECS), eqs. 3-4",
               # §4.3: "Adam ... learning rate of 1e-5, weight decay of 1e-2, batch size of 100 per GPU, and
               # gradient accumulation over 4 steps (yielding an effective batch size of 400)"; Adam's
               # default betas/eps (the paper names none)
               optim=dict(lr=1e-5, weight_decay=1e-2, batch_size=100, accum=4, betas=(0.9, 0.999), eps=1e-8)),
        Recipe("prmcs", ("caption",), PrmcsParams, _prmcs_prepare, _prmcs_step,
               citation="Kim et al., 2023 (PR-MCS), sections 3.1 and 3.4",
               # App. B.2: "AdamW ... beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8. The initial learning rate is
               # 5e-5"; weight decay unstated: torch.optim.AdamW's default 1e-2
               optim=dict(lr=5e-5, weight_decay=1e-2, betas=(0.9, 0.999), eps=1e-8)),
        Recipe("pacs", ("caption", "gen_image", "gen_caption"), PacsParams, _contrastive_prepare, _pacs_step,
               citation="Sarto et al., CVPR 2023 (PAC-S), eq. 2"),
        Recipe("scenes-tiny", ("caption", "negative"), scenes_tiny.ScenesTinyParams, scenes_tiny.prepare,
               scenes_tiny.step, export="scenes-tiny", data=scenes_tiny.data, start_model=scenes_tiny.START_MODEL,
               optim=dict(scenes_tiny.OPTIM), train_defaults=dict(scenes_tiny.TRAIN_DEFAULTS),
               citation="Radford et al., 2021 (CLIP) + hard negatives per image; optional dense term: "
                        "Yao et al., 2021 (FILIP), section 3.1"),
    ]
}


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise unknown_name("recipe", name, RECIPES)
    return RECIPES[name]


def resolve_params(recipe: Recipe, overrides: dict[str, str]) -> RecipeParams:
    """The recipe's parameters: its defaults updated with ``--set key=value`` strings, each parsed with the
    field's type (:meth:`capscore.train.options.RecipeParams.from_strings`)."""
    return recipe.params_type.from_strings(overrides)


def make_step(recipe: Recipe, params: RecipeParams):
    def step_fn(bb, batch: list[Example], *, step, state, rng, pixels):
        return recipe.step(bb, batch, p=params, step=step, state=state, rng=rng, pixels=pixels)

    return step_fn
