"""Video caption meta-evaluation: VATEX-EVAL, ActivityNet-FOIL and the scenes-video oracle.

Loaders read local copies in their published layouts (those of the EMScore release, which the
PAC-S paper evaluates on; nothing is downloaded), and each ``evaluate_*`` scores them with a
video metric (:mod:`capscore.scores.video`) through the encoding engine and returns a
:class:`~capscore.meta.evaluate.CorrelationResult` like the image datasets.

VATEX-EVAL (Shi et al. 2022), ``--path DIR`` holding
    ``candidates_list.pkl``  numpy array of N candidate captions
    ``gts_list.pkl``         numpy array (N, K) of references per candidate (K >= 9)
    ``human_scores.pkl``     numpy array of 3·N scores, annotator-major (``reshape(3, -1).T`` -> (N, 3))
    ``video_ids.pkl``        numpy array of N VATEX video ids
    ``vatex_train_en_annotations.json`` (optional) ``{vid: [captions]}``, the idf corpus
and ``--videos DIR`` with ``VIDEO_ID.mp4`` (or any video of that stem). The pickles are read
with a restricted unpickler that accepts numpy arrays and plain Python values only (a pickle can
otherwise run code). Protocol (``VATEX-EVAL-demo.py``): scores rounded to 4 decimals; Kendall τ
(scipy's, τ-b) and Spearman ρ against each of the 3 annotators, averaged; the first k references
for the k-reference settings (PAC-S Table: 0, 1 and 9).

ActivityNet-FOIL (Shi et al. 2022), ``--path DIR`` holding
    ``anet_entities_test_1.json``  ``{vid: {duration, timestamps, sentences}}``: segment times
    ``anet_entities_test_2.json``  same shape: the references and their times
    ``final_right_video_sentences.json`` / ``final_foil_video_sentences.json``
                                   ``{"results": {vid: [{"sentence": ...}, ...]}}``, one per segment
    ``train.json`` (optional)      ``{vid: {sentences}}``, the idf corpus
and ``--videos DIR`` with ``VID.mp4``. Protocol (``ActivityNet-FOIL_demo.py``): candidate i of a
video is scored on segment i's time window (``anet_entities_test_1`` timestamps); its references
are those of ``test_2`` whose integer-second span overlaps the segment by more than 40% of the
reference's span (all references if none does); a video's score is the mean over its segments,
and it counts as correct when the right paragraph scores strictly above the foiled one. Videos
absent from ``--videos`` are counted as skipped (the reference code silently keeps only videos
with features). Choice: the window is taken in seconds of the file; the reference maps
``timestamp · frames / duration`` onto its pre-extracted frame features, the same thing when the
annotated duration equals the file's.
"""
from __future__ import annotations

import json
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from capscore.data.records import Record
from capscore.data.video import DEFAULT_SAMPLING, Sampling, VideoRef
from capscore.errors import CapscoreError, InputError, unknown_name
from capscore.meta import stats as S
from capscore.meta.evaluate import CorrelationResult, score_many
from capscore.data.jsonl import iter_jsonl
from capscore.scenes.video import clip_captions, generate_clips
from capscore.scores.metric import get_metric
from capscore.scores.video import corpus_idf

VATEX_FILES = ("candidates_list.pkl", "gts_list.pkl", "human_scores.pkl", "video_ids.pkl")
ANET_FILES = ("anet_entities_test_1.json", "anet_entities_test_2.json", "final_right_video_sentences.json",
              "final_foil_video_sentences.json")


# ------------------------------------------------------------------------------------ safe pickles
class _NumpyOnly(pickle.Unpickler):
    """Unpickle numpy arrays and plain values; any other class is refused (no code runs)."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
               ("numpy._core.multiarray", "scalar")}

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} (only numpy arrays are expected)")


def load_numpy_pickle(path: Path):
    try:
        with open(path, "rb") as f:
            return _NumpyOnly(f).load()
    except FileNotFoundError:
        raise InputError(str(path), "file not found") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as e:
        raise InputError(str(path), f"not a pickled numpy array ({e})") from None


def _json(path: Path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise InputError(str(path), "file not found") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{e.lineno}", f"malformed JSON ({e.msg})") from None


def _video(videos: Path | None, vid: str, where: str, **window) -> VideoRef:
    if videos is None:
        raise CapscoreError("give --videos DIR (the dataset's video files, named VIDEO_ID.mp4)")
    p = videos / f"{vid}.mp4"
    if not p.exists():
        alt = sorted(videos.glob(f"{vid}.*"))
        p = alt[0] if alt else p
    return VideoRef(path=p, name=f"{where}: video {p.name}", **window)


def _dir(path, files: Sequence[str], what: str) -> Path:
    if path is None:
        raise CapscoreError(f"--path is required for {what}: a folder with {', '.join(files)}")
    root = Path(path).expanduser()
    if not root.is_dir():
        raise InputError(str(root), f"{what} folder not found", expected=", ".join(files))
    for f in files:
        if not (root / f).exists():
            raise InputError(str(root), f"{f} not found", expected=", ".join(files))
    return root


# ------------------------------------------------------------------------------------ VATEX-EVAL
@dataclass(frozen=True)
class VideoRatingSet:
    """Candidates with several annotators' scores each (``humans``: (N, A))."""

    name: str
    source: str
    items: tuple[Record, ...]
    humans: np.ndarray
    idf_corpus: tuple[str, ...] = ()
    skipped: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.items)


def load_vatex_eval(path, videos=None) -> VideoRatingSet:
    """VATEX-EVAL from its EMScore release folder (see the module docstring for the layout)."""
    root = _dir(path, VATEX_FILES, "VATEX-EVAL")
    vroot = Path(videos).expanduser() if videos is not None else None
    cands = np.asarray(load_numpy_pickle(root / "candidates_list.pkl")).reshape(-1)
    gts = load_numpy_pickle(root / "gts_list.pkl")
    hum = np.asarray(load_numpy_pickle(root / "human_scores.pkl"), dtype=float).reshape(-1)
    vids = np.asarray(load_numpy_pickle(root / "video_ids.pkl")).reshape(-1)
    n = len(cands)
    if len(vids) != n or len(gts) != n or hum.size != 3 * n:
        raise InputError(str(root), "sizes do not match",
                         expected="N candidates, N video ids, N reference lists and 3·N human scores",
                         got=f"{n}, {len(vids)}, {len(gts)}, {hum.size}")
    humans = hum.reshape(3, -1).T  # annotator-major in the file
    items = []
    for i in range(n):
        where = f"{root / 'candidates_list.pkl'}: item {i}"
        refs = [str(r) for r in (gts[i].tolist() if hasattr(gts[i], "tolist") else gts[i])]
        vid = str(vids[i])
        items.append(Record(str(i), _video(vroot, vid, where) if vroot is not None else VideoRef(name=vid),
                            str(cands[i]), tuple(refs), source=where))
    corpus: tuple[str, ...] = ()
    train = root / "vatex_train_en_annotations.json"
    if train.exists():
        data = _json(train)
        corpus = tuple(s for caps in data.values() for s in caps if isinstance(s, str))
    return VideoRatingSet("vatex-eval", str(root), tuple(items), humans, corpus)


def vatex_stats(scores: Sequence[float], humans: np.ndarray, *, prefix: str = "", n_resamples: int = 0,
                seed: int = 0, confidence: float = 0.95) -> list[S.Stat]:
    """τ-b and ρ ×100, each the mean over annotators of the correlation with that annotator, scores
    rounded to 4 decimals first (VATEX-EVAL protocol); bootstrap over candidates, annotators paired."""
    x = np.round(np.asarray(scores, dtype=float), 4)
    cols = [humans[:, j] for j in range(humans.shape[1])]
    out = []
    for kind in ("tau_b", "spearman"):
        stat = lambda xx, *hs, kind=kind: float(np.mean([S._raw(kind, xx, h) for h in hs]))  # noqa: E731
        ci = S.bootstrap_ci(stat, (x, *cols), n_resamples=n_resamples, seed=seed, confidence=confidence)
        out.append(S.Stat(f"{prefix}{kind}", stat(x, *cols), ci, int(x.size),
                          f"mean over {len(cols)} annotators"))
    return out


# ------------------------------------------------------------------------------------ ActivityNet-FOIL
@dataclass(frozen=True)
class FoilVideo:
    """One ActivityNet video: per segment, the right and the foiled sentence and the references."""

    id: str
    right: tuple[Record, ...]
    foil: tuple[Record, ...]


@dataclass(frozen=True)
class VideoFoilSet:
    name: str
    source: str
    items: tuple[FoilVideo, ...]
    idf_corpus: tuple[str, ...] = ()
    skipped: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.items)


def overlapping_refs(segment: Sequence[float], ref_times: Sequence[Sequence[float]]) -> list[int]:
    """References whose integer-second span [c, d] shares more than 40% of its seconds with the
    segment's [a, b] (all references when none does) — the rule of ``ActivityNet-FOIL_demo.py``."""
    a, b = int(segment[0]), int(segment[1])
    seg = set(range(a, b + 1))
    keep = []
    for k, (c, d) in enumerate(ref_times):
        c, d = int(c), int(d)
        span = range(c, d + 1)
        if len(span) and len(seg & set(span)) / len(span) > 0.4:
            keep.append(k)
    return keep or list(range(len(ref_times)))


def load_activitynet_foil(path, videos=None) -> VideoFoilSet:
    """ActivityNet-FOIL from its EMScore release folder (see the module docstring for the layout)."""
    root = _dir(path, ANET_FILES, "ActivityNet-FOIL")
    vroot = Path(videos).expanduser() if videos is not None else None
    seg, refs = _json(root / ANET_FILES[0]), _json(root / ANET_FILES[1])
    right, foil = (_json(root / f) for f in ANET_FILES[2:])
    for data, f in ((right, ANET_FILES[2]), (foil, ANET_FILES[3])):
        if not isinstance(data, dict) or not isinstance(data.get("results"), dict):
            raise InputError(str(root / f), "wrong JSON shape", expected='{"results": {video_id: [{"sentence"}]}}')
    items, skipped = [], {}
    for vid, preds in right["results"].items():
        where = f"{root / ANET_FILES[2]}: video {vid!r}"
        fpreds = foil["results"].get(vid)
        if vid not in seg or vid not in refs or fpreds is None or len(fpreds) != len(preds):
            raise InputError(where, "video missing from the segment/reference files or from the foil file, "
                             "or the two files differ in segments")
        if vroot is not None and not any(vroot.glob(f"{vid}.*")):
            skipped["video not in --videos"] = skipped.get("video not in --videos", 0) + 1
            continue
        times = seg[vid]["timestamps"]
        if len(times) < len(preds):
            raise InputError(where, "more sentences than segments in anet_entities_test_1.json")
        rs = [[], []]
        for i, (p, q) in enumerate(zip(preds, fpreds)):
            t = times[i]
            keep = overlapping_refs(t, refs[vid]["timestamps"])
            r = tuple(refs[vid]["sentences"][k].strip() for k in keep)
            for side, x in ((0, p), (1, q)):
                if not isinstance(x, dict) or not isinstance(x.get("sentence"), str):
                    raise InputError(f"{where}, segment {i}", "needs a 'sentence' string", got=x)
                w = f"{where}, segment {i}"
                v = _video(vroot, vid, w, start=float(t[0]), end=float(t[1])) if vroot is not None else VideoRef(name=vid)
                rs[side].append(Record(f"{vid}#{i}:{'right' if side == 0 else 'foil'}", v, x["sentence"].strip(), r,
                                       source=w))
        items.append(FoilVideo(vid, tuple(rs[0]), tuple(rs[1])))
    corpus: tuple[str, ...] = ()
    train = root / "train.json"
    if train.exists():
        data = _json(train)
        corpus = tuple(s for v in data.values() for s in v.get("sentences", [])
                       if isinstance(s, str) and len(s.split(" ")) <= 66)  # the reference drops longer ones
    return VideoFoilSet("activitynet-foil", str(root), tuple(items), corpus, skipped)


# ------------------------------------------------------------------------------------ scenes-video oracle
def scenes_video_oracle(path=None, *, n_scenes: int = 40, seed: int = 0, frames: int = 8,
                        size: int = 64) -> VideoRatingSet:
    """Synthetic clips with graded motion captions and their exact oracle F1 as the one "annotator".

    ``path``: a folder written by ``capscore scenes generate --videos`` (its ``captions.jsonl`` and
    ``videos/``, decoded from the files); without it the same clips are built in memory, ``size`` px.
    """
    if path is not None:
        root = Path(path).expanduser()
        rows_file = root / "captions.jsonl"
        if not rows_file.exists():
            raise InputError(str(root), "captions.jsonl not found", expected="the output of `capscore scenes generate --videos`")

        items, hum = [], []
        for where, row in iter_jsonl(rows_file):
            v = VideoRef(path=root / "videos" / f"{row['image']}.mp4", name=f"{where}: video {row['image']}")
            items.append(Record(str(row["id"]), v, row["caption"], tuple(row.get("refs", ())), system=row.get("system", ""),
                                source=where))
            hum.append(float(row["oracle_f1"]))
        return VideoRatingSet("scenes-video", str(root), tuple(items), np.asarray(hum)[:, None],
                              tuple(r for it in items for r in it.refs), params={"from": "files"})

    items, hum = [], []
    for clip in generate_clips(n_scenes, seed=seed, frames=frames, size=size):
        v = VideoRef(frames=clip.frames, name=f"scene {clip.scene.id}")
        for row in clip_captions(clip, seed=seed):
            items.append(Record(row["id"], v, row["caption"], tuple(row["refs"]), system=row["system"],
                                source=f"scenes-video: {row['id']}"))
            hum.append(row["oracle_f1"])
    return VideoRatingSet("scenes-video", f"capscore.scenes (seed {seed})", tuple(items), np.asarray(hum)[:, None],
                          tuple(r for it in items for r in it.refs),
                          params={"n_scenes": n_scenes, "seed": seed, "frames": frames, "size": size})


# ------------------------------------------------------------------------------------ evaluation
def _idf(ds, encoder, use_idf: bool):
    if not use_idf:
        return None

    if not ds.idf_corpus:
        raise CapscoreError(f"--idf: {ds.name} has no idf corpus here (VATEX-EVAL: vatex_train_en_annotations.json; "
                            "ActivityNet-FOIL: train.json, in --path)")
    return corpus_idf(encoder, ds.idf_corpus)


def evaluate_video(ds, encoder, metric, *, n_refs: Sequence[int] | None = None, sampling=None, prefix: str = "",
                   idf: bool = False, n_resamples: int = 0, seed: int = 0, confidence: float = 0.95,
                   skip_bad: bool = False) -> CorrelationResult:
    """Score a video dataset with one video metric. Ratings (VATEX-EVAL, scenes-video): τ-b and ρ,
    columns ``K-ref tau_b`` / ``K-ref spearman`` for each reference count K (default: 0 for a
    reference-free metric, 1 and 9 for a reference-based one, as in the PAC-S table; capped at the
    references available). ActivityNet-FOIL: ``accuracy`` (%)."""
    spec = get_metric(metric)
    formula = spec.formula("video")  # an image-only metric fails here
    sampling = DEFAULT_SAMPLING if sampling is None else Sampling.parse(sampling)
    weights = _idf(ds, encoder, idf)
    skipped = dict(ds.skipped)
    kw = dict(n_resamples=n_resamples, seed=seed, confidence=confidence)
    params = {"sampling": str(sampling), "idf": bool(idf), "ref_max": formula.ref_max if spec.needs_refs else None}
    common = dict(encoder=encoder, metric=spec, medium="video", prefix=prefix, skip_bad=skip_bad, chunk_size=256,
                  options={"sampling": sampling, "idf": weights})
    if isinstance(ds, VideoFoilSet):
        recs = [r for v in ds.items for r in v.right + v.foil]
        scores = score_many(recs, skipped=skipped, **common)
        outcomes = []
        for v in ds.items:
            a = [scores.get(r.id) for r in v.right]
            b = [scores.get(r.id) for r in v.foil]
            if None in a or None in b:
                skipped["video with an unscored segment"] = skipped.get("video with an unscored segment", 0) + 1
                continue
            outcomes.append(1.0 if np.mean(a) > np.mean(b) else 0.0)
        stats = S.outcome_stats(outcomes, name="accuracy", **kw)
        params["rule"] = "video correct when mean(right segments) > mean(foil segments)"
        n = len(outcomes)
    else:
        max_refs = min((len(r.refs) for r in ds.items), default=0)
        counts = list(n_refs) if n_refs else ([1, 9] if spec.needs_refs else [0])
        counts = [min(k, max_refs) if spec.needs_refs else 0 for k in counts]
        counts = list(dict.fromkeys(counts))
        if spec.needs_refs and 0 in counts:
            raise CapscoreError(f"{spec.name} needs references; this dataset has none, or use a reference-free metric")
        stats, n = [], 0
        for k in counts:
            recs = [Record(r.id, r.image, r.caption, r.refs[:k], r.system, r.source) for r in ds.items]
            scores = score_many(recs, skipped=skipped if k == counts[0] else {}, **common)
            keep = [i for i, r in enumerate(ds.items) if r.id in scores]
            if len(keep) < 2:
                raise CapscoreError(f"{ds.name}: fewer than two items could be scored")
            stats += vatex_stats([scores[ds.items[i].id] for i in keep], ds.humans[keep], prefix=f"{k}-ref ", **kw)
            n = max(n, len(keep))
        params["n_refs"] = counts
    bb = encoder.backbone
    return CorrelationResult(dataset=ds.name, source=ds.source, metric=spec.name, backbone=bb.spec,
                             identity=bb.identity, prefix=prefix, n=n, stats=tuple(stats), skipped=skipped,
                             seed=seed, n_resamples=n_resamples, params={**dict(ds.params), **params})


VIDEO_DATASETS = {
    "vatex-eval": "--path VATEX-EVAL folder (candidates_list.pkl, gts_list.pkl, human_scores.pkl, video_ids.pkl), "
                  "--videos folder of VIDEO_ID.mp4",
    "activitynet-foil": "--path ActivityNet-FOIL folder (anet_entities_test_1/2.json, final_right/foil_video_sentences"
                        ".json), --videos folder of VIDEO_ID.mp4",
    "scenes-video": "no files needed (synthetic clips); or --path the output of `capscore scenes generate --videos`",
}


def load_video_dataset(name: str, path=None, videos=None, *, seed: int = 0, n_scenes: int = 40,
                       size: int = 64):
    if name == "vatex-eval":
        return load_vatex_eval(path, videos)
    if name == "activitynet-foil":
        return load_activitynet_foil(path, videos)
    if name == "scenes-video":
        return scenes_video_oracle(path, n_scenes=n_scenes, seed=seed, size=size)

    raise unknown_name("video dataset", name, VIDEO_DATASETS)
