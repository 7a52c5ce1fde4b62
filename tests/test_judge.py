"""FLEUR / RefFLEUR / EXPERT: prompts, score reading and smoothing by hand, and the whole judge on a tiny
random-weight LLaVA (LlavaForConditionalGeneration with a tiny Llama and a tiny CLIP vision tower) whose
tokenizer is built here with the ``tokenizers`` library (digits are single tokens, as in Llama's)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from capscore.errors import CapscoreError

from learned_weights import LLAVA_SYSTEM as SYSTEM


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory):
    """A tiny LLaVA folder in the transformers layout: config + safetensors + tokenizer + image processor."""
    from learned_weights import llava_folder

    return llava_folder(tmp_path_factory.mktemp("llava-tiny"))


@pytest.fixture(scope="module")
def vlm(llava_dir):
    from capscore.backbones.vlm import load_vlm

    return load_vlm(llava_dir)


def images(n):
    rng = np.random.default_rng(1)
    return [Image.fromarray((rng.random((30 + 6 * i, 40, 3)) * 255).astype("uint8")) for i in range(n)]


class Force:
    """Forces an answer token by token: at each step the row's next token of its answer is made the argmax,
    with ``probs[k]`` (a {digit: probability} dict, one largest) as the whole distribution at answer position ``k``.
    A row's answer is ``answers[turn]``, turn 1 once its prompt holds an end-of-sequence token (the second
    turn's prompt carries the first answer's ``</s>``)."""

    def __init__(self, tok, answers, probs=None):
        self.tok = tok
        self.answers = [tok(a, add_special_tokens=False).input_ids + [tok.eos_token_id] for a in answers]
        self.probs = probs or {}
        self.digit = {d: tok.encode(str(d))[-1] for d in range(10)}

    def __call__(self, input_ids, scores):
        out = torch.full_like(scores, -math.inf)
        for row, ids in enumerate(input_ids.tolist()):
            turn = int(ids.count(self.tok.eos_token_id) > 0) if len(self.answers) > 1 else 0
            answer = self.answers[turn]
            k = max(j for j in range(len(answer) + 1) if j == 0 or ids[-j:] == answer[:j])
            if k >= len(answer):
                out[row, self.tok.eos_token_id] = 0.0
                continue
            dist = self.probs.get(k) if turn == 0 else None
            if dist:
                for d, p in dist.items():
                    out[row, self.digit[d]] = math.log(p)
                assert answer[k] == self.digit[max(dist, key=dist.get)]
            else:
                out[row, answer[k]] = 0.0
        return out


# ------------------------------------------------------------------------------------ prompts
def test_llava_v1_conversation_strings():
    from capscore.backbones.vlm import llava_v1_prompt

    assert llava_v1_prompt([("<image>\nHi", None)]) == SYSTEM + " USER: <image>\nHi ASSISTANT:"
    two = llava_v1_prompt([("<image>\nHi", "0.75</s>"), ("Why?", None)])
    assert two == SYSTEM + " USER: <image>\nHi ASSISTANT: 0.75</s></s>USER: Why? ASSISTANT:"


def test_judge_prompts_are_the_scripts_strings():
    from capscore.scores.judge import JUDGES, first_turn

    assert first_turn(JUDGES["fleur"], "a dog") == (
        "<image>\nYour task is to evaluate and rate the caption on a scale of 0.0 to 1.0 based on the given Grading "
        "Criteria. (Print Real Number Score ONLY)\n\nGrading Criteria:\n\n0.0: The caption does not describe the "
        "image at all.\n1.0: The caption accurately and clearly describes the image.\n\nCaption: a dog\n\n"
        "Score(Choose a rating from 0.0 to 1.0):")
    ref = first_turn(JUDGES["reffleur"], "a dog", ["a puppy", "a {dog}"])
    assert ("based on the given Grading Criteria. (Print Real Number Score ONLY)" in ref
            and "\n\nReference Captions: a puppy\na {dog}\n\nCandidate Caption: a dog\n\nScore(Choose" in ref
            and ref.startswith("<image>\nYour task is to evaluate and rate the candidate caption"))
    assert first_turn(JUDGES["expert"], "a dog") == (
        "<image>\nEvaluate the caption and assign a score on a scale of 0.0 to 1.0.\n\nCaption: a dog\n\n"
        "Score (0.0~1.0):")
    # the scripts read candidates with ' '.join(caption.split()) (fleur.py, reffleur.py, expert.py)
    assert "\n\nCaption: a dog runs\n\nScore" in first_turn(JUDGES["fleur"], " a  dog\n runs\t")
    assert "Candidate Caption: a dog runs\n\n" in first_turn(JUDGES["reffleur"], "a dog\nruns", ["a  puppy"])
    assert "Reference Captions: a  puppy\n\n" in first_turn(JUDGES["reffleur"], "a dog", ["a  puppy"])
    why = JUDGES["expert"].why.format(candidate="a dog")
    assert why.endswith("Output Format:\nFluency: {Provide explanation here.}\nRelevance: {Provide explanation here.}"
                        "\nDescriptiveness: {Provide explanation here.}") and "\n\nCaption: a dog\n\n" in why


def test_prompt_ids_follow_tokenizer_image_token(vlm):
    """Pieces around <image> tokenised apart, the start token kept once, the image expanded to its tokens."""
    from capscore.backbones.vlm import prompt_ids

    tok = vlm.tokenizer
    ids = prompt_ids(vlm, "USER: <image>\nWhy? ASSISTANT:")
    first, second = tok("USER: ").input_ids, tok("\nWhy? ASSISTANT:").input_ids
    assert first[0] == tok.bos_token_id and second[0] == tok.bos_token_id
    assert vlm.num_image_tokens == (28 // 14) ** 2
    assert ids == first + [vlm.image_token_id] * 4 + second[1:]


def test_pad_to_square_centres_on_the_mean_colour():
    from capscore.backbones.vlm import pad_to_square

    wide = Image.new("RGB", (4, 1), (255, 0, 0))
    out = np.asarray(pad_to_square(wide, (1, 2, 3)))
    assert out.shape == (4, 4, 3) and (out[1] == [255, 0, 0]).all()  # pasted at row (4 - 1) // 2 = 1
    assert (out[0] == [1, 2, 3]).all() and (out[2:] == [1, 2, 3]).all()
    tall = np.asarray(pad_to_square(Image.new("RGB", (1, 3), (9, 9, 9)), (0, 0, 0)))
    assert tall.shape == (3, 3, 3) and (tall[:, 1] == 9).all() and (tall[:, 0] == 0).all()


# ------------------------------------------------------------------------------------ reading and smoothing by hand
@pytest.mark.parametrize("answer, number", [("0.75", 0.75), ("Score: 0.8.", 0.8), (" .0.5 ", 0.5), ("1.0", 1.0),
                                            ("abc", None), ("", None)])
def test_read_number(answer, number):
    from capscore.scores.judge import read_number

    assert read_number(answer) == number


DIG = list(range(100, 110))  # digit d's token id is 100 + d
DOT, EOS = 50, 2


def table(rows):
    """(steps, 10) probabilities from {step: {digit: p}}."""
    t = torch.zeros(max(rows) + 1, 10)
    for step, dist in rows.items():
        for d, p in dist.items():
            t[step, d] = p
    return t


def test_smoothing_two_decimals_by_hand():
    from capscore.scores.judge import smooth

    tokens = [DIG[0], DOT, DIG[7], DIG[5], EOS]  # "0.75"
    probs = table({2: {7: 0.6, 8: 0.2, 6: 0.2}, 3: {5: 0.5, 4: 0.5}})
    score, why = smooth(0.75, tokens, probs, DIG)
    assert why == "" and score == pytest.approx(0.1 * (7 * 0.6 + 8 * 0.2 + 6 * 0.2) + 0.01 * (5 * 0.5 + 4 * 0.5), abs=1e-6)


def test_smoothing_takes_the_scripts_occurrences():
    from capscore.scores.judge import smooth

    # "0.0x": the first decimal is the *second* "0" token
    tokens = [DIG[0], DOT, DIG[0], DIG[3], EOS]
    probs = table({0: {0: 1.0}, 2: {0: 0.7, 1: 0.3}, 3: {3: 1.0}})
    assert smooth(0.03, tokens, probs, DIG)[0] == pytest.approx(0.1 * 0.3 + 0.01 * 3, abs=1e-6)
    # "0.66": first decimal = first "6", second decimal = second "6"
    tokens = [DIG[0], DOT, DIG[6], DIG[6], EOS]
    probs = table({2: {6: 0.5, 2: 0.5}, 3: {6: 0.25, 9: 0.75}})
    assert smooth(0.66, tokens, probs, DIG)[0] == pytest.approx(0.1 * (3 + 1) + 0.01 * (1.5 + 6.75), abs=1e-6)
    # "0.50" reads as 0.5: one decimal only
    tokens = [DIG[0], DOT, DIG[5], DIG[0], EOS]
    probs = table({2: {5: 0.5, 6: 0.5}, 3: {0: 0.1, 9: 0.9}})
    assert smooth(0.5, tokens, probs, DIG)[0] == pytest.approx(0.1 * (2.5 + 3.0), abs=1e-6)


def test_smoothing_of_one_and_of_unreadable_answers():
    from capscore.scores.judge import smooth

    tokens = [DIG[1], DOT, DIG[0], EOS]
    probs = table({0: {1: 0.7, 0: 0.3}})
    assert smooth(1.0, tokens, probs, DIG)[0] == pytest.approx(0.9 * 0.3 + 0.7, abs=1e-6)
    nan, why = smooth(1.5, tokens, probs, DIG)
    assert math.isnan(nan) and "outside [0, 1]" in why
    nan, why = smooth(0.4, [DOT, EOS], table({0: {}}), DIG)
    assert math.isnan(nan) and "digit 4" in why


# ------------------------------------------------------------------------------------ the judge on a tiny LLaVA
def test_fleur_end_to_end_on_forced_answers(vlm):
    from capscore.scores.judge import judge

    probs = {2: {7: 0.6, 8: 0.2, 6: 0.2}, 3: {5: 0.6, 4: 0.4}}  # answer positions: "0", ".", "7", "5"
    force = Force(vlm.tokenizer, ["0.75"], probs)
    out = judge(vlm, "fleur", images(3), ["a dog runs", "two cats sleep", "a dog"], batch_size=2,
                logits_processor=[force], max_new_tokens=8)
    want = 0.1 * (7 * 0.6 + 8 * 0.2 + 6 * 0.2) + 0.01 * (5 * 0.6 + 4 * 0.4)
    assert [v.score for v in out] == pytest.approx([want] * 3, abs=1e-6)
    assert all(v.raw == 0.75 and v.answer == "0.75" and v.error == "" and v.explanation is None for v in out)


def test_unreadable_answer_is_nan_with_the_reason(vlm):
    from capscore.scores.judge import judge

    out = judge(vlm, "fleur", images(1), ["a dog"], logits_processor=[Force(vlm.tokenizer, ["abc"])], max_new_tokens=8)
    assert math.isnan(out[0].score) and out[0].error == "no number in the answer" and out[0].answer == "abc"


def test_explanations_are_kept_when_asked(vlm):
    from capscore.scores.judge import judge

    probs = {2: {7: 1.0}, 3: {5: 1.0}}
    force = Force(vlm.tokenizer, ["0.75", "Fluency: good\nRelevance: ok\nDescriptiveness: fine"], probs)
    out = judge(vlm, "expert", images(2), ["a dog", "two cats"], explain=True, logits_processor=[force],
                max_new_tokens=64)
    assert [v.score for v in out] == pytest.approx([0.75, 0.75], abs=1e-6)
    assert out[0].explanation == {"fluency": "good", "relevance": "ok", "descriptiveness": "fine"}
    fleur = judge(vlm, "fleur", images(1), ["a dog"], explain=True, logits_processor=[force], max_new_tokens=64)
    assert fleur[0].explanation == "Fluency: good\nRelevance: ok\nDescriptiveness: fine"


def test_batched_generation_matches_one_prompt_at_a_time(vlm):
    """Left-padded batches give each prompt the tokens and digit probabilities it gets alone (float32)."""
    from capscore.backbones.vlm import generate, llava_v1_prompt
    from capscore.scores.judge import JUDGES, first_turn

    caps = ["a dog", "two cats sleep on the", "a"]
    prompts = [llava_v1_prompt([(first_turn(JUDGES["reffleur"], c, ["a dog runs"] * (i + 1)), None)])
               for i, c in enumerate(caps)]
    imgs = images(3)
    together = generate(vlm, prompts, imgs, batch_size=3, max_new_tokens=5)
    for i in range(3):
        alone = generate(vlm, prompts[i:i + 1], imgs[i:i + 1], batch_size=1, max_new_tokens=5)[0]
        assert together[i].tokens == alone.tokens
        assert torch.allclose(together[i].digit_probs, alone.digit_probs, atol=1e-5)


def test_judge_argument_errors(vlm):
    from capscore.scores.judge import judge

    with pytest.raises(CapscoreError, match="reffleur is reference-based"):
        judge(vlm, "reffleur", images(1), ["a dog"])
    with pytest.raises(CapscoreError, match="did you mean.*fleur"):
        judge(vlm, "fleuur", images(1), ["a dog"])
    with pytest.raises(CapscoreError, match="1 images and 2 captions"):
        judge(vlm, "fleur", images(1), ["a dog", "a cat"])


def test_load_vlm_refuses_a_folder_that_is_not_llava(tmp_path):
    from capscore.backbones.vlm import load_vlm

    with pytest.raises(CapscoreError, match="no config.json"):
        load_vlm(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(CapscoreError, match="model_type 'bert'"):
        load_vlm(tmp_path)
