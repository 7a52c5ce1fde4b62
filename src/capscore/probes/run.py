"""Probe runners: the thin shell between data, the Encoder/pair scorer and the pure metrics.

Every runner flattens all (image, text) pairs it needs into ONE pair-scorer call,
so the encoder deduplicates and caches: each unique image and text is encoded
once per backbone, and a second model in the same run reuses nothing but the
data. Results are :class:`ProbeResult` (per-item rows + summary rows), frozen
and self-describing (backbone identity, scorer, parameters, seed, source).
"""
from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from capscore.embed.engine import Encoder
from capscore.perturb.lgip import lgip_variants
from capscore.perturb.prmcs import DEFAULT_MASK, DEFAULT_P, PERTURBATIONS, perturb
from capscore.probes import metrics as M
from capscore.probes.formats import ProbeItem, SuiteItem
from capscore.scores.pairs import PairScorer, cosine_pairs, text_text_cosine


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
def run_perturb(encoder: Encoder, items: Sequence[ProbeItem], *, scorer: PairScorer = cosine_pairs,
                scorer_name: str = "cosine", kinds: Sequence[str] = PERTURBATIONS, p: float = DEFAULT_P,
                seed: int = 0, mask: str = DEFAULT_MASK, source: str = "", suite: str = "perturb",
                **perturb_options) -> ProbeResult:
    """Robustness to PR-MCS perturbations: share of captions scoring above their perturbed copy.

    Captions that a perturbation cannot change are counted per kind
    (``n_not_perturbable``) and left out of that kind's denominator, never hidden.
    """
    per = [[perturb(it.caption, k, p=p, seed=seed, mask=mask, objects=it.objects, **perturb_options) for k in kinds]
           for it in items]
    imgs = [it.image for it in items]
    texts = [it.caption for it in items]
    for it, ps in zip(items, per):
        for q in ps:
            if q.ok:
                imgs.append(it.image)
                texts.append(q.text)
    flat = _score(encoder, scorer, imgs, texts)
    orig, pos = flat[: len(items)], len(items)
    rows, stats = [], {k: {"wins": [], "drops": [], "na": 0, "reasons": defaultdict(int)} for k in kinds}
    for i, (it, ps) in enumerate(zip(items, per)):
        for q in ps:
            row = {"id": it.id, "source": it.source, "kind": q.kind, "caption": it.caption, "perturbed": q.text,
                   "score": float(orig[i]), "perturbed_score": None, "robust": None, "reason": q.reason}
            if q.ok:
                row["perturbed_score"] = float(flat[pos])
                row["robust"] = bool(orig[i] > flat[pos])
                stats[q.kind]["wins"].append(row["robust"])
                stats[q.kind]["drops"].append(orig[i] - flat[pos])
                pos += 1
            else:
                stats[q.kind]["na"] += 1
                stats[q.kind]["reasons"][q.reason] += 1
            rows.append(row)
    summary = [{"kind": k, "n": len(s["wins"]), "n_not_perturbable": s["na"],
                "not_perturbable_reasons": dict(s["reasons"]),
                "robust_rate": float(np.mean(s["wins"])) if s["wins"] else None,
                "mean_score_drop": float(np.mean(s["drops"])) if s["drops"] else None} for k, s in stats.items()]
    params = {"kinds": list(kinds), "p": p, "mask": mask, **perturb_options}
    return _meta(encoder, suite, scorer_name, params, seed, source, rows, summary)


# ============================================================================ LGIP
def run_lgip(encoder: Encoder, items: Sequence[ProbeItem], *, scorer: PairScorer = cosine_pairs,
             scorer_name: str = "cosine", seed: int = 0, source: str = "", suite: str = "lgip",
             **variant_options) -> ProbeResult:
    """LGIP: invariance error over paraphrases, sensitivity gap and positive rate (PR) over flips,
    overall and per flip type. Captions without any flip are counted (``n_captions_without_flip``)."""
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
    overall = M.flip_sensitivity(orig, flip, flip_owner)
    summary = [{"flip_type": "all", "invariance_error": _f(M.invariance_error(orig, para, para_owner)),
                "n_paraphrases": npara, "gap_mean": _f(overall.gap_mean), "positive_rate": _f(overall.positive_rate),
                "n_flips": overall.count, "n_captions": n,
                "n_captions_without_flip": sum(1 for v in var if not v.flips)}]
    for t, st in M.flip_sensitivity_by_type(orig, flip, flip_owner, flip_types).items():
        summary.append({"flip_type": t, "gap_mean": _f(st.gap_mean), "positive_rate": _f(st.positive_rate),
                        "n_flips": st.count})
    return _meta(encoder, suite, scorer_name, variant_options, seed, source, rows, summary)


# ============================================================================ SPECS specificity
def run_specificity(encoder: Encoder, items: Sequence[ProbeItem], *, scorer: PairScorer = cosine_pairs,
                    scorer_name: str = "cosine", seed: int = 0, source: str = "", suite: str = "specificity",
                    units: Sequence[Sequence[str]] | None = None, min_steps: int = 2,
                    max_attached_pps: int = 1) -> ProbeResult:
    """SPECS specificity rates from detail units (section 4.2).

    Prefix P_k = units 1..k joined by spaces. SR_pos: share of steps with
    s(P_{k+1}) > s(P_k); SR_neg: share with s(P_k) > s(P_k + wrong unit).
    Wrong unit for step k: ``item.wrong_units[k-1]`` when the data has them,
    otherwise a unit of another item's caption drawn with
    ``random.Random(f"{seed}|specificity|{id}")`` (a detail from another image is,
    with overwhelming likelihood, wrong for this one; exact labels come from scenes).
    ``units`` overrides segmentation (scenes give exact units).
    """
    from capscore.probes.segment import detail_units

    segs = [list(u) for u in units] if units is not None else [
        detail_units(it.caption, max_attached_pps=max_attached_pps) for it in items]
    pool = [(i, u) for i, us in enumerate(segs) for u in us]
    imgs, texts, plan = [], [], []
    for i, (it, us) in enumerate(zip(items, segs)):
        prefixes = [" ".join(us[: k + 1]) for k in range(len(us))]
        wrong = []
        rng = random.Random(f"{seed}|specificity|{it.id}")
        others = [u for j, u in pool if j != i and u not in us]
        for k in range(len(us) - 1):
            if it.wrong_units is not None:
                w = it.wrong_units[k] if k < len(it.wrong_units) else None
            else:
                w = rng.choice(others) if others else None
            wrong.append(None if w is None else f"{prefixes[k]} {w}")
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
                     "too_short": len(us) - 1 < min_steps})
    sp, sn, mean = M.specificity_rates(pref_scores, wrong_scores, min_steps=min_steps)
    summary = [{"sr_pos": _f(sp.rate), "sr_neg": _f(sn.rate), "sr_mean": _f(mean), "n_images": len(items),
                "n_images_pos": sp.n_images, "n_images_neg": sn.n_images,
                "n_too_short": sum(r["too_short"] for r in rows), "min_steps": min_steps}]
    params = {"min_steps": min_steps, "max_attached_pps": max_attached_pps, "units_given": units is not None}
    return _meta(encoder, suite, scorer_name, params, seed, source, rows, summary)
