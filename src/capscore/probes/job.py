"""One probe run: a typed :class:`ProbeJob` (suite, models, scorer and the suite's options), its inputs
loaded and checked before any model loads (:func:`load_inputs`), each model's run (:func:`probe_model`),
and the outputs (:func:`write_rows`, :func:`write_summary`, :func:`format_summary`).

The suites themselves are in :mod:`capscore.probes.run` (SugarCrepe, ARO, ABC-6K, Winoground, PR-MCS
perturbations, LGIP, SPECS specificity), :mod:`capscore.probes.retrieval` and
:mod:`capscore.probes.zeroshot` (SPECS Table 4, ABE-CLIP Table 2) and :mod:`capscore.probes.scenes`.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from capscore.errors import CapscoreError, OptionError, param_error, unknown_name
from capscore._log import progress
from capscore._optional import require
from capscore.probes import run as R
from capscore.probes.formats import load_probe_items, load_suite
from capscore.probes.retrieval import load_karpathy, run_retrieval
from capscore.probes.zeroshot import load_classification, run_zeroshot
from capscore.report.tables import format_table

FILE_SUITES = ("sugarcrepe", "sugarcrepe++", "aro-vg-relation", "aro-vg-attribution", "aro-coco-order",
               "aro-flickr-order", "abc6k", "winoground")
CAPTION_SUITES = ("perturb", "lgip", "specificity")
DATA_SUITES = ("retrieval", "zeroshot")  # SPECS Table 4 / ABE-CLIP Table 2 evaluations
RANKING_SUITES = ("retrieval", "scenes-retrieval")  # cosine, or a pair scorer re-ranking cosine's top k (abe)
COSINE_ONLY_SUITES = ("zeroshot", "scenes-zeroshot")
MCS_SUITES = ("perturb", "scenes-perturb")  # scored with MCS by default: PR-MCS's tables are on MCS


def scene_suites() -> dict:
    try:
        from capscore.probes.scenes import SCENE_SUITES  # noqa: PLC0415  (a build without the scene suites lists none)
    except ImportError:
        return {}
    return SCENE_SUITES


def default_scorer(suite: str) -> str:
    """The suite's default pair scorer: mcs for the perturb suites (PR-MCS scores with MCS), cosine otherwise."""
    return "mcs" if suite in MCS_SUITES else "cosine"


@dataclass(frozen=True)
class ProbeJob:
    """A probe suite and its options (the defaults are the papers'; see ``capscore probe -h``).

    ``rerank`` is the re-ranking depth of the retrieval suites with scorer ``abe`` (``None`` = every pair);
    ``captions_per_image`` ``None`` = all; ``kinds`` is a comma-separated list of PR-MCS perturbations.
    """

    suite: str
    data: str | None = None
    images: str | None = None
    mapping: str | None = None
    scorer: str = "cosine"
    seed: int = 0
    p: float = 0.4
    removal: str = "keep-drawn"
    ensure_change: bool = False
    sr_variant: str = "capscore"
    grammar: str = "capscore"
    lgip_average: str = "pairs"
    mask: str = "[MASK]"
    kinds: str = "repetition,removal,masking,jumble,substitution"
    min_group_count: int = 25
    n_scenes: int = 64
    split: str = "test"
    captions_per_image: int | None = 5
    templates: str | None = None
    classnames: str | None = None
    rerank: int | None = 20

    def __post_init__(self):
        for name in ("n_scenes", "captions_per_image", "rerank"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise param_error(name, "ProbeJob", "a positive integer", getattr(self, name))
        if self.suite in COSINE_ONLY_SUITES and self.scorer != "cosine":
            raise param_error("scorer", "ProbeJob", f"'cosine' for suite {self.suite} (it ranks by cosine only)",
                              self.scorer)
        if self.suite in RANKING_SUITES and self.scorer not in ("cosine", "abe"):
            raise param_error("scorer", "ProbeJob", f"'cosine' or 'abe' for suite {self.suite}", self.scorer)
        zeroshot = ("zeroshot", "scenes-zeroshot")
        for name, default, suites, what in (("split", "test", ("retrieval",), "retrieval"),
                                            ("captions_per_image", 5, ("retrieval",), "retrieval"),
                                            ("templates", None, zeroshot, "the zeroshot suites"),
                                            ("classnames", None, zeroshot, "the zeroshot suites")):
            if self.suite not in suites and getattr(self, name) != default:
                raise param_error(name, "ProbeJob", f"{default!r} for suite {self.suite} (it applies to {what} only)",
                                  getattr(self, name))


def load_inputs(job: ProbeJob):
    """(kind, inputs) of the job's suite: kind is scenes (inputs: the suite function), retrieval, zeroshot,
    captions or suite. Input errors surface here, before any model is loaded."""
    suite, scenes = job.suite, scene_suites()
    if suite in scenes:
        return "scenes", scenes[suite]
    if suite not in FILE_SUITES + CAPTION_SUITES + DATA_SUITES:
        raise unknown_name("suite", suite, FILE_SUITES + CAPTION_SUITES + DATA_SUITES + tuple(scenes))
    if not job.data:  # named as the caller spells it: data in Python, --data on the command line
        what = {"sugarcrepe": "the SugarCrepe folder of subset files, or one subset file",
                "retrieval": "a Karpathy-split JSON (with {images} the image folder)",
                "zeroshot": "a folder of class folders, or a path,label CSV"}.get(suite, "its file")
        raise OptionError(f"the {suite} suite reads its items from your copy of the data: give {{data}} ({what}; "
                          "docs/probes.md); the scenes-* suites need none")
    if suite == "retrieval":
        return "retrieval", load_karpathy(job.data, job.images, split=job.split,
                                          captions_per_image=job.captions_per_image)
    if suite == "zeroshot":
        return "zeroshot", load_classification(job.data, job.images, classnames=job.classnames)
    if suite in CAPTION_SUITES:
        items = load_probe_items(job.data, job.images)
    else:
        items = load_suite(suite, job.data, job.images, **({"mapping": job.mapping} if suite == "abc6k" else {}))
    if not items:
        raise CapscoreError(f"{job.data}: no items")
    return ("captions" if suite in CAPTION_SUITES else "suite"), items


def probe_model(job: ProbeJob, encoder, kind: str, inputs, scorer):
    """Run the job's suite with one model's ``encoder`` on :func:`load_inputs`'s ``(kind, inputs)``, scoring
    pairs with ``scorer`` (a :class:`~capscore.scores.pairs.PairScorer`) -> a ProbeResult."""
    common = dict(scorer=scorer, scorer_name=job.scorer, source=str(job.data or ""))
    if kind == "scenes":
        return inputs(encoder, args=job, **common)
    if kind == "retrieval":
        ranking = {} if job.scorer == "cosine" else {"scorer": scorer, "scorer_name": job.scorer,
                                                     "rerank_k": job.rerank}
        return run_retrieval(encoder, inputs, source=str(job.data), seed=job.seed, **ranking)
    if kind == "zeroshot":
        return run_zeroshot(encoder, inputs, templates=job.templates or "openai", source=str(job.data),
                            seed=job.seed)
    if job.suite == "perturb":
        kinds = [k.strip() for k in job.kinds.split(",") if k.strip()]
        return R.run_perturb(encoder, inputs, kinds=kinds, p=job.p, seed=job.seed, mask=job.mask,
                             removal=job.removal, ensure_change=job.ensure_change, **common)
    if job.suite == "lgip":
        return R.run_lgip(encoder, inputs, seed=job.seed, average=job.lgip_average, **common)
    if job.suite == "specificity":
        return R.run_specificity(encoder, inputs, seed=job.seed, variant=job.sr_variant, grammar=job.grammar,
                                 **common)
    return R.run_suite(encoder, inputs, suite=job.suite, min_group_count=job.min_group_count,
                       text_only=job.suite == "sugarcrepe++", **common)


def run_probe(job: ProbeJob, models: Sequence[str], *, scorer, out: Path, fmt: str = "jsonl",
              make_encoder: Callable, inputs: tuple | None = None) -> list:
    """Every model in turn: its per-item rows to ``out/SUITE__MODEL.fmt`` (jsonl or parquet) as soon as it
    is done, then ``out/SUITE.summary.json``. Each model's encoder is ``make_encoder(spec)`` (the caller's
    :func:`capscore.embed.make_encoder` with its Encoding — device, dtype, random-init seed — or the Ray
    variant); ``out`` is created after the first model loaded (a bad model spec leaves no folder).
    ``inputs``: :func:`load_inputs`'s result when already loaded."""
    kind, inputs = inputs or load_inputs(job)
    results = []
    with progress(len(models), desc=f"probe {job.suite}", unit="model", leave=False) as bar:
        for spec in models:
            res = probe_model(job, make_encoder(spec), kind, inputs, scorer)
            try:
                Path(out).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise CapscoreError(f"{out}: cannot create the folder ({e.strerror or e})") from None
            write_rows(Path(out) / f"{_safe(job.suite)}__{_safe(spec)}.{fmt}", res)
            results.append(res)
            bar.update(1)
    write_summary(Path(out) / f"{_safe(job.suite)}.summary.json", results, prefix=getattr(scorer, "prefix", ""))
    return results


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "model"


def write_rows(path: Path, res) -> None:
    """A ProbeResult's per-item rows, each with its suite, model, scorer and seed (JSONL, or Parquet by suffix)."""
    meta = {"suite": res.suite, "model": res.model, "scorer": res.scorer, "seed": res.seed}
    rows = [{**meta, **r} for r in res.rows]
    if path.suffix == ".parquet":
        pd = require("pandas", purpose="a .parquet output")

        pd.DataFrame([{k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in r.items()}
                      for r in rows]).to_parquet(path, index=False)
        return
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")


def write_summary(path: Path, results: Sequence, *, prefix: str = "") -> None:
    summary = [{"suite": r.suite, "model": r.model, "identity": r.identity, "scorer": r.scorer, "prefix": prefix,
                "seed": r.seed, "params": r.params, "source": r.source, "summary": list(r.summary)} for r in results]
    path.write_text(json.dumps(summary, indent=2, default=str))


def format_summary(results: Sequence) -> str:
    """The header line and one table row per model × summary row (nested values left out)."""
    rows = [{"model": r.model, **{k: v for k, v in s.items() if not isinstance(v, (dict, list))}}
            for r in results for s in r.summary]
    r0 = results[0]
    return f"== {r0.suite} | scorer={r0.scorer} | seed={r0.seed}\n{format_table(rows)}"
