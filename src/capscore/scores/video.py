"""Video caption scoring: EMScore-style matching with CLIP or PAC-S weights, and its reference-based forms.

PAC-S scores videos the way EMScore does (Shi et al., EMScore, CVPR 2022; Sarto et al., PAC-S,
CVPR 2023, §4.3 "video captioning": PAC-Score(c, V) = (Score(c, V)_c + Score(c, V)_f) / 2), on
frames encoded independently by the image tower (``capscore.embed.Encoder.encode_videos``):

* coarse-grained:  cogr = cos(t_eot, v̄),  v̄ = normalise(mean_f v_f)
* fine-grained:    S_if = cos(t_i, v_f) for caption tokens i and frames f
                   P = Σ_i idf_i · max_f S_if / Σ_i idf_i     (token -> frame)
                   R = mean_f max_i S_if                      (frame -> token)
                   F = 2PR / (P + R)
* full:            EMScore(X, V) = PAC-S(c, V) = (F + cogr) / 2

Reference-based (caption vs reference r, both as token features; EMScore's EMScore(X, X*)):

* Score(c, r) = (F(c, r) + cos(t_c, t_r)) / 2 with P = Σ_i idf_i max_j cos(c_i, r_j) / Σ idf
  over candidate tokens, R the same over reference tokens with the reference's idf.
* RefPAC-S(c, V, R) = (PAC-S(c, V) + max_{r∈R} Score(c, r)) / 2 — the PAC-S paper's video
  formula, word for word (``ref_max="score"``: the best reference by its full score).
* EMScore(X, V, X*) (``emscore-ref``) = the same average, but the reference code takes the
  maximum over references *per component* (max F and max cos separately, possibly from two
  different references) before averaging (``ref_max="component"``). With one reference the
  two agree.

Choices, as in the EMScore reference code (which the PAC-S video evaluation reuses with PAC-S
weights): caption tokens include the start and end tokens; no clamping and no ``w`` factor
(raw cosines); no prompt prefix; idf weights default to 1 (``idf=None``) and can be computed from
a corpus with :func:`idf_weights` (log((N+1)/(df+1)), unseen ids log(N+1), the end token set
to the mean idf as the reference does). ``clip-s`` on a video is CLIPScore on the mean frame
embedding: 2.5 · max(cogr, 0) (a baseline; the papers do not define it).

A video is anything :class:`~capscore.data.video.VideoRef` reads (video file, animated image,
frame folder, frame list), sampled by :class:`~capscore.data.video.Sampling` (default
``uniform:10``).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from capscore.errors import CapscoreError, InputError
from capscore.scores.metric import Values

if TYPE_CHECKING:  # torch and the engine load where a formula runs: the registry's names are known without them
    import torch

    from capscore.embed.engine import Encoder, TokenFeatures
    from capscore.scores.metric import Values


@dataclass(frozen=True)
class VideoScore:
    """EMScore components for one pair (caption vs video, or caption vs reference)."""

    coarse: float
    fine_p: float
    fine_r: float
    fine_f: float

    @property
    def full_p(self) -> float:
        return (self.fine_p + self.coarse) / 2

    @property
    def full_r(self) -> float:
        return (self.fine_r + self.coarse) / 2

    @property
    def full_f(self) -> float:
        return (self.fine_f + self.coarse) / 2


def _f1(p: float, r: float) -> float:
    return 2 * p * r / (p + r) if (p + r) != 0 else 0.0


def video_embedding(frames: torch.Tensor) -> torch.Tensor:
    """(F, D) normalised frame vectors -> (D,) normalised mean."""
    import torch.nn.functional as F  # noqa: PLC0415  (deferred: torch)

    return F.normalize(frames.mean(dim=0), dim=-1)


def em_score(
    frames: torch.Tensor, tokens: torch.Tensor, text_global: torch.Tensor, *, idf: torch.Tensor | None = None
) -> VideoScore:
    """EMScore(X, V) of one caption: frames (F, D), tokens (L, D), text_global (D,), all normalised."""
    import torch  # noqa: PLC0415  (deferred: torch)

    sim = tokens @ frames.T  # (L, F)
    w = torch.ones(tokens.shape[0]) if idf is None else idf.float()
    w = w / w.sum()
    p = float((sim.max(dim=1).values * w).sum())
    r = float(sim.max(dim=0).values.mean())
    cogr = float(text_global @ video_embedding(frames))
    return VideoScore(cogr, p, r, _f1(p, r))


def text_em_score(
    cand: torch.Tensor, cand_global: torch.Tensor, ref: torch.Tensor, ref_global: torch.Tensor, *,
    cand_idf: torch.Tensor | None = None, ref_idf: torch.Tensor | None = None,
) -> VideoScore:
    """EMScore(X, X*) against one reference: cand (L, D), ref (M, D) token vectors, globals (D,)."""
    import torch  # noqa: PLC0415  (deferred: torch)

    sim = cand @ ref.T  # (L, M)
    wc = torch.ones(cand.shape[0]) if cand_idf is None else cand_idf.float()
    wr = torch.ones(ref.shape[0]) if ref_idf is None else ref_idf.float()
    p = float((sim.max(dim=1).values * wc / wc.sum()).sum())
    r = float((sim.max(dim=0).values * wr / wr.sum()).sum())
    return VideoScore(float(cand_global @ ref_global), p, r, _f1(p, r))


def best_reference(per_ref: Sequence[VideoScore], *, ref_max: str = "score") -> VideoScore:
    """max over references: ``"score"`` keeps the reference with the best (F + cos)/2 (PAC-S paper);
    ``"component"`` takes each component's maximum separately (EMScore reference code)."""
    if not per_ref:
        raise CapscoreError("a reference-based video metric needs at least one reference per caption")
    if ref_max == "score":
        return max(per_ref, key=lambda s: s.full_f)
    if ref_max == "component":
        return VideoScore(max(s.coarse for s in per_ref), max(s.fine_p for s in per_ref),
                          max(s.fine_r for s in per_ref), max(s.fine_f for s in per_ref))
    raise CapscoreError(f"The 'ref_max' parameter must be 'score' or 'component'; got {ref_max!r} instead.")


def ref_video_score(video: VideoScore, ref: VideoScore) -> float:
    """RefPAC-S(c, V, R) = (PAC-S(c, V) + Score(c, r*)) / 2 (PAC-S §4.3); also EMScore(X, V, X*)'s full F."""
    return (video.full_f + ref.full_f) / 2


def idf_weights(token_ids: Iterable[Sequence[int]], *, eos_id: int | None = None) -> dict[int, float]:
    """Document frequency -> idf = log((N+1)/(df+1)) over a corpus of tokenised captions.

    ``-1`` holds the idf of unseen ids, log(N+1). If ``eos_id`` is given its idf is set to the
    mean idf of the corpus ids, as the EMScore reference code does for the end-of-text token
    (which occurs in every caption and would otherwise weigh 0).
    """
    docs = [set(ids) for ids in token_ids]
    df = Counter(i for d in docs for i in d)
    n = len(docs)
    out = {i: math.log((n + 1) / (c + 1)) for i, c in df.items()}
    if eos_id is not None and out:
        out[eos_id] = sum(out.values()) / len(out)
    return out | {-1: math.log(n + 1)}


def _idf_vector(idf: Mapping[int, float] | None, ids: Sequence[int]) -> torch.Tensor | None:
    if idf is None:
        return None
    import torch  # noqa: PLC0415  (deferred: torch)

    return torch.tensor([idf.get(i, idf.get(-1, 1.0)) for i in ids])


def corpus_idf(encoder: Encoder, texts: Sequence[str]) -> dict[int, float]:
    """idf over ``texts`` tokenised by the encoder's backbone; the end token gets the mean idf."""
    ids = encoder.backbone.tokenize(list(texts))
    eos = Counter(row[-1] for row in ids if row).most_common(1)
    return idf_weights(ids, eos_id=eos[0][0] if eos else None)


# ------------------------------------------------------------------------------------ the video formulas
#: extra row columns of every video metric: the final score's parts (EMScore's coarse and fine P/R/F, and the
#: chosen reference's coarse and fine F for the reference-based ones)
VIDEO_PARTS = ("coarse", "fine_p", "fine_r", "fine_f", "ref_coarse", "ref_fine_f")


@dataclass(frozen=True)
class VideoFormula:
    """A video formula: how its final value is formed (``final``: ``"clip-s"`` on the mean frame, ``"em"``
    EMScore(X, V), ``"ref-em"`` with references), how the best reference is chosen (``ref_max``, see
    :func:`best_reference`) and the CLIP-S weight. The registry rows (:mod:`capscore.scores.metric`,
    registered in :mod:`capscore.scores.clipscore`) use these as their ``video`` formula and hold the rest
    (name, citation, prefix)."""

    final: str  # "clip-s" | "em" | "ref-em"
    ref_max: str = "score"
    w: float | None = None  # CLIP-S on the mean frame: w · max(cos, 0); EMScore has no weight

    columns = VIDEO_PARTS

    @property
    def clamp(self) -> bool | None:
        return True if self.final == "clip-s" else None  # EMScore's raw cosines are not clamped

    @property
    def needs_refs(self) -> bool:
        return self.final == "ref-em"

    @property
    def needs(self) -> frozenset:
        return frozenset({"frames", "global"} | ({"tokens"} if self.final != "clip-s" else set())
                         | ({"refs"} if self.needs_refs else set()))

    def compute(self, batch) -> "Values":
        """Scores of an :class:`~capscore.scores.metric.EmbeddingBatch` of video records
        (``batch.options``: ``sampling``, ``idf``)."""
        if self.final != "clip-s":
            _check_frames_meet_tokens(batch.encoder)
        frames = batch.frames()
        cands = list(batch.texts()) if self.final == "clip-s" else batch.text_tokens()
        ref_feats = batch.ref_tokens() if self.needs_refs else {}
        idf = batch.options.get("idf")
        fields = []
        for rec, fr, cand in zip(batch.records, frames, cands):
            refs = [ref_feats[batch.prefix + r] for r in rec.refs] if self.needs_refs else []
            fields.append(combine(self, fr, cand, refs, idf=idf).fields())
        return Values([f["score"] for f in fields], {k: [f[k] for f in fields] for k in VIDEO_PARTS})


#: the video formula of each registry row that scores videos (by the row's name)
VIDEO_METRICS: dict[str, VideoFormula] = {
    "clip-s": VideoFormula("clip-s", w=2.5),  # 2.5 · max(cos(caption, mean frame), 0)
    "pac-s": VideoFormula("em"),  # (coarse + fine F)/2; PAC-S §4.3, with PAC-S weights
    "refpac-s": VideoFormula("ref-em", "score"),  # (PAC-S(c, V) + max_r Score(c, r))/2, best reference by its score
    "emscore": VideoFormula("em"),  # EMScore(X, V) with CLIP weights
    "emscore-ref": VideoFormula("ref-em", "component"),  # EMScore(X, V, X*): each component maxed separately
}


@dataclass(frozen=True)
class VideoResult:
    """Every number behind one (video, caption) score; ``ref`` is the chosen reference side."""

    score: float
    video: VideoScore | None
    ref: VideoScore | None = None

    def fields(self) -> dict:
        v, r = self.video, self.ref
        return {"score": self.score,
                "coarse": None if v is None else v.coarse, "fine_p": None if v is None else v.fine_p,
                "fine_r": None if v is None else v.fine_r, "fine_f": None if v is None else v.fine_f,
                "ref_coarse": None if r is None else r.coarse, "ref_fine_f": None if r is None else r.fine_f}


def combine(metric: VideoFormula, frames: torch.Tensor, cand: TokenFeatures | torch.Tensor,
            refs: Sequence[TokenFeatures] = (), *, idf: Mapping[int, float] | None = None) -> VideoResult:
    """One pair's result from its embeddings (pure). ``cand`` is a global vector for clip-s."""
    from capscore.embed.engine import TokenFeatures  # noqa: PLC0415  (deferred: numpy, torch)

    if metric.final == "clip-s":
        g = cand.global_ if isinstance(cand, TokenFeatures) else cand
        cogr = float(g @ video_embedding(frames))
        return VideoResult(metric.w * max(cogr, 0.0), VideoScore(cogr, math.nan, math.nan, math.nan))
    vs = em_score(frames, cand.vectors, cand.global_, idf=_idf_vector(idf, cand.ids))
    if metric.final == "em":
        return VideoResult(vs.full_f, vs)
    per_ref = [text_em_score(cand.vectors, cand.global_, r.vectors, r.global_,
                             cand_idf=_idf_vector(idf, cand.ids), ref_idf=_idf_vector(idf, r.ids)) for r in refs]
    best = best_reference(per_ref, ref_max=metric.ref_max)
    return VideoResult(ref_video_score(vs, best), vs, best)


# ------------------------------------------------------------------------------------ scoring
def score_videos(
    encoder: Encoder,
    videos: Sequence,
    captions: Sequence[str],
    *,
    prefix: str = "",
    idf: dict[int, float] | None = None,
    sampling=None,
) -> list[VideoScore]:
    """EMScore(X, V) for aligned videos and captions; frames and tokens go through the encoder (cached)."""
    if len(videos) != len(captions):
        raise InputError("videos", "videos and captions differ in number", expected=str(len(videos)), got=len(captions))
    _check_frames_meet_tokens(encoder)
    feats: list[TokenFeatures] = encoder.text_tokens([prefix + c for c in captions])
    frames = encoder.encode_videos(videos, sampling=sampling)
    return [em_score(fr, ft.vectors, ft.global_, idf=_idf_vector(idf, ft.ids)) for fr, ft in zip(frames, feats)]


def _check_frames_meet_tokens(encoder: Encoder) -> None:
    """EMScore's fine-grained term compares frame embeddings (global vectors) with word tokens: both must
    live in one space, which a second-order read-out (capscore.backbones.readout) breaks."""
    bb = encoder.backbone
    if bb.token_dim != bb.embed_dim:
        raise CapscoreError(f"{bb.spec}: EMScore's fine-grained term (video pac-s, refpac-s, emscore, emscore-ref) "
                            f"matches word tokens ({bb.token_dim}-d) with frame embeddings "
                            f"({bb.embed_dim}-d, a {getattr(bb, 'readout', '?')} read-out); they are not one "
                            "space. Use --metric clip-s (the global cosine alone) or a class-token model")


def load_frames(video, sampling="all") -> list:
    """A video reference -> its sampled frames as RGB images (all frames by default)."""
    from capscore.data.video import Sampling, VideoRef  # noqa: PLC0415  (deferred: numpy)

    return VideoRef.of(video).load(Sampling.parse(sampling))
