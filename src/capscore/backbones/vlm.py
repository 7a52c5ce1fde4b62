"""Vision-language judges: a LLaVA-compatible model that transformers loads, prompted as LLaVA-1.5 was.

FLEUR and EXPERT ask LLaVA-1.5 (``liuhaotian/llava-v1.5-13b``, through the original LLaVA code base)
for a score and read the digits' probabilities off the generation. capscore runs the same model in the
layout transformers loads (``llava-hf/llava-1.5-13b-hf``, ``LlavaForConditionalGeneration``), from a
local folder, with the original code's prompt and image handling reproduced here:

* **conversation** — LLaVA's ``conv_templates["llava_v1"]`` (:func:`llava_v1_prompt`): the system line,
  then ``USER: <image>\\n{prompt} ASSISTANT:``; a later turn follows ``{answer}</s>`` (the separator
  ``sep2`` after each assistant message);
* **tokens** — LLaVA's ``tokenizer_image_token`` (:func:`prompt_ids`): the prompt is split at
  ``<image>``, each piece tokenised on its own (the beginning-of-sequence token kept only on the first),
  and the image placeholder put between them — expanded here to the ``N`` image-token ids
  ``LlavaForConditionalGeneration`` fills with the projected patch features (``N = (336 / 14)² = 576``
  for LLaVA-1.5, the positions the original model gave its image features);
* **image** — ``image_aspect_ratio="pad"`` (the FLEUR and EXPERT scripts' default): LLaVA's
  ``expand2square`` pads the image to a square with the processor's mean colour, centred, before the
  CLIP processor resizes and crops it (:func:`pad_to_square`);
* **decoding** — greedy, ``num_beams=1``, up to ``max_new_tokens`` (the scripts: 512), stopping at the
  end-of-sequence token; prompts of a batch are left-padded. Per generated step the probabilities of the
  ten digit tokens are recorded (a softmax over the whole vocabulary of the step's scores in float32 —
  what the scripts read from ``output_dict.scores``) instead of keeping every step's logits.

Batched generation pads prompts; in float16 that can change the last bits of a logit compared with one
prompt at a time (the scripts' way), so a tie between two tokens may resolve differently.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
import hashlib

from capscore.backbones.base import resolve_device, resolve_dtype
from capscore.errors import CapscoreError
from capscore.backbones.released import file_digest

#: LLaVA's ``conv_llava_v1``: system prompt, roles, separators (SeparatorStyle.TWO).
LLAVA_V1_SYSTEM = ("A chat between a curious human and an artificial intelligence assistant. "
                   "The assistant gives helpful, detailed, and polite answers to the human's questions.")
LLAVA_V1_ROLES = ("USER", "ASSISTANT")
LLAVA_V1_SEPS = (" ", "</s>")
IMAGE_PLACEHOLDER = "<image>"
SMALL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer.model", "tokenizer_config.json",
               "special_tokens_map.json", "preprocessor_config.json", "processor_config.json", "chat_template.json")


def llava_v1_prompt(turns: Sequence[tuple[str, str | None]]) -> str:
    """``conv.get_prompt()`` of LLaVA's ``llava_v1`` template for (user message, assistant message or None)
    turns; the first user message should start with ``<image>\\n``. An empty or missing message writes
    the role alone (``ASSISTANT:``), where the model's answer starts."""
    messages = [(role, m) for user, assistant in turns for role, m in zip(LLAVA_V1_ROLES, (user, assistant))]
    out = LLAVA_V1_SYSTEM + LLAVA_V1_SEPS[0]
    for i, (role, message) in enumerate(messages):
        out += f"{role}: {message}{LLAVA_V1_SEPS[i % 2]}" if message else f"{role}:"
    return out


def pad_to_square(image: Image.Image, fill: tuple[int, ...]) -> Image.Image:
    """LLaVA's ``expand2square``: paste the image centred (offset rounded down) on a square of ``fill``."""
    w, h = image.size
    if w == h:
        return image
    side = max(w, h)
    out = Image.new(image.mode, (side, side), fill)
    out.paste(image, ((side - w) // 2, 0) if h == side else (0, (side - h) // 2))
    return out


@dataclass
class VisionJudge:
    """A loaded judge: model, tokenizer, image processor and what prompt building needs."""

    model: torch.nn.Module
    tokenizer: object
    image_processor: object
    image_token_id: int
    num_image_tokens: int
    name: str
    files: str = "-"  # digest of the folder's small files and the weights files' names and sizes

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def identity(self) -> str:
        return f"vlm:{self.name}|files={self.files}|{str(self.dtype).replace('torch.', '')}"


def image_tokens(config) -> int:
    """Image-token positions of a LLaVA config: patches of the vision tower, plus its class token under
    ``vision_feature_select_strategy="full"``."""
    v = config.vision_config
    n = (int(v.image_size) // int(v.patch_size)) ** 2
    return n + (1 if getattr(config, "vision_feature_select_strategy", "default") == "full" else 0)


def judge_from_parts(model, tokenizer, image_processor, *, name: str, files: str = "-") -> VisionJudge:
    token_id = getattr(model.config, "image_token_id", None)
    if token_id is None:
        token_id = getattr(model.config, "image_token_index")
    return VisionJudge(model.eval(), tokenizer, image_processor, int(token_id), image_tokens(model.config), name, files)


def load_vlm(folder: str | Path, *, device: str = "cpu", dtype: str = "fp32",
             trust_remote_code: bool = False) -> VisionJudge:
    """A ``LlavaForConditionalGeneration`` folder (config, safetensors, tokenizer, image processor), offline.

    ``dtype``: the authors ran float16 on GPUs. Remote code runs only when the caller sets ``trust_remote_code``."""
    from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer, LlavaForConditionalGeneration

    base = Path(folder).expanduser()
    if not (base / "config.json").is_file():
        raise CapscoreError(f"{base}: no config.json (a LLaVA model folder in the transformers layout, e.g. "
                            "https://huggingface.co/llava-hf/llava-1.5-13b-hf)")
    resolve_device(device)
    torch_dtype = resolve_dtype(dtype)
    config = AutoConfig.from_pretrained(str(base), local_files_only=True, trust_remote_code=trust_remote_code)
    if getattr(config, "model_type", "") != "llava":
        raise CapscoreError(f"{base}: model_type {getattr(config, 'model_type', None)!r}; FLEUR/EXPERT need a "
                            "LLaVA model (model_type 'llava')")
    try:
        model = LlavaForConditionalGeneration.from_pretrained(str(base), dtype=torch_dtype, local_files_only=True,
                                                              trust_remote_code=trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(str(base), local_files_only=True, trust_remote_code=trust_remote_code)
        processor = AutoImageProcessor.from_pretrained(str(base), local_files_only=True,
                                                       trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise CapscoreError(f"{base}: cannot load the LLaVA folder ({' '.join(str(e).split())[:200]})") from None
    small = [base / f for f in SMALL_FILES if (base / f).is_file()]
    weights = sorted(p for p in base.iterdir() if p.suffix in (".safetensors", ".bin"))

    sizes = hashlib.sha256("|".join(f"{p.name}:{p.stat().st_size}" for p in weights).encode()).hexdigest()[:8]
    digest = f"{file_digest(small)}-{sizes}"  # the weights by name and size: hashing 26 GB per load is not worth it
    model.to(resolve_device(device))
    return judge_from_parts(model, tokenizer, processor, name=base.name, files=digest)


def prompt_ids(judge: VisionJudge, prompt: str) -> list[int]:
    """LLaVA's ``tokenizer_image_token`` with the placeholder expanded to the judge's image tokens."""
    tok = judge.tokenizer
    chunks = [tok(chunk).input_ids for chunk in prompt.split(IMAGE_PLACEHOLDER)]
    bos = tok.bos_token_id
    offset = 1 if chunks and chunks[0] and chunks[0][0] == bos else 0
    ids = [bos] if offset else []
    for i, chunk in enumerate(chunks):
        if i:
            ids += [judge.image_token_id] * judge.num_image_tokens
        ids += chunk[offset:]
    return ids


def pixel_values(judge: VisionJudge, images: Sequence[Image.Image], *, pad: bool = True) -> torch.Tensor:
    """The image processor's tensors, after :func:`pad_to_square` with its mean colour when ``pad``."""
    proc = judge.image_processor
    if pad:
        fill = tuple(int(x * 255) for x in proc.image_mean)
        images = [pad_to_square(im, fill) for im in images]
    extra = {"do_pad": False} if hasattr(proc, "do_pad") else {}  # never pad twice
    return proc(images=list(images), return_tensors="pt", **extra)["pixel_values"]


class DigitRecorder:
    """A logits processor that records, at each step, the probability of each digit token (softmax of the
    step's scores over the whole vocabulary, float32) and changes nothing."""

    def __init__(self, digit_ids: Sequence[int]):
        self.digit_ids = torch.tensor(list(digit_ids), dtype=torch.long)
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(scores.float(), dim=-1)
        self.steps.append(probs[:, self.digit_ids.to(probs.device)].cpu())
        return scores


@dataclass
class Generation:
    """One answer: ``tokens`` the generated ids (end-of-sequence included when reached), ``text`` their
    decoding without special tokens, ``digit_probs`` (len(tokens), 10): P(digit d) at each step."""

    tokens: list[int]
    text: str
    digit_probs: torch.Tensor


def digit_token_ids(tokenizer) -> list[int]:
    """The token of each digit 0–9 as the scripts find it: ``tokenizer.encode(str(d))[-1]``."""
    return [int(tokenizer.encode(str(d))[-1]) for d in range(10)]


@torch.inference_mode()
def generate(judge: VisionJudge, prompts: Sequence[str], images: Sequence[Image.Image], *, batch_size: int = 8,
             max_new_tokens: int = 512, pad_images: bool = True, logits_processor: Sequence = ()) -> list[Generation]:
    """Greedy answers to ``prompts`` (each with one ``<image>``) about ``images``, in batches.

    ``logits_processor``: extra processors run before the digit recorder (the recorded probabilities are
    those of the final scores, as the scripts' ``output_dict.scores``)."""
    from transformers import LogitsProcessorList

    if len(prompts) != len(images):
        raise CapscoreError(f"generate: {len(prompts)} prompts and {len(images)} images; expected one image per prompt")
    tok = judge.tokenizer
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    digits = digit_token_ids(tok)
    out: list[Generation] = []
    for s in range(0, len(prompts), batch_size):
        rows = [prompt_ids(judge, p) for p in prompts[s: s + batch_size]]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):  # left padding: every prompt ends where generation starts
            ids[i, width - len(r):] = torch.tensor(r)
            mask[i, width - len(r):] = 1
        pixels = pixel_values(judge, images[s: s + batch_size], pad=pad_images)
        recorder = DigitRecorder(digits)
        seqs = judge.model.generate(
            input_ids=ids.to(judge.device), attention_mask=mask.to(judge.device),
            pixel_values=pixels.to(judge.device, judge.dtype), do_sample=False, num_beams=1,
            max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad, use_cache=True,
            logits_processor=LogitsProcessorList([*logits_processor, recorder]))
        seqs = seqs.sequences if hasattr(seqs, "sequences") else seqs
        new = seqs[:, width:].cpu()
        probs = torch.stack(recorder.steps, dim=1) if recorder.steps else torch.zeros(len(rows), 0, 10)  # (B, T, 10)
        for i in range(len(rows)):
            toks = new[i].tolist()
            if eos in toks:
                toks = toks[: toks.index(eos) + 1]
            out.append(Generation(toks, tok.decode(toks, skip_special_tokens=True).strip(), probs[i, : len(toks)]))
    return out


__all__ = ["DigitRecorder", "Generation", "LLAVA_V1_SYSTEM", "VisionJudge", "digit_token_ids", "generate",
           "judge_from_parts", "llava_v1_prompt", "load_vlm", "pad_to_square", "pixel_values", "prompt_ids"]
