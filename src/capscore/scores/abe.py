"""ABE-CLIP: training-free attribute-binding scoring (Zhang, Chen, Deng & Shen, arXiv:2512.17178, 2025).

Global CLIP similarity cos(t_eot, v_cls) behaves like a bag of words: "a yellow
cylinder and a red cube" and "a red cylinder and a yellow cube" get nearly the
same score. ABE-CLIP scores the caption's *tokens* against the image's *patches*
and first moves each object token towards "this object with *its own*
attributes" and away from "this object with the *other* objects' attributes".
No training; any CLIP-style backbone that exposes patch tokens and per-token
text features in the joint space (``Encoder.image_patches``,
``Encoder.text_tokens``) can be scored.

Notation (all vectors L2-normalised, in the joint space)
--------------------------------------------------------
image: global v_cls, patches v_1..v_N;  caption: tokens t_1..t_M, global t_eot.

1. Local token–patch alignment (paper: "Local Token-Patch Alignment")::

       S_ij   = cos(t_i, v_j)
       φ_i    = (1/K) Σ_{j ∈ topK_j S_ij} S_ij                 K = 5
       S_base = (1/M) Σ_i φ_i

2. Semantic refinement (paper: "Semantic Refinement Mechanism"). spaCy finds
   attribute–object pairs (a, k); for each object k with attributes A⁺_k, let
   obj_1..obj_P be its P nearest words in a concept pool (:mod:`.concepts`) and
   A⁻_k the attributes of the caption's *other* objects::

       F(A, obj)  = final-layer token embedding of obj when encoding "A obj"
       F(∅, obj)  = the same when encoding "obj" alone
       b⁺_k = (1/P) Σ_i [F(A⁺_k, obj_i) − F(∅, obj_i)]
       b⁻_k = (1/P) Σ_i [F(A⁻_k, obj_i) − F(∅, obj_i)]        (0 if A⁻_k is empty)
       t′_k = t_k + b⁺_k − b⁻_k
       t′_a = t_a + t_k                                       for every a ∈ A⁺_k

3. Binding difference::

       S_refine = S_base computed with the refined tokens t′
       Δ        = |S_refine − S_base|
       S_local  = S_refine + Δ        (= max(S_base, 2·S_refine − S_base))

4. Fusion with the global score::

       S_global = cos(t_eot, v_cls)
       S_final  = (1 − ω)·S_local + ω·S_global                ω = 0.3

Ablation switches (``AbeConfig``): ``refine=False`` gives S_local = S_base
("local only"); ``refine=True, binding_difference=False`` gives S_local =
S_refine ("+ refinement"); both on is the full method ("+ binding difference").
``negative_binding=False`` drops b⁻. ``omega=1`` is plain global cosine,
``omega=0`` pure local. :data:`ABLATIONS` names these presets.

Choices the paper leaves open (and what capscore does)
------------------------------------------------------
* **Which tokens count.** The caption's real BPE tokens *without* the
  start-of-text and end-of-text tokens (``special_tokens=False``): under CLIP's
  causal mask the start token sees only itself, so its vector is the same for
  every caption and would add a caption-independent term; the end token *is*
  t_eot, already used by S_global. Padding never counts. Stop words and
  punctuation tokens do count (the paper averages over the text's tokens).
* **Multi-token words.** Words (spaCy tokens) are mapped to BPE spans by
  tokenising growing prefixes of the caption: word [s, e) covers tokens
  n(caption[:s]) .. n(caption[:e]) − 1, n = number of non-special tokens. CLIP's
  BPE splits at word boundaries, so this is exact for it. b⁺ − b⁻ is added to
  *every* token of the object's span; t_k in t′_a = t_a + t_k is the mean of
  the object's span vectors (a single vector for a one-token object), added to
  every token of the attribute's span. F(A, obj) is the mean of obj's span in
  the phrase encoding (its last tokens before the end token).
* **Which t_k in t′_a.** The *unrefined* object vector, as the equation is written.
* **Several attributes on one object** ("green vintage car"): A⁺ is used as one
  phrase in caption order ("green vintage obj_i"), not averaged per attribute.
  A⁻_k is the other objects' attributes in caption order, minus those k itself
  has (an attribute shared by both would cancel out anyway).
* **Pairs.** spaCy dependencies: an object is a NOUN/PROPN; its attributes are
  children with a dependency in ``attribute_deps`` (``amod``, ``compound``),
  plus adjectives conjoined to those ("a red and blue car" -> red, blue).
  Predicative attributes ("the car is green") are not extracted. The pool is
  searched with the object's lemma ("spheres" -> "sphere"). A position that is
  both an attribute and an object receives both increments, each computed from
  the *original* token vectors, so the result does not depend on order.
* **Refined tokens are re-normalised** before the cosine (S_ij is a cosine).
* **P** (neighbours): section 3.2 names P but never its value; default 5, the same as K
  (``--abe-p``). K = 5 and ω = 0.3 are the paper's (section 4.2.1).
* **Parser.** The paper parses with Stanza; capscore uses spaCy (Stanza's models cannot be
  fetched offline, spaCy's ship as a package). Tested on the paper's own sentences.
* **Pool.** The paper's pool is SPLiCE's vocabulary (> 12K concepts); it is public but
  unlicensed, so not bundled: see :mod:`capscore.scores.concepts` and ``--concept-pool``.
* **Backbone.** The headline numbers are ABE on FG-CLIP (``fgclip:DIR``, whose patch tokens
  are FG-CLIP's dense value-path features).
* **Phrases carry no article or prompt** ("green vintage car", not "a photo of
  a green vintage car"), and captions get no prefix.
* **Truncation.** Captions longer than the context are truncated by the engine
  (end token kept); words past the cut are ignored.
* **Patches.** open_clip ViT patch tokens after ``ln_post`` and the projection,
  class token excluded; K is capped at the number of patches.

Every F(A, obj) is requested once per call for all captions together
(:func:`capscore.scores.abe_phrases.phrase_features`: on a causal tower the phrases are packed
into rows where attribute prefixes with the same leading tokens share them, each token
masked to its own phrase's causal view and no end token, which gives each phrase's own
features) and kept in the engine's feature cache (persistent and byte-bounded with an
on-disk cache); every image is encoded once, one forward
giving its global vector (persistent cache) and its patch tokens
(``Encoder.image_patches``, or ``encode_images(..., patches=True)`` when the caller
checks the images first); the concept pool's vectors are one cached matrix
(:func:`capscore.scores.concepts.pool_vectors`); spaCy parses are cached by text.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from capscore.embed.engine import Encoder
from capscore.errors import CapscoreError, InputError, param_error, unknown_name
from capscore.scores.abe_phrases import phrase_features
from capscore.scores.concepts import load_concept_pool, nearest_concepts, pool_vectors
import capscore.nlp
from capscore.nlp import parse_cached

CITATION = "Zhang, Chen, Deng & Shen, ABE-CLIP: Training-Free Attribute Binding Enhancement, arXiv:2512.17178 (2025)"


# ====================================================================== configuration
@dataclass(frozen=True)
class AbeConfig:
    """All knobs of ABE-CLIP (see the module docstring for what each one changes).

    k                  patches averaged per token (top-K), paper default 5
    p                  nearest concept-pool objects per caption object (not stated in the paper)
    omega              weight of the global score in the fusion, paper default 0.3
    refine             semantic refinement on (t′); off = local alignment only
    negative_binding   subtract b⁻ (other objects' attributes) in t′_k
    binding_difference S_local = S_refine + |S_refine − S_base|; off = S_refine
    special_tokens     also align the start and end tokens
    pool               concept pool file (the paper's: SPLiCE's vocabulary); None = the bundled pool
    spacy_model        spaCy pipeline used for attribute–object pairs
    attribute_deps     dependency labels that make a child of a noun an attribute
    """

    k: int = 5
    p: int = 5
    omega: float = 0.3
    refine: bool = True
    negative_binding: bool = True
    binding_difference: bool = True
    special_tokens: bool = False
    pool: str | None = None
    spacy_model: str | None = None  # None: capscore.nlp.spacy_model_name() ($CAPSCORE_SPACY_MODEL, official, fallback)
    attribute_deps: tuple[str, ...] = ("amod", "compound")

    def __post_init__(self) -> None:
        where = "AbeConfig"
        for name in ("k", "p"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise param_error(name, where, "an int >= 1", v)
        if isinstance(self.omega, bool) or not isinstance(self.omega, (int, float)) or not 0 <= self.omega <= 1:
            raise param_error("omega", where, "a number in [0, 1]", self.omega)
        for name in ("refine", "negative_binding", "binding_difference", "special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise param_error(name, where, "True or False", getattr(self, name))
        if self.pool is not None:
            if not isinstance(self.pool, str):
                object.__setattr__(self, "pool", str(self.pool))  # accept pathlib.Path
            load_concept_pool(self.pool)  # a missing or empty file fails here (read once: cached by mtime)
        if isinstance(self.attribute_deps, str) or not all(isinstance(d, str) for d in self.attribute_deps):
            raise param_error("attribute_deps", where, "a tuple of spaCy dependency labels", self.attribute_deps)
        object.__setattr__(self, "attribute_deps", tuple(self.attribute_deps))


ABLATIONS: dict[str, dict] = {
    "global": {"omega": 1.0},  # plain CLIP cosine
    "local": {"refine": False, "binding_difference": False},
    "local+refine": {"refine": True, "binding_difference": False},
    "full": {"refine": True, "binding_difference": True},
}


def make_config(*, ablation: str | None = None, **options) -> AbeConfig:
    """Options (and an optional :data:`ABLATIONS` preset, overridden by explicit options) -> AbeConfig."""
    names = [f.name for f in dataclasses.fields(AbeConfig)]
    for key in options:
        if key not in names:
            raise unknown_name("ABE option", key, names + ["ablation"])
    preset = {}
    if ablation is not None:
        if ablation not in ABLATIONS:
            raise unknown_name("ABE ablation", ablation, ABLATIONS)
        preset = ABLATIONS[ablation]
    return AbeConfig(**{**preset, **options})


# ====================================================================== step 1: local alignment
def token_patch_similarity(tokens: torch.Tensor, patches: torch.Tensor) -> torch.Tensor:
    """S (M, N) with S_ij = cos(t_i, v_j); rows of both inputs are re-normalised."""
    return F.normalize(tokens, dim=-1) @ F.normalize(patches, dim=-1).T


def topk_pool(sim: torch.Tensor, *, k: int) -> torch.Tensor:
    """φ (M,): per row, the mean of its ``min(k, N)`` largest entries."""
    return sim.topk(min(k, sim.shape[-1]), dim=-1).values.mean(-1)


def local_alignment(tokens: torch.Tensor, patches: torch.Tensor, *, k: int) -> torch.Tensor:
    """S = mean_i φ_i for tokens (M, D) against patches (N, D); a 0-d tensor."""
    return topk_pool(token_patch_similarity(tokens, patches), k=k).mean()


# ====================================================================== step 2: refinement
def binding_vector(with_attribute: torch.Tensor, bare: torch.Tensor) -> torch.Tensor:
    """b = mean_i [F(A, obj_i) − F(∅, obj_i)] from (P, D) and (P, D) -> (D,)."""
    return (with_attribute - bare).mean(0)


@dataclass(frozen=True)
class Binding:
    """One caption object after pair extraction, with token spans [start, stop) into the token matrix."""

    object_span: tuple[int, int]
    attribute_spans: tuple[tuple[int, int], ...]
    b_plus: torch.Tensor  # (D,)
    b_minus: torch.Tensor  # (D,)  zeros when there is nothing to subtract


def refine_tokens(tokens: torch.Tensor, bindings: Sequence[Binding], *, negative_binding: bool = True) -> torch.Tensor:
    """t′ (M, D), re-normalised: t′_k = t_k + b⁺ − b⁻ on object spans, t′_a = t_a + t_k on attribute spans.

    Every increment is computed from the *original* tokens and summed, so a
    position that is both an attribute and an object gets both, in any order.
    """
    delta = torch.zeros_like(tokens)
    for b in bindings:
        o0, o1 = b.object_span
        shift = b.b_plus - (b.b_minus if negative_binding else 0)
        delta[o0:o1] += shift
        t_k = tokens[o0:o1].mean(0)
        for a0, a1 in b.attribute_spans:
            delta[a0:a1] += t_k
    return F.normalize(tokens + delta, dim=-1)


# ====================================================================== steps 3-4: scores
def binding_difference(s_refine: torch.Tensor, s_base: torch.Tensor) -> torch.Tensor:
    """S_local = S_refine + |S_refine − S_base|."""
    return s_refine + (s_refine - s_base).abs()


def fuse(s_local: torch.Tensor, s_global: torch.Tensor, *, omega: float) -> torch.Tensor:
    """S_final = (1 − ω)·S_local + ω·S_global."""
    return (1 - omega) * s_local + omega * s_global


# ====================================================================== text side: pairs and spans
@dataclass(frozen=True)
class Word:
    text: str
    start: int  # character offsets into the caption
    end: int
    lemma: str = ""


@dataclass(frozen=True)
class AttributeObject:
    """An object noun and its attribute words, as found in one caption."""

    object: Word
    attributes: tuple[Word, ...]


def _spacy(name: str | None):
    return capscore.nlp.load_spacy(name, disable=("ner",))  # a missing model is a one-line CapscoreError there


def pairs_from_doc(doc, *, attribute_deps: Sequence[str] = ("amod", "compound")) -> list[AttributeObject]:
    """Attribute–object pairs of a parsed spaCy ``Doc`` (rules in the module docstring), in caption order."""
    out = []
    deps = set(attribute_deps)
    for tok in doc:
        if tok.pos_ not in ("NOUN", "PROPN"):
            continue
        attrs = []
        for child in tok.children:
            if child.dep_ in deps:
                attrs.append(child)
                attrs.extend(c for c in child.conjuncts if c.pos_ == "ADJ" and c.i < tok.i)
        attrs = sorted({a.i: a for a in attrs}.values(), key=lambda a: a.i)
        if attrs:
            w = lambda t: Word(t.text, t.idx, t.idx + len(t.text), t.lemma_.lower())  # noqa: E731
            out.append(AttributeObject(w(tok), tuple(w(a) for a in attrs)))
    return out


def extract_pairs(
    texts: Sequence[str], *, spacy_model: str | None = None, attribute_deps: Sequence[str] = ("amod", "compound")
) -> list[list[AttributeObject]]:
    """Attribute–object pairs of each text (spaCy), e.g. "a green vintage car" -> car: (green, vintage).

    Each text is parsed once per process (:func:`capscore.nlp.parse_cached`)."""
    deps = tuple(attribute_deps)
    return parse_cached(list(texts), lambda doc: pairs_from_doc(doc, attribute_deps=deps),
                        key=f"abe-pairs:{','.join(deps)}", name=spacy_model, disable=("ner",))


def word_token_span(tokenize: Callable[[str], list[int]], text: str, word: Word, *, n_special: int) -> tuple[int, int]:
    """Token positions [start, stop) of ``word`` in ``[SOT] + tokens(text) + [EOT]`` (prefix tokenisation)."""
    start = len(tokenize(text[: word.start])) - n_special + 1
    stop = len(tokenize(text[: word.end])) - n_special + 1
    return start, stop


# ====================================================================== the shell around the pure steps
@dataclass(frozen=True)
class AbeComponents:
    """Per-pair scores of every stage, (N,) each; ``final`` is what the scorer returns."""

    base: torch.Tensor
    refine: torch.Tensor
    local: torch.Tensor
    global_: torch.Tensor
    final: torch.Tensor
    config: AbeConfig = field(repr=False)


@dataclass(frozen=True)
class _Caption:
    """One caption ready for alignment: token matrix rows to align, original and refined."""

    tokens: torch.Tensor  # (M, D) the aligned tokens (specials dropped unless asked)
    refined: torch.Tensor  # (M, D)
    global_: torch.Tensor  # (D,)
    strings: tuple[str, ...]
    offset: int  # position of tokens[0] in the full token list
    pairs: tuple[AttributeObject, ...]


def _tokenizer(encoder: Encoder) -> tuple[Callable[[str], list[int]], int]:
    """(tokenize one string, number of special tokens); remembers each string's tokens (prefixes of a
    caption and the pool words are tokenised many times)."""
    bb = encoder.backbone
    memo: dict[str, list[int]] = {}

    def tokenize(s: str) -> list[int]:
        ids = memo.get(s)
        if ids is None:
            ids = memo[s] = bb.tokenize([s])[0]
        return ids

    return tokenize, len(tokenize(""))


@dataclass(frozen=True)
class _ObjectPlan:
    """What one caption object needs: its spans, its pool neighbours and the attribute phrases."""

    span: tuple[int, int]
    attribute_spans: tuple[tuple[int, int], ...]
    neighbours: tuple[str, ...]
    mine: str  # A⁺ as a phrase prefix, e.g. "green vintage"
    others: str  # A⁻, "" when no other object has an attribute of its own

    def phrases(self, negative_binding: bool) -> list[tuple[str, str]]:
        """(attribute prefix, object) of every F(·, obj) the object needs; "" is F(∅, obj)."""
        out = [*(("", o) for o in self.neighbours), *((self.mine, o) for o in self.neighbours)]
        if self.others and negative_binding:
            out += [(self.others, o) for o in self.neighbours]
        return out


def _plan_objects(encoder: Encoder, text: str, pairs: Sequence[AttributeObject], n_tokens: int,
                  neighbours: dict[str, list[str]], tokenizer=None) -> list[_ObjectPlan]:
    """Token spans (clipped to the possibly truncated caption) and phrases of every object of ``text``."""
    tokenize, n_special = tokenizer or _tokenizer(encoder)
    last = n_tokens - 1  # the end token's position

    def span(w: Word) -> tuple[int, int]:
        s0, s1 = word_token_span(tokenize, text, w, n_special=n_special)
        return s0, min(s1, last)

    plans = []
    for po in pairs:
        o = span(po.object)
        if o[0] >= o[1]:
            continue  # object cut off by truncation
        a_spans = tuple(a for a in map(span, po.attributes) if a[0] < a[1])
        mine = [a.text.lower() for a in po.attributes]
        others = [a.text.lower() for q in pairs if q is not po for a in q.attributes]
        others = [a for a in dict.fromkeys(others) if a not in mine]
        near = neighbours[po.object.lemma or po.object.text.lower()]
        plans.append(_ObjectPlan(o, a_spans, tuple(near), " ".join(mine), " ".join(others)))
    return plans


def _prepare_captions(encoder: Encoder, texts: Sequence[str], config: AbeConfig) -> dict[str, _Caption]:
    """Unique captions -> token matrices, refined when ``config.refine`` (phrases encoded in one batch)."""
    uniq = list(dict.fromkeys(texts))
    feats = dict(zip(uniq, encoder.text_tokens(uniq)))
    tokenize, n_special = _tokenizer(encoder)
    pairs = {t: [] for t in uniq}
    if config.refine:
        found = extract_pairs(uniq, spacy_model=config.spacy_model, attribute_deps=config.attribute_deps)
        pairs = dict(zip(uniq, found))

    # --- concept-pool neighbours of every object, then every phrase of every caption in one batch
    plans: dict[str, list[_ObjectPlan]] = {t: [] for t in uniq}
    if any(pairs.values()):
        pool = load_concept_pool(config.pool)
        lemmas = sorted({po.object.lemma or po.object.text.lower() for ps in pairs.values() for po in ps})
        near = nearest_concepts(encoder.encode_texts(lemmas), pool_vectors(encoder, pool), p=config.p)
        neighbours = {lem: [pool.words[i] for i in row] for lem, row in zip(lemmas, near.tolist())}
        plans = {t: _plan_objects(encoder, t, pairs[t], len(feats[t].ids), neighbours, (tokenize, n_special))
                 for t in uniq}
    phrases = list(dict.fromkeys(ph for ps in plans.values() for p in ps for ph in p.phrases(config.negative_binding)))
    phrase_feats = dict(zip(phrases, phrase_features(encoder, phrases))) if phrases else {}

    def F_(prefix: str, word: str) -> torch.Tensor:
        """F(prefix, word): mean of the word's tokens when the tower encodes "prefix word"."""
        return phrase_feats[(prefix, word)]

    out = {}
    for t in uniq:
        f = feats[t]
        bindings = []
        for p in plans[t]:
            bare = torch.stack([F_("", o) for o in p.neighbours])  # (P, D)
            b_plus = binding_vector(torch.stack([F_(p.mine, o) for o in p.neighbours]), bare)
            b_minus = torch.zeros_like(b_plus)
            if p.others and config.negative_binding:
                b_minus = binding_vector(torch.stack([F_(p.others, o) for o in p.neighbours]), bare)
            bindings.append(Binding(p.span, p.attribute_spans, b_plus, b_minus))
        vectors = f.vectors
        refined = refine_tokens(vectors, bindings, negative_binding=config.negative_binding) if bindings else vectors
        lo, hi = (0, len(vectors)) if config.special_tokens else (1, len(vectors) - 1)
        if hi <= lo:
            raise InputError(f"caption {t!r}", "has no tokens to align", expected="a non-empty caption")
        out[t] = _Caption(vectors[lo:hi], refined[lo:hi], f.global_, f.tokens[lo:hi], lo, tuple(pairs[t]))
    return out


def _check_inputs(encoder: Encoder, images: Sequence, texts: Sequence[str]) -> None:
    if len(images) != len(texts):
        raise CapscoreError(f"ABE-CLIP scores aligned pairs: got {len(images)} images and {len(texts)} texts")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise InputError(f"text #{i}", "caption is not a string", got=t)
        if not t.strip():
            raise InputError(f"text #{i}", "empty caption")
    bb = encoder.backbone
    if not (bb.has_patch_tokens and bb.has_token_features):
        missing = "patch tokens" if not bb.has_patch_tokens else "per-token text features"
        raise CapscoreError(
            f"ABE-CLIP needs {missing} in the joint space, which backbone {bb.spec} does not expose "
            "(use FG-CLIP, the paper's backbone: fgclip:DIR; or an open_clip ViT with a CLIP text tower, "
            "e.g. ViT-B-32/openai or scenes-tiny)"
        )


def abe_components(encoder: Encoder, images: Sequence, texts: Sequence[str], *, config: AbeConfig = AbeConfig()) -> AbeComponents:
    """Every stage's score for each (image_i, text_i) pair; see the module docstring."""
    return abe_k_sweep(encoder, images, texts, (config.k,), config=config)[config.k]


def abe_k_sweep(encoder: Encoder, images: Sequence, texts: Sequence[str], ks: Sequence[int], *,
                config: AbeConfig = AbeConfig()) -> dict[int, AbeComponents]:
    """:func:`abe_components` for each K in ``ks`` (the paper's Table 3 sweep) from one parse,
    refinement and encoding pass: only the top-K pooling depends on K. ``config.k`` is ignored."""
    _check_inputs(encoder, images, texts)
    configs = {k: dataclasses.replace(config, k=k) for k in dict.fromkeys(ks)}
    if not texts:
        z = torch.empty(0)
        return {k: AbeComponents(z, z, z, z, z, c) for k, c in configs.items()}
    v_cls, patches = encoder.image_patches(images)  # (N, D), (N, P, D); each image encoded once
    caps = _prepare_captions(encoder, texts, config)
    base = {k: [] for k in configs}
    refine = {k: [] for k in configs}
    glob = []
    for i, t in enumerate(texts):
        c = caps[t]
        sim_base = token_patch_similarity(c.tokens, patches[i])
        sim_refine = token_patch_similarity(c.refined, patches[i]) if config.refine else sim_base
        for k in configs:
            base[k].append(topk_pool(sim_base, k=k).mean())
            refine[k].append(topk_pool(sim_refine, k=k).mean())
        glob.append(v_cls[i] @ c.global_)
    s_global = torch.stack(glob)
    out = {}
    for k, cfg in configs.items():
        s_base, s_refine = torch.stack(base[k]), torch.stack(refine[k])
        if not config.refine:
            s_local = s_base
        elif config.binding_difference:
            s_local = binding_difference(s_refine, s_base)
        else:
            s_local = s_refine
        out[k] = AbeComponents(s_base, s_refine, s_local, s_global, fuse(s_local, s_global, omega=config.omega), cfg)
    return out


def abe_scores(encoder: Encoder, images: Sequence, texts: Sequence[str], *, config: AbeConfig = AbeConfig()) -> torch.Tensor:
    """S_final (N,) for each (image_i, text_i) pair: ABE-CLIP with ``config``."""
    return abe_components(encoder, images, texts, config=config).final


@dataclass(frozen=True)
class AbeScorer:
    """A pair scorer (``(encoder, images, texts) -> (N,)``) that remembers its configuration."""

    config: AbeConfig
    name: str = "abe"
    citation: str = CITATION
    needs_patches = True  # (a class attribute) callers that check images first encode patches in that pass

    def __call__(self, encoder: Encoder, images: Sequence, texts: Sequence[str]) -> torch.Tensor:
        return abe_scores(encoder, images, texts, config=self.config)


def make_abe_scorer(**options) -> AbeScorer:
    """ABE-CLIP as a pair scorer; ``options`` are :class:`AbeConfig` fields plus ``ablation=`` (a preset name)."""
    return AbeScorer(make_config(**options))


# ====================================================================== explanation (heat map)
@dataclass(frozen=True)
class WordHeatmap:
    """cos(word tokens, patches) on the patch grid, for ``capscore explain``."""

    grid: torch.Tensor  # (side, side), mean over the word's tokens
    word: str
    tokens: tuple[str, ...]  # the word's BPE tokens
    refined: bool
    topk: tuple[int, ...]  # patch indices of the K best patches (row-major)


def word_heatmap(
    encoder: Encoder, image, caption: str, word: str, *, config: AbeConfig = AbeConfig(), refined: bool = False
) -> WordHeatmap:
    """Token–patch similarity of one word of ``caption`` over the patch grid of ``image``.

    With ``refined=True`` the refined token t′ (semantic refinement) is used, which
    shows how binding moves the word's attention between objects.
    """
    _check_inputs(encoder, [image], [caption])
    words = [w for w in caption.replace(",", " ").replace(".", " ").split()]
    _, patches = encoder.image_patches([image])
    P = patches.shape[1]
    side = math.isqrt(P)
    if side * side != P:
        raise CapscoreError(f"backbone {encoder.backbone.spec} has {P} patch tokens, not a square grid")
    cfg = dataclasses.replace(config, refine=refined, special_tokens=True)
    cap = _prepare_captions(encoder, [caption], cfg)[caption]
    nlp = _spacy(config.spacy_model)
    doc = nlp(caption)
    match = [t for t in doc if t.text.lower() == word.lower()]
    if not match:
        raise unknown_name(f"word in caption {caption!r}:", word, words)
    tokenize, n_special = _tokenizer(encoder)
    tok = match[0]
    s0, s1 = word_token_span(tokenize, caption, Word(tok.text, tok.idx, tok.idx + len(tok.text)), n_special=n_special)
    s1 = min(s1, len(cap.tokens) - 1)
    if s0 >= s1:
        raise CapscoreError(f"word {word!r} falls past the backbone's context and was truncated")
    vecs = (cap.refined if refined else cap.tokens)[s0:s1]
    sim = token_patch_similarity(vecs, patches[0]).mean(0)  # (P,)
    top = sim.topk(min(config.k, P)).indices.tolist()
    return WordHeatmap(sim.reshape(side, side), tok.text, cap.strings[s0:s1], refined, tuple(top))
