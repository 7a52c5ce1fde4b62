"""Vision-language judges: FLEUR, RefFLEUR (Lee et al., ACL 2024) and EXPERT (Kim et al., ACL 2025 Findings).

A LLaVA-1.5 model is asked for a score between 0.0 and 1.0; the score is read from the answer, then
*smoothed* with the probabilities the model gave each digit token where it wrote the score's digits.

Sources (the papers' text is not in ``shared/papers``; prompts and arithmetic are read from the code):
FLEUR — "FLEUR: An Explainable Reference-Free Evaluation Metric for Image Captioning Using a Large
Multimodal Model", ACL 2024, §3 (score smoothing); code Yebin46/FLEUR at b9cd6c9 (``fleur.py``,
``reffleur.py``, ``fleur_exp.py``). EXPERT — "EXPERT: An Explainable Image Captioning Evaluation Metric
with Structured Explanations", ACL 2025 Findings (arXiv:2506.24016); code hjkim811/EXPERT at 74bbef4
(``expert.py``). The prompts below are those scripts' strings, character for character.

Reading the score (both scripts): every character but digits and dots is removed from the answer, then
leading and trailing dots; the rest is parsed as a float ``s``. ``s`` outside [0, 1] is not scored (the
scripts skip the item). Smoothing, with ``P_t(d)`` the probability of digit token ``d`` at generated
step ``t`` (softmax over the vocabulary of that step's scores)::

    s < 1:  d₁ = first decimal of s;  t₁ = the step that wrote d₁
            score = Σ_d d · P_t₁(d) · 0.1
            if s has a second decimal d₂ (str(s) longer than 3 characters), t₂ = the step that wrote d₂:
            score += Σ_d d · P_t₂(d) · 0.01
    s = 1:  t = the step that wrote "1";  score = 0.9 · P_t(0) + P_t(1)

Which step wrote a digit (the scripts search the generated tokens for the digit's id): if the digit
occurs once, that step; if more than once, the second occurrence when d₁ = 0 (the first is the integer
part's "0" in "0.0x"), else the first for d₁, and always the second for d₂ ("0.66" → the second "6").
``str(s)`` decides the decimals, so "0.50" reads as 0.5 and gets one decimal of smoothing. The sums
run in float32, in the scripts' order.

Choices the scripts leave open, made here and exposed:

* the answer is decoded without special tokens (EXPERT's way); FLEUR's ``outputs[:-4]`` cuts the end
  token's four characters instead — the same text whenever the answer ended, and FLEUR's would drop
  four characters of an answer cut off by ``max_new_tokens``;
* an answer that cannot be read (no number, out of [0, 1], a digit that is not among the generated
  tokens) gives NaN with the reason, where the scripts print "Error!" (FLEUR: the previous item's score
  is reused) or stop (EXPERT);
* ``s = 1`` with several "1" tokens: the first (the scripts fail there);
* ``explain=True`` runs the scripts' second turn, with the smoothed score as the assistant's first
  answer (``str(score) + "</s>"``): FLEUR asks "Why? Tell me the reason.", EXPERT asks for fluency,
  relevance and descriptiveness and its answer is parsed into those three fields (None if it does not
  follow the format).

EXPERT's released weights are a LoRA adapter (``hjkim811/EXPERT-llava-13b-lora``) on
``liuhaotian/llava-v1.5-13b`` in the original LLaVA layout; transformers loads it once merged into the
base model and converted to the ``llava-hf`` layout (see docs/learned.md). Its prompts, parsing and
smoothing are FLEUR's machinery with other strings, so both run through :func:`judge`.
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from capscore.backbones.vlm import Generation, VisionJudge, digit_token_ids, generate, llava_v1_prompt
from capscore.errors import CapscoreError, unknown_name
from capscore.data.images import ImageRef

from capscore.scores.citations import EXPERT_CITATION, FLEUR_CITATION  # noqa: E402

FLEUR_PROMPT = (
    "Your task is to evaluate and rate the caption on a scale of 0.0 to 1.0 based on the given Grading Criteria. "
    "(Print Real Number Score ONLY)\n\nGrading Criteria:\n\n0.0: The caption does not describe the image at all."
    "\n1.0: The caption accurately and clearly describes the image.\n\nCaption: {candidate}\n\n"
    "Score(Choose a rating from 0.0 to 1.0):")
REFFLEUR_PROMPT = (
    "Your task is to evaluate and rate the candidate caption on a scale of 0.0 to 1.0 based on the given Grading "
    "Criteria. (Print Real Number Score ONLY)\n\nGrading Criteria:\n\n0.0: The caption does not describe the image "
    "at all.\n1.0: The caption accurately and clearly describes the image.\n\nReference Captions: {references}\n\n"
    "Candidate Caption: {candidate}\n\nScore(Choose a rating from 0.0 to 1.0):")
FLEUR_WHY = "Why? Tell me the reason."
EXPERT_PROMPT = "Evaluate the caption and assign a score on a scale of 0.0 to 1.0.\n\nCaption: {candidate}\n\nScore (0.0~1.0):"
EXPERT_WHY = (
    "Provide a brief explanation for the score based on three criteria: Fluency, Relevance, and Descriptiveness."
    "\n\nCaption: {candidate}\n\nEvaluation Criteria:\n- Fluency: Whether the caption is fluent, natural, and "
    "grammatically correct.\n- Relevance: Whether the sentence correctly describes the visual content and be "
    "closely relevant to the image.\n- Descriptiveness: Whether the sentence is a precise, informative caption "
    "that describes important details of the image.\n\nOutput Format:\nFluency: {{Provide explanation here.}}\n"
    "Relevance: {{Provide explanation here.}}\nDescriptiveness: {{Provide explanation here.}}")
EXPERT_FIELDS = re.compile(r"Fluency:\s*(.*?)\nRelevance:\s*(.*?)\nDescriptiveness:\s*(.*)", re.DOTALL)


@dataclass(frozen=True)
class JudgeSpec:
    """One judge metric: its prompts (``{candidate}``, ``{references}``), how references are joined,
    whether its explanation is parsed into fields, and the model it was published with."""

    name: str
    prompt: str
    why: str
    needs_refs: bool
    citation: str
    model: str  # the published model (Hugging Face id of the transformers layout, or how to make it)
    reference_join: str = "\n"  # reffleur.py: '\n'.join(ground_truth)
    structured: bool = False


JUDGES: dict[str, JudgeSpec] = {s.name: s for s in [
    JudgeSpec("fleur", FLEUR_PROMPT, FLEUR_WHY, False, FLEUR_CITATION, "llava-hf/llava-1.5-13b-hf"),
    JudgeSpec("reffleur", REFFLEUR_PROMPT, FLEUR_WHY, True, FLEUR_CITATION, "llava-hf/llava-1.5-13b-hf"),
    JudgeSpec("expert", EXPERT_PROMPT, EXPERT_WHY, False, EXPERT_CITATION,
              "hjkim811/EXPERT-llava-13b-lora merged into liuhaotian/llava-v1.5-13b, llava-hf layout", structured=True),
]}


@dataclass
class Verdict:
    """A judge's result for one item: ``score`` (NaN when unreadable, with ``error``), the number as
    written (``raw``), the answer text, and the explanation when asked for (text, or EXPERT's fields)."""

    score: float
    raw: float | None
    answer: str
    explanation: str | dict | None = None
    error: str = ""


# ------------------------------------------------------------------------------------ reading and smoothing
def read_number(answer: str) -> float | None:
    """The scripts' reading: keep digits and dots, strip leading/trailing dots, ``float``; None if none."""
    numbers = re.sub(r"\.+$", "", re.sub(r"^\.+", "", re.sub(r"[^\d\.]", "", answer)))
    try:
        return float(numbers)
    except ValueError:
        return None


def _step(tokens: Sequence[int], token: int, occurrence: str) -> int | None:
    """The step that wrote ``token``: its only occurrence, else the ``occurrence`` ("first"/"second")."""
    at = [i for i, t in enumerate(tokens) if t == token]
    if not at:
        return None
    return at[0] if len(at) == 1 or occurrence == "first" else at[1]


def smooth(raw: float, tokens: Sequence[int], digit_probs: torch.Tensor, digit_ids: Sequence[int]) -> tuple[float, str]:
    """(smoothed score, '') or (NaN, why) for a read number ``raw`` (module docstring)."""
    if not 0.0 <= raw <= 1.0:
        return math.nan, f"the answer's number {raw:g} is outside [0, 1]"
    p = digit_probs.to(torch.float32)
    weights = torch.arange(10)
    if raw == 1.0:
        t = _step(tokens, digit_ids[1], "first")
        if t is None:
            return math.nan, "the digit 1 of the answer is not among the generated tokens"
        return float(0.9 * p[t, 0] + p[t, 1]), ""
    text = str(raw)
    if "." not in text:  # e.g. 1e-05
        return math.nan, f"the answer's number {text} has no decimal digits to smooth"
    dot = text.index(".")
    score = torch.zeros((), dtype=torch.float32)
    for k, scale in ((1, 0.1), (2, 0.01)):
        if k == 2 and len(text) <= 3:
            break
        d = int(text[dot + k])
        t = _step(tokens, digit_ids[d], "second" if (k == 2 or d == 0) else "first")
        if t is None:
            return math.nan, f"the digit {d} of the answer is not among the generated tokens"
        for r in range(10):  # the scripts' loop: score += probs[token] * rate * scale, in float32
            score = score + p[t, r] * int(weights[r]) * scale
    return float(score), ""


def verdict(gen: Generation, digit_ids: Sequence[int]) -> Verdict:
    raw = read_number(gen.text)
    if raw is None:
        return Verdict(math.nan, None, gen.text, error="no number in the answer")
    score, why = smooth(raw, gen.tokens, gen.digit_probs, digit_ids)
    return Verdict(score, raw, gen.text, error=why)


def parse_expert_explanation(text: str) -> dict | None:
    """EXPERT's three fields (fluency, relevance, descriptiveness), or None when the answer does not follow
    its output format."""
    m = EXPERT_FIELDS.search(text)
    if not m:
        return None
    return {"fluency": m.group(1).strip(), "relevance": m.group(2).strip(), "descriptiveness": m.group(3).strip()}


# ------------------------------------------------------------------------------------ running a judge
def first_turn(spec: JudgeSpec, candidate: str, refs: Sequence[str] = ()) -> str:
    """The first user turn. The candidate's whitespace is collapsed as the scripts read their annotation
    files (``' '.join(caption.split())``); the references are joined as given."""
    candidate = " ".join(candidate.split())
    text = spec.prompt.format(candidate=candidate, references=spec.reference_join.join(refs))
    return "<image>\n" + text  # mm_use_im_start_end is False for LLaVA-1.5


def judge(vlm: VisionJudge, metric: str | JudgeSpec, images: Sequence, captions: Sequence[str],
          refs: Sequence[Sequence[str]] | None = None, *, explain: bool = False, batch_size: int = 8,
          max_new_tokens: int = 512, pad_images: bool = True, logits_processor: Sequence = ()) -> list[Verdict]:
    """Score each (image, caption[, references]) with a judge metric (``"fleur"``, ``"reffleur"``,
    ``"expert"``). ``images``: PIL images or paths. ``explain``: run the second turn for every item that
    got a score. ``logits_processor``: extra generation processors (tests force answers with them)."""
    spec = metric if isinstance(metric, JudgeSpec) else JUDGES.get(metric)
    if spec is None:
        raise unknown_name("judge metric", str(metric), JUDGES)
    if len(images) != len(captions) or (refs is not None and len(refs) != len(captions)):
        raise CapscoreError(f"{spec.name}: {len(images)} images and {len(captions)} captions"
                            + (f" and {len(refs)} reference lists" if refs is not None else "")
                            + "; expected one of each per item")
    if spec.needs_refs and refs is None:
        raise CapscoreError(f"{spec.name} is reference-based: give each caption its references")
    refs = refs if refs is not None else [()] * len(captions)
    pil = [ImageRef.of(x).load()[1] for x in images]
    digits = digit_token_ids(vlm.tokenizer)
    firsts = [first_turn(spec, c, r) for c, r in zip(captions, refs)]
    gens = generate(vlm, [llava_v1_prompt([(f, None)]) for f in firsts], pil, batch_size=batch_size,
                    max_new_tokens=max_new_tokens, pad_images=pad_images, logits_processor=logits_processor)
    out = [verdict(g, digits) for g in gens]
    if explain:
        explain_verdicts(vlm, spec, out, firsts, pil, captions, batch_size=batch_size,
                         max_new_tokens=max_new_tokens, pad_images=pad_images, logits_processor=logits_processor)
    return out


def explain_verdicts(vlm: VisionJudge, spec: JudgeSpec, out: list[Verdict], firsts: Sequence[str], pil: Sequence,
                     captions: Sequence[str], **gen) -> None:
    """The second turn for every scored item, in place: the first answer is the smoothed score as the scripts
    write it (``str(score) + "</s>"``), then the judge's ``why`` prompt (RefFLEUR borrows FLEUR's: its
    authors published no explanation script for it)."""
    todo = [i for i, v in enumerate(out) if not math.isnan(v.score)]
    if not todo:
        return
    prompts = [llava_v1_prompt([(firsts[i], f"{out[i].score}</s>"),
                                (spec.why.format(candidate=" ".join(captions[i].split())), None)])
               for i in todo]
    for i, g in zip(todo, generate(vlm, prompts, [pil[i] for i in todo], **gen)):
        out[i].explanation = parse_expert_explanation(g.text) if spec.structured else g.text


__all__ = ["EXPERT_PROMPT", "EXPERT_WHY", "FLEUR_PROMPT", "FLEUR_WHY", "JUDGES", "JudgeSpec", "REFFLEUR_PROMPT",
           "Verdict", "judge", "parse_expert_explanation", "read_number", "smooth", "verdict"]
