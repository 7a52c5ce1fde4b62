"""Probe runners: the thin shell between data, the Encoder/pair scorer and the pure metrics.

Every runner flattens all (image, text) pairs it needs into ONE pair-scorer call,
so the encoder deduplicates and caches: each unique image and text is encoded
once per backbone, and a second model in the same run reuses nothing but the
data. Results are :class:`ProbeResult` (per-item rows + summary rows), frozen
and self-describing (backbone identity, scorer, parameters, seed, source).
"""
from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import os
from pathlib import Path

from capscore.embed.engine import Encoder
from capscore.perturb.lgip import lgip_variants
from capscore.perturb.prmcs import DEFAULT_MASK, DEFAULT_P, PERTURBATIONS, perturb
from capscore.probes import metrics as M
from capscore.probes.formats import ProbeItem, SuiteItem
from capscore.scores.pairs import PairScorer, cosine_pairs, get_pair_scorer, text_text_cosine
from capscore.errors import CapscoreError, param_error
from capscore.probes.segment import detail_units


@dataclass(frozen=True)
class ProbeResult:
    suite: str
    model: str  # backbone spec
    identity: str  # backbone identity (weights hash, context, preprocessing)
    scorer: str
    params: dict
    seed: int
    source: str
    rows: tuple[dict, ...] = field(repr=False)
    summary: tuple[dict, ...]


def _score(encoder: Encoder, scorer: PairScorer, images: list, texts: list[str]) -> np.ndarray:
    if not texts:
        return np.zeros(0)
    return scorer(encoder, images, texts).detach().cpu().double().numpy()


def _meta(encoder, suite, scorer_name, params, seed, source, rows, summary) -> ProbeResult:
    bb = encoder.backbone
    return ProbeResult(suite, bb.spec, bb.identity, scorer_name, dict(params), seed, source, tuple(rows), tuple(summary))


def _f(x: float) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


# ============================================================================ compositional suites
def run_suite(encoder: Encoder, items: Sequence[SuiteItem], *, suite: str, scorer: PairScorer = cosine_pairs,
              scorer_name: str = "cosine", source: str = "", min_group_count: int = 25,
              text_only: bool = False) -> ProbeResult:
    """Image-to-text accuracy per subset (true caption(s) outscore every negative; ties fail).

    Also: Winoground text/image/group scores (2x2 items), SugarCrepe++ ITT plus the
    text-only TOT (``text_only``), and ARO macro accuracy over groups with
    >= ``min_group_count`` items (for items carrying a group, except Winoground tags).
    Every subset is kept in the summary (CLIP_benchmark's SugarCrepe kept only the last).
    """
    imgs, txts, slices = [], [], []
    for it in items:
        start = len(txts)
        for im in it.images:
            for c in it.captions:
                imgs.append(im)
                txts.append(c)
        slices.append((start, len(txts)))
    flat = _score(encoder, scorer, imgs, txts)
    tot = None
    if text_only:  # SugarCrepe++ TOT: captions (p1, p2, n)
        a, b = [], []
        for it in items:
            p1, p2, n = it.captions[:3]
            a += [p1, p1, p2]
            b += [p2, n, n]
        tot = text_text_cosine(encoder, a, b).double().numpy().reshape(-1, 3) if a else np.zeros((0, 3))
    rows, by_subset = [], defaultdict(list)
    for k, (it, (s, e)) in enumerate(zip(items, slices)):
        S = flat[s:e].reshape(len(it.images), len(it.captions))
        row = {"id": it.id, "subset": it.subset, "source": it.source, "group": it.group,
               "captions": list(it.captions), "scores": S.round(6).tolist()}
        valid = bool(np.isfinite(S).all())
        row["correct"] = M.i2t_correct(S, it.true_captions()) if valid else None
        if len(it.images) == 2 and len(it.captions) == 2:
            w = M.winoground(S)
            row.update(text_correct=w.text, image_correct=w.image, group_correct=w.group)
        if tot is not None:
            row["tot_correct"] = M.sugarcrepe_pp_tot(*tot[k])
            row["tot_scores"] = tot[k].round(6).tolist()
        rows.append(row)
        by_subset[it.subset].append(row)
    summary = []
    for subset, rs in by_subset.items():
        ok = [r["correct"] for r in rs if r["correct"] is not None]
        s = {"subset": subset, "n": len(rs), "n_invalid": len(rs) - len(ok),
             "accuracy": _f(float(np.mean(ok))) if ok else None}
        if "group_correct" in rs[0]:
            for k in ("text", "image", "group"):
                s[f"{k}_score"] = float(np.mean([r[f"{k}_correct"] for r in rs]))
        if tot is not None:
            s["itt_accuracy"] = s["accuracy"]
            s["tot_accuracy"] = float(np.mean([r["tot_correct"] for r in rs]))
        if rs[0]["group"] and "group_correct" not in rs[0]:
            g = M.macro_accuracy([bool(r["correct"]) for r in rs], [r["group"] for r in rs], min_count=min_group_count)
            s.update(macro_accuracy=_f(g.macro), n_groups=g.n_groups, n_groups_excluded=len(g.excluded_groups),
                     min_group_count=min_group_count)
        summary.append(s)
    if len(summary) > 1:
        accs = [s["accuracy"] for s in summary if s["accuracy"] is not None]
        summary.append({"subset": "mean-over-subsets", "n": len(rows), "accuracy": float(np.mean(accs)) if accs else None})
    params = {"min_group_count": min_group_count, "text_only": text_only}
    return _meta(encoder, suite, scorer_name, params, 0, source, rows, summary)


# ============================================================================ PR-MCS perturbations
def run_perturb(encoder: Encoder, items: Sequence[ProbeItem], *, scorer: PairScorer | None = None,
                scorer_name: str | None = None, kinds: Sequence[str] = PERTURBATIONS, p: float = DEFAULT_P,
                seed: int = 0, mask: str = DEFAULT_MASK, source: str = "", suite: str = "perturb",
                **perturb_options) -> ProbeResult:
    """Robustness to PR-MCS perturbations, per language (item ``lang``) and perturbation.

    Summary rows (one per language x kind, plus one ``kind="average"`` row per language):

    * ``pct_change`` -- PR-MCS's headline number (Tables 2 and 7): the percentage change
      of the MEAN score, 100 * (mean s(perturbed) - mean s(original)) / mean s(original);
      negative = the score dropped. The tables fix this definition (a drop of the mean,
      not a mean of per-item drops): Table 7, PR-MCS English repetition,
      (0.8800 - 1.4177) / 1.4177 = -37.93%, as printed. The mean runs over every caption
      of the language, as Algorithm 1 returns one output per input: a caption the
      perturbation leaves unchanged (nothing drawn, < 2 critical objects, ...) enters with
      its original score (``n_unchanged``). The ``average`` row is Table 2's "Perturbed
      Average": the mean of the per-kind perturbed means, and its percentage against the
      original mean (= the mean of the per-kind percentages when no caption is dropped).
    * ``robust_rate`` (share of changed captions scoring strictly below their original) and
      ``mean_score_drop`` (mean of s(original) - s(perturbed), absolute) -- over the
      ``n`` changed captions only.
    * Captions a perturbation cannot score (removal of every word: Algorithm 1 would
      score an empty string) are counted in ``n_not_perturbable`` with their reasons and
      left out of every mean of that kind.

    The score is the pair scorer's; by default (``scorer=None``) MCS = 2.5 * max(0, cos),
    the metric PR-MCS's tables score with (§3.1; ``get_pair_scorer("mcs")``), so every
    mean and percentage above is on the clamped score, as in Tables 2 and 7. It differs
    from the raw cosine's exactly where a perturbed caption's cosine drops below 0: the
    clamp stops it at 0, so a drop never passes -100 % (Table 7's masking row, 0.0112
    after clamping); on the cosine it can. Any pair scorer can be passed (``cosine``,
    ``clip-s``, ``pac-s``, ``abe``, see :func:`capscore.scores.pairs.get_pair_scorer`).
    """
    if scorer is None:
        scorer, scorer_name = get_pair_scorer("mcs"), scorer_name or "mcs"
    scorer_name = scorer_name or getattr(scorer, "name", "custom")
    per = [[perturb(it.caption, k, p=p, seed=seed, mask=mask, objects=it.objects, lang=it.lang, **perturb_options)
            for k in kinds] for it in items]
    imgs = [it.image for it in items]
    texts = [it.caption for it in items]
    for it, ps in zip(items, per):
        for q in ps:
            if q.ok:
                imgs.append(it.image)
                texts.append(q.text)
    flat = _score(encoder, scorer, imgs, texts)
    orig, pos = flat[: len(items)], len(items)
    rows = []
    # (lang, kind) -> paired (original, perturbed) scores over the captions that enter the mean
    pairs: dict = defaultdict(list)
    changed: dict = defaultdict(list)
    na: dict = defaultdict(lambda: defaultdict(int))
    unchanged: dict = defaultdict(int)
    langs = list(dict.fromkeys(it.lang or "-" for it in items))
    for i, (it, ps) in enumerate(zip(items, per)):
        lang = it.lang or "-"
        for q in ps:
            row = {"id": it.id, "source": it.source, "lang": lang, "kind": q.kind, "caption": it.caption,
                   "perturbed": q.text, "score": float(orig[i]), "perturbed_score": None, "robust": None,
                   "unchanged": q.unchanged, "reason": q.reason}
            key = (lang, q.kind)
            if q.ok:
                row["perturbed_score"] = float(flat[pos])
                row["robust"] = bool(orig[i] > flat[pos])
                pairs[key].append((orig[i], flat[pos]))
                changed[key].append((orig[i], flat[pos]))
                pos += 1
            elif q.unchanged:  # Algorithm 1 emits the caption as it is: it scores what the original scores
                row["perturbed_score"] = float(orig[i])
                pairs[key].append((orig[i], orig[i]))
                unchanged[key] += 1
            else:
                na[key][q.reason] += 1
            rows.append(row)
    summary = []
    for lang in langs:
        lang_orig = [float(orig[i]) for i, it in enumerate(items) if (it.lang or "-") == lang]
        kind_means = []
        for k in kinds:
            key = (lang, k)
            pr, ch = np.asarray(pairs[key]).reshape(-1, 2), np.asarray(changed[key]).reshape(-1, 2)
            mo, mp = (float(pr[:, 0].mean()), float(pr[:, 1].mean())) if len(pr) else (None, None)
            if mp is not None:
                kind_means.append(mp)
            summary.append({
                "lang": lang, "kind": k, "n_captions": len(lang_orig), "n": len(ch),
                "n_unchanged": unchanged[key], "n_not_perturbable": sum(na[key].values()),
                "not_perturbable_reasons": dict(na[key]),
                "mean_original": _f(mo), "mean_perturbed": _f(mp),
                "pct_change": _f(100 * (mp - mo) / mo) if mo else None,
                "robust_rate": float(np.mean(ch[:, 0] > ch[:, 1])) if len(ch) else None,
                "mean_score_drop": float(np.mean(ch[:, 0] - ch[:, 1])) if len(ch) else None})
        mo = float(np.mean(lang_orig)) if lang_orig else None
        avg = float(np.mean(kind_means)) if len(kind_means) == len(kinds) and kinds else None
        summary.append({"lang": lang, "kind": "average", "n_captions": len(lang_orig), "mean_original": _f(mo),
                        "mean_perturbed": _f(avg),
                        "pct_change": _f(100 * (avg - mo) / mo) if (avg is not None and mo) else None})
    params = {"kinds": list(kinds), "p": p, "mask": mask, **perturb_options}
    return _meta(encoder, suite, scorer_name, params, seed, source, rows, summary)


# ============================================================================ LGIP
def run_lgip(encoder: Encoder, items: Sequence[ProbeItem], *, scorer: PairScorer = cosine_pairs,
             scorer_name: str = "cosine", seed: int = 0, source: str = "", suite: str = "lgip",
             average: str = "pairs", **variant_options) -> ProbeResult:
    """LGIP (Lee, 2025, §3.3): invariance error E_inv over paraphrases (eq. 4), sensitivity
    gap E_sens (eqs. 5-6) and positive rate PR (eqs. 7-8) over flips, overall and per
    flip type. ``average="pairs"`` (default, the reference code and §4.1's "averages over
    valid image-caption-flip triples") or ``"captions"`` (the nested expectation of the
    printed equations); see :func:`capscore.probes.metrics.invariance_error`.
    Captions without any flip are counted (``n_captions_without_flip``)."""
    var = [lgip_variants(it.caption, seed=seed, **variant_options) for it in items]
    imgs, texts = [it.image for it in items], [v.original for v in var]
    para_owner, flip_owner, flip_types = [], [], []
    for i, (it, v) in enumerate(zip(items, var)):
        for s in v.paraphrases:
            imgs.append(it.image)
            texts.append(s)
            para_owner.append(i)
    for i, (it, v) in enumerate(zip(items, var)):
        for f in v.flips:
            imgs.append(it.image)
            texts.append(f.text)
            flip_owner.append(i)
            flip_types.append(f.type)
    flat = _score(encoder, scorer, imgs, texts)
    n, npara = len(items), len(para_owner)
    orig, para, flip = flat[:n], flat[n : n + npara], flat[n + npara :]
    rows, j, k = [], 0, 0
    for i, (it, v) in enumerate(zip(items, var)):
        ps = para[j : j + len(v.paraphrases)]
        fs = flip[k : k + len(v.flips)]
        j, k = j + len(v.paraphrases), k + len(v.flips)
        rows.append({"id": it.id, "source": it.source, "caption": v.original, "score": float(orig[i]),
                     "paraphrases": [{"text": t, "score": float(s)} for t, s in zip(v.paraphrases, ps)],
                     "flips": [{"text": f.text, "type": f.type, "old": f.old, "new": f.new, "score": float(s)}
                               for f, s in zip(v.flips, fs)]})
    overall = M.flip_sensitivity(orig, flip, flip_owner, average=average)
    summary = [{"flip_type": "all", "average": average,
                "invariance_error": _f(M.invariance_error(orig, para, para_owner, average=average)),
                "n_paraphrases": npara, "gap_mean": _f(overall.gap_mean), "positive_rate": _f(overall.positive_rate),
                "n_flips": overall.count, "n_captions": n,
                "n_captions_without_flip": sum(1 for v in var if not v.flips)}]
    for t, st in M.flip_sensitivity_by_type(orig, flip, flip_owner, flip_types, average=average).items():
        summary.append({"flip_type": t, "average": average, "gap_mean": _f(st.gap_mean),
                        "positive_rate": _f(st.positive_rate), "n_flips": st.count, "n_captions": st.n_captions})
    return _meta(encoder, suite, scorer_name, {"average": average, **variant_options}, seed, source, rows, summary)


# ============================================================================ SPECS specificity
#: The SPECS authors' limit on a prefix or negative caption (``data/create_dci.py``: ``MAX_LEN = 248``, LongCLIP's
#: context), in tokens with the start and end tokens.
REFERENCE_MAX_TOKENS = 248


def run_specificity(encoder: Encoder, items: Sequence[ProbeItem], *, scorer: PairScorer = cosine_pairs,
                    scorer_name: str = "cosine", seed: int = 0, source: str = "", suite: str = "specificity",
                    units: Sequence[Sequence[str]] | None = None, variant: str = "capscore",
                    min_steps: int | None = None, max_attached_pps: int = 1, grammar: str = "capscore",
                    max_tokens: int | None = REFERENCE_MAX_TOKENS) -> ProbeResult:
    """SPECS specificity rates from detail units (§3.2, eqs. 1-2; units as in §4.2).

    Prefix P_k = units 1..k joined by spaces. SR_pos: share of steps with
    s(P_{k+1}) > s(P_k); SR_neg: share with s(P_k) > s(P_k + wrong unit) (the prose of
    §3.2; eq. 2's printed inequality is reversed). Both are reported triplet-level
    (eqs. 1-2 as printed: one mean over all N triplets) and per image (the mean of
    per-image rates, as the SPECS reference evaluation computes it), with counts.

    Wrong unit for the step from P_k: ``item.wrong_units[k-1]`` when the data has them; otherwise
    (``variant="capscore"``) a unit of another item's caption, not one of this caption's, drawn uniformly
    with ``random.Random(f"{seed}|specificity|{id}")``; or (``variant="reference"``) the authors' rule
    (:func:`reference_wrong_units`, their ``data/create_dci.py``): for each step a new other caption, of
    another image, is drawn with that generator, and its unit at index k-1 (its k-th unit) is used, or its
    last unit when it has fewer. ``variant="reference"`` also counts the steps the reference evaluation
    counts (:func:`capscore.probes.metrics.reference_chain`: s(P_K) is never stored, the chain length is
    the number of positive stored scores; images with fewer than 2 steps skipped), and ends a chain where
    their builder does (:func:`reference_chain_length`): at the first step whose prefix or negative caption
    has more than ``max_tokens`` tokens (default 248, their ``MAX_LEN``; counted with the start and end
    tokens by the encoder's tokenizer; ``None``: no limit); a row's ``units_kept`` says how many prefixes its
    chain kept. ``units`` overrides segmentation (scenes give exact units); ``grammar`` picks the chunker
    (:mod:`capscore.probes.segment`; ``"reference"`` is the authors').

    The score θ is the pair scorer's: cosine by default, as §3.2 defines θ ("the cosine
    similarity between the representations of image and text") and as the authors' evaluation
    scores (``cosine_similarity`` of the LongCLIP embeddings; the SPECS *metric*, (cos + 1)/2, ranks the same
    way, but the reference chain length counts positive cosines). With ``scorer=get_pair_scorer("clip-s")``
    every prefix is scored as CLIP-S, by default with CLIPScore's "A photo depicts " prepended --
    ``get_pair_scorer("clip-s", prefix="")`` (``probe --prefix ""``) scores the plain text.
    """
    if variant not in M.SR_VARIANTS:
        raise param_error("variant", "run_specificity", "'capscore' or 'reference'", variant)
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise param_error("max_tokens", "run_specificity", "a positive number of tokens or None", max_tokens)
    segs = [list(u) for u in units] if units is not None else [
        detail_units(it.caption, max_attached_pps=max_attached_pps, grammar=grammar) for it in items]
    pool = [(i, u) for i, us in enumerate(segs) for u in us]
    if variant == "reference":
        drawn = reference_wrong_units(segs, [_image_key(it.image) for it in items],
                                      [f"{seed}|specificity|{it.id}" for it in items])
    if variant == "reference" and max_tokens is not None:
        count = _token_counter(encoder)
    imgs, texts, plan = [], [], []
    for i, (it, us) in enumerate(zip(items, segs)):
        prefixes = [" ".join(us[: k + 1]) for k in range(len(us))]
        wrong = []
        if it.wrong_units is None and variant == "capscore":
            rng = random.Random(f"{seed}|specificity|{it.id}")
            others = [u for j, u in pool if j != i and u not in us]
        for k in range(len(us) - 1):
            if it.wrong_units is not None:
                w = it.wrong_units[k] if k < len(it.wrong_units) else None
            elif variant == "reference":
                w = drawn[i][k]
            else:
                w = rng.choice(others) if others else None
            wrong.append(None if w is None else f"{prefixes[k]} {w}")
        if variant == "reference" and max_tokens is not None:
            n_tok = count(prefixes + [w for w in wrong if w is not None])
            n_wrong = iter(n_tok[len(prefixes):])
            kept = reference_chain_length(n_tok[: len(prefixes)], [None if w is None else next(n_wrong) for w in wrong],
                                          max_tokens)
            prefixes, wrong = prefixes[:kept], wrong[: max(kept - 1, 0)]
        plan.append((prefixes, wrong))
        for t in prefixes + [w for w in wrong if w is not None]:
            imgs.append(it.image)
            texts.append(t)
    flat = _score(encoder, scorer, imgs, texts)
    rows, pref_scores, wrong_scores, pos = [], [], [], 0
    for it, us, (prefixes, wrong) in zip(items, segs, plan):
        ps = flat[pos : pos + len(prefixes)].tolist()
        pos += len(prefixes)
        ws = []
        for w in wrong:
            if w is None:
                ws.append(float("nan"))
            else:
                ws.append(float(flat[pos]))
                pos += 1
        pref_scores.append(ps)
        wrong_scores.append(ws)
        rows.append({"id": it.id, "source": it.source, "caption": it.caption, "units": us, "prefix_scores": ps,
                     "wrong": wrong, "wrong_scores": [_f(x) for x in ws], "steps": max(len(us) - 1, 0),
                     "units_kept": len(prefixes)})
    r = M.specificity_rates(pref_scores, wrong_scores, variant=variant, min_steps=min_steps)
    summary = [{"variant": variant,
                "sr_pos": _f(r.pos.triplets), "sr_neg": _f(r.neg.triplets), "sr_mean": _f(r.mean_triplets),
                "n_triplets_pos": r.pos.n_triplets, "n_triplets_neg": r.neg.n_triplets,
                "sr_pos_images": _f(r.pos.images), "sr_neg_images": _f(r.neg.images),
                "sr_mean_images": _f(r.mean_images),
                "n_images": len(items), "n_images_pos": r.pos.n_images, "n_images_neg": r.neg.n_images,
                "n_skipped_pos": r.pos.n_skipped, "n_skipped_neg": r.neg.n_skipped,
                "min_steps": 2 if (min_steps is None and variant == "reference") else (min_steps or 1)}]
    params = {"variant": variant, "min_steps": min_steps, "max_attached_pps": max_attached_pps, "grammar": grammar,
              "units_given": units is not None}
    if variant == "reference":
        params["max_tokens"] = max_tokens
    return _meta(encoder, suite, scorer_name, params, seed, source, rows, summary)


def reference_chain_length(prefix_tokens: Sequence[int], wrong_tokens: Sequence[int | None], max_tokens: int) -> int:
    """How many prefixes the SPECS authors' data builder keeps (``create_dci.py``, ``join_segmented_captions``),
    from the token counts of the prefixes P_1..P_K and of the negatives P_t + d⁻_t (``None``: no negative):
    P_1 always; then P_{t+1} and P_t + d⁻_t are added together, step by step, until one of them has more than
    ``max_tokens`` tokens, where the chain ends. A step without a negative is checked on its prefix alone."""
    for t in range(1, len(prefix_tokens)):
        w = wrong_tokens[t - 1] if t - 1 < len(wrong_tokens) else None
        if prefix_tokens[t] > max_tokens or (w is not None and w > max_tokens):
            return t
    return len(prefix_tokens)


def _token_counter(encoder):
    """Token counts with start and end tokens, from the encoder's tokenizer (``Backbone.tokenize``)."""
    tokenize = getattr(encoder.backbone, "tokenize", None)
    if tokenize is None:
        raise CapscoreError(f"{encoder.backbone.spec} has no tokenizer to count a prefix's tokens; "
                            "pass max_tokens=None to keep every step")
    return lambda texts: [len(ids) for ids in tokenize(list(texts))]


def _image_key(image) -> object:
    """What tells two items' images apart: the file path when there is one, else the object itself."""
    path = getattr(image, "path", None) if not isinstance(image, (str, os.PathLike)) else image
    return ("path", str(Path(path))) if path is not None else ("object", id(image))


def reference_wrong_units(segs: Sequence[Sequence[str]], image_keys: Sequence, seeds: Sequence[str]
                          ) -> list[list[str | None]]:
    """The SPECS authors' negative units (``data/create_dci.py``, ``obtain_neg_splits``), per item and step.

    For item i with units d_1..d_K and each step t = 1..K-1 (the negative of prefix P_t): draw an item
    uniformly among those of *another image* (``image_keys`` differ) that have units -- a new draw for every
    step, with ``random.Random(seeds[i])`` -- and take its unit at index t-1 (its t-th unit), or its last unit
    when it has fewer than t. The authors redraw until the image differs, which is a uniform draw among the
    other images' captions; an item with no such caption gets None (no negative) for every step instead of
    their endless redraw.
    """
    candidates = [j for j, us in enumerate(segs) if us]
    per_image = Counter(image_keys[j] for j in candidates)
    out = []
    for i, us in enumerate(segs):
        steps = max(len(us) - 1, 0)
        if len(candidates) == per_image[image_keys[i]]:  # every caption with units is of this image
            out.append([None] * steps)
            continue
        rng = random.Random(seeds[i])
        row = []
        for t in range(steps):
            while True:  # uniform over the other images' captions (the authors' rejection loop)
                j = candidates[rng.randrange(len(candidates))]
                if image_keys[j] != image_keys[i]:
                    break
            other = segs[j]
            row.append(other[min(t, len(other) - 1)])
        out.append(row)
    return out
