"""Registry rows of the metrics that bring their own models (docs/learned.md).

Polos (:mod:`capscore.scores.polos`) and DENEB (:mod:`capscore.scores.deneb`) are trained heads over CLIP
and SimCSE-RoBERTa features; FLEUR, RefFLEUR and EXPERT (:mod:`capscore.scores.judge`) ask a LLaVA model
for a score. None of them reads the run's ``--model``: each loads the released files its authors
published from the metric-weights folder (``--metric-weights DIR``, else ``$CAPSCORE_METRIC_WEIGHTS``,
else ``~/.cache/capscore/metric-weights``) and reads the items' images through those models.

Their formulas declare the need ``weights`` (and no backbone need), so every face treats them as it
treats the metrics that need no backbone: scored once per run, the rows and summary naming no
``--model``; the summary records the weights folder instead. A loaded model is kept for the process,
keyed by (metric, folder, device, dtype): one run, and the faces and metrics of one process, load each
checkpoint once (:func:`loaded`). Within a block every distinct image and text is encoded once per
extractor (:func:`capscore.scores.polos.extract`).

Polos's and DENEB's CLIP towers run through the encoding engine: a formula's ``tower(options)`` names the
backbone, and a run (:class:`capscore.pipeline._Runner`) hands the formula, as its batch's encoder, the
encoder :func:`capscore.embed.factory.tower_encoder` gives: the run's own encoder when its ``--model``
gives the same vectors (Polos and CLIP-S on OpenAI's ViT-B/32 encode each image once), else one of the
tower on the run's cache. A face that hands no encoder gets one per loaded model, in memory
(:func:`own_encoder`). The SimCSE features go to the same cache
(:class:`capscore.embed.engine.CachedSentences`): a warm rerun encodes no text again, and Polos and DENEB
in one run, whose checkpoints carry the same SimCSE weights, encode each text once.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from capscore.errors import CapscoreError
from capscore.scores.citations import DENEB_CITATION, EXPERT_CITATION, FLEUR_CITATION, POLOS_CITATION
from capscore.scores.metric import Metric, Values, register

WEIGHTS_ENV = "CAPSCORE_METRIC_WEIGHTS"
#: The options a face hands these formulas (besides the run's device and dtype).
OPTIONS = ("metric_weights", "explain")
#: Each judge metric's model folder under the weights folder.
JUDGE_FOLDERS = {"fleur": "llava-1.5-13b-hf", "reffleur": "llava-1.5-13b-hf", "expert": "expert-llava-13b-hf"}
JUDGE_BATCH = 8
JUDGE_MAX_NEW_TOKENS = 512

#: The judge metrics: (citation, reference-based).
JUDGE_ROWS = {"fleur": (FLEUR_CITATION, False), "reffleur": (FLEUR_CITATION, True), "expert": (EXPERT_CITATION, False)}

_LOADED: dict[tuple, object] = {}
_ENCODERS: dict[tuple, object] = {}


def weights_dir(given: str | os.PathLike | None = None) -> Path:
    """``given``, else ``$CAPSCORE_METRIC_WEIGHTS``, else ``~/.cache/capscore/metric-weights``."""
    if given:
        return Path(given).expanduser()
    if os.environ.get(WEIGHTS_ENV):
        return Path(os.environ[WEIGHTS_ENV]).expanduser()
    from capscore.embed.cache import DEFAULT_CACHE_DIR  # noqa: PLC0415  (deferred: numpy)

    return DEFAULT_CACHE_DIR / "metric-weights"


def weights_files(root: Path) -> list[tuple[str, str, Path, bool, str]]:
    """(metric, what, path, present, where published) for every file these metrics read under ``root``
    (``capscore doctor`` lists them)."""
    from capscore.scores import deneb, polos  # noqa: PLC0415  (deferred: torch)

    out = []
    for metric, spec in (("polos", polos.CHECKPOINT), ("polos, deneb", polos.SIMCSE), ("deneb", deneb.CHECKPOINT)):
        found = next((root / n for n in spec.names if (root / n).exists()), None)
        out.append((metric, spec.what, found or root / spec.names[0], found is not None, spec.source))
    for folder, names in (("llava-1.5-13b-hf", "fleur, reffleur"), ("expert-llava-13b-hf", "expert")):
        path = root / folder / "config.json"
        out.append((names, "the LLaVA model folder (transformers layout)", path.parent, path.is_file(),
                    "https://huggingface.co/llava-hf/llava-1.5-13b-hf" if folder.startswith("llava") else
                    "hjkim811/EXPERT-llava-13b-lora merged and converted (docs/learned.md)"))
    return out


def missing(kind: str, root: Path) -> str:
    """'' when metric ``kind``'s released files are under ``root``, else the one line naming the first absent
    file and where it is published."""
    from capscore.scores import deneb, polos  # noqa: PLC0415  (deferred: torch)

    specs = {"polos": (polos.CHECKPOINT, polos.SIMCSE), "deneb": (deneb.CHECKPOINT, polos.SIMCSE)}.get(kind)
    if specs is None:
        folder = root / JUDGE_FOLDERS[kind]
        return "" if (folder / "config.json").is_file() else \
            f"{kind}: {folder / 'config.json'} not found (its LLaVA model folder; see docs/learned.md)"
    for spec in specs:
        if not any((root / n).exists() for n in spec.names):
            return f"{kind}: {root / spec.names[0]} not found ({spec.what}; published at {spec.source})"
    return ""


def _deneb_arch(clip_sd: Mapping) -> str | None:
    """DENEB's tower is open_clip's ViT-L-14 (GELU); a tower of another size is inferred from its shapes."""
    w = clip_sd.get("visual.conv1.weight")
    return "ViT-L-14" if w is not None and tuple(w.shape) == (1024, 3, 14, 14) else None


def _load(kind: str, root: Path, device: str, dtype: str):
    if kind == "polos":
        from capscore.scores.polos import load_polos  # noqa: PLC0415  (deferred: torch)

        return load_polos(root, device=device, dtype=dtype)
    if kind == "deneb":
        from capscore.backbones.released import find_weights  # noqa: PLC0415  (deferred: torch)
        from capscore.scores.deneb import CHECKPOINT, load_deneb, read_deneb  # noqa: PLC0415  (deferred: torch)

        path = find_weights(root, CHECKPOINT, metric="deneb")
        arch = _deneb_arch(read_deneb(path)[2])
        return load_deneb(root, device=device, dtype=dtype, clip_arch=arch, checkpoint=path)
    from capscore.backbones.released import WeightsFile, find_weights  # noqa: PLC0415  (deferred: torch)
    from capscore.backbones.vlm import load_vlm  # noqa: PLC0415  (deferred: torch)
    from capscore.scores.judge import JUDGES  # noqa: PLC0415  (deferred: torch)

    folder = JUDGE_FOLDERS[kind]
    find_weights(root, WeightsFile((f"{folder}/config.json",), JUDGES[kind].model, "its LLaVA model folder"),
                 metric=kind)
    return load_vlm(root / folder, device=device, dtype=dtype)


def _key(kind: str, options: Mapping) -> tuple:
    root = weights_dir(options.get("metric_weights")).resolve()
    device, dtype = str(options.get("device") or "cpu"), str(options.get("dtype") or "fp32")
    return JUDGE_FOLDERS.get(kind, kind), root, device, dtype


def loaded(kind: str, options: Mapping):
    """The model of metric ``kind`` for the options' weights folder, device and dtype, loaded once per process."""
    key = _key(kind, options)
    if key not in _LOADED:
        _LOADED[key] = _load(kind, *key[1:])
    return _LOADED[key]


def tower_of(kind: str, options: Mapping, encoder=None):
    """The encoder metric ``kind`` reads its CLIP tower's vectors through: ``encoder`` (a batch's: the run's
    tower encoder) when its backbone gives the tower's vectors (:func:`~capscore.backbones.base.same_vectors`),
    else :func:`own_encoder` — an encoder of another backbone handed by a face
    (``score_batch(encoder, "polos", ...)``) never changes the metric's numbers."""
    from capscore.backbones.base import same_vectors  # noqa: PLC0415  (deferred: torch)

    if encoder is not None and same_vectors(encoder.backbone, loaded(kind, options).clip):
        return encoder
    return own_encoder(kind, options)


def own_encoder(kind: str, options: Mapping):
    """An in-memory encoder of the loaded model's CLIP tower, one per model and process (for the faces that
    hand the formula no encoder)."""
    from capscore.embed.engine import Encoder  # noqa: PLC0415  (deferred: torch)

    key = _key(kind, options)
    if key not in _ENCODERS:
        _ENCODERS[key] = Encoder(loaded(kind, options).clip)
        _ENCODERS[key].keep_raw = True
    return _ENCODERS[key]


def _ready(kind: str, options: Mapping) -> None:
    """A session's start: the run's one load (absent weights stop the run in one line); with the option
    ``check_only`` (a driver whose workers load the models: the Ray engine) only that the files are there."""
    if not options.get("check_only"):
        loaded(kind, options)
    elif line := missing(kind, weights_dir(options.get("metric_weights")).resolve()):
        raise CapscoreError(line)


class _OwnModels:
    """What the formulas of the metrics that bring their own models share: the metric's kind, its needs, and
    the run's one load (:func:`_ready`) as the run-level session."""

    def __init__(self, kind: str, needs: set):
        self.kind = kind
        self.needs = frozenset(needs)

    @contextmanager
    def session(self, texts, options: Mapping) -> Iterator[None]:
        """The run's one load (before anything is scored: absent weights stop the run in one line)."""
        _ready(self.kind, options)
        yield


class LearnedFormula(_OwnModels):
    """Polos or DENEB on a batch of records: its own extractors on the records' images and texts."""

    columns: tuple[str, ...] = ()

    def __init__(self, kind: str):
        super().__init__(kind, {"weights", "refs"})

    def describe(self, options: Mapping) -> str:
        return f"{self.kind} weights in {weights_dir(options.get('metric_weights'))}"

    def tower(self, options: Mapping):
        """The CLIP backbone the metric reads images and texts with (the checkpoint's own tower)."""
        return loaded(self.kind, options).clip

    def compute(self, batch) -> Values:
        from capscore.embed.engine import CachedSentences  # noqa: PLC0415  (deferred: torch)
        from capscore.scores.deneb import score_deneb  # noqa: PLC0415  (deferred: torch)
        from capscore.scores.polos import score_polos  # noqa: PLC0415  (deferred: torch)

        model = loaded(self.kind, batch.options)
        recs = batch.records
        fn = score_polos if self.kind == "polos" else score_deneb
        clip = tower_of(self.kind, batch.options, batch.encoder)
        return Values(fn(model, [r.image for r in recs], [r.caption for r in recs], [list(r.refs) for r in recs],
                         clip=clip, sentence=CachedSentences(model.sentence, clip.cache)))


class JudgeFormula(_OwnModels):
    """FLEUR, RefFLEUR or EXPERT: the judge's answer in the row (``answer``), its explanation when asked
    for (option ``explain``), NaN with the reason for an answer that cannot be read."""

    columns = ("answer", "explanation")

    def __init__(self, kind: str, needs_refs: bool):
        super().__init__(kind, {"weights"} | ({"refs"} if needs_refs else set()))

    def describe(self, options: Mapping) -> str:
        return f"{self.kind} weights in {weights_dir(options.get('metric_weights')) / JUDGE_FOLDERS[self.kind]}"

    def compute(self, batch) -> Values:
        from capscore.scores.judge import judge  # noqa: PLC0415  (deferred: torch)

        vlm = loaded(self.kind, batch.options)
        recs = batch.records
        refs = [list(r.refs) for r in recs] if "refs" in self.needs else None
        out = judge(vlm, self.kind, [r.image for r in recs], [r.caption for r in recs], refs,
                    explain=bool(batch.options.get("explain")), batch_size=JUDGE_BATCH,
                    max_new_tokens=JUDGE_MAX_NEW_TOKENS)
        return Values([v.score for v in out], {
            "answer": [v.answer for v in out],
            "explanation": [json.dumps(v.explanation) if isinstance(v.explanation, dict) else v.explanation
                            for v in out],
            "error": [f"{self.kind}: {v.error}" if v.error else None for v in out]})


def _register() -> None:  # torch-free: reading the registry's names imports no model code
    note = "brings its own models: the released files under --metric-weights (docs/learned.md)"
    register(Metric("polos", POLOS_CITATION, image=LearnedFormula("polos"), range=(0.0, 1.0), note=note,
                    default_model=""))
    register(Metric("deneb", DENEB_CITATION, image=LearnedFormula("deneb"), range=(0.0, 1.0), note=note,
                    default_model=""))
    for name, (citation, refs) in JUDGE_ROWS.items():
        register(Metric(name, citation, image=JudgeFormula(name, refs), range=(0.0, 1.0),
                        note=note, default_model=""))


_register()

__all__ = ["JudgeFormula", "LearnedFormula", "OPTIONS", "WEIGHTS_ENV", "loaded", "missing", "own_encoder",
           "tower_of", "weights_dir", "weights_files"]
