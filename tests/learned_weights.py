"""Test helpers: tiny random-weight checkpoints in the layouts the Polos and DENEB authors' code saves.

The layouts are written out here from the authors' modules (keio-smilab24/Polos ``PolosEstimator``,
Ka2ukiMatsuda/DENEB ``DenebEstimator``: their ``state_dict()`` key names and shapes), independently of
capscore's loaders, so a test that loads these files checks the loaders against the authors' layout.
Nothing is downloaded: the RoBERTa tokenizer is a byte-level BPE trained here on a few sentences with
the ``tokenizers`` library, the CLIP tower is the tests' ``capscore-test-tiny`` open_clip architecture.
"""
from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import torch

CORPUS = [
    "a dog runs on the grass", "two cats sleep on a red sofa", "a man rides a bike in the street",
    "a photo of a woman holding an umbrella", "children play football in a park", "the sun sets over the sea",
    "A photo depicts a small boat", "In the image, a bus drives past a tall building",
]


def roberta_folder(folder: Path, *, hidden: int = 32, layers: int = 2, heads: int = 4, inter: int = 64) -> Path:
    """A ``sup-simcse-roberta-base``-shaped folder: config.json + byte-level BPE vocab.json/merges.txt."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaConfig

    folder.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS * 4, vocab_size=400, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], show_progress=False)
    bpe.save_model(str(folder))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "RobertaTokenizer",
                                                              "model_max_length": 512}))
    vocab = json.loads((folder / "vocab.json").read_text())
    RobertaConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                  intermediate_size=inter, max_position_embeddings=66, type_vocab_size=1, pad_token_id=1,
                  bos_token_id=0, eos_token_id=2).save_pretrained(str(folder))
    return folder


def roberta_state(folder: Path, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random ``RobertaModel`` (with its pooler, as ``AutoModel.from_pretrained`` builds it)."""
    from transformers import AutoConfig, RobertaModel

    torch.manual_seed(seed)
    model = RobertaModel(AutoConfig.from_pretrained(str(folder)))
    with torch.no_grad():  # LayerNorms away from 1/0, so a wrong mapping shows
        for name, p in model.named_parameters():
            if "LayerNorm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return {k: v.clone() for k, v in model.state_dict().items()
            if k not in ("embeddings.position_ids", "embeddings.token_type_ids")}


def clip_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """capscore-test-tiny's random open_clip CLIP (OpenAI key layout; embed 32)."""
    import open_clip

    import capscore.backbones.openclip  # noqa: F401  (registers the tests' configs, $CAPSCORE_MODEL_CONFIGS)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        model = open_clip.create_model("capscore-test-tiny", pretrained=None)
    return {k: v.clone() for k, v in model.state_dict().items()}


def _linear(out_dim: int, in_dim: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    bound = 1 / math.sqrt(in_dim)
    return (torch.rand(out_dim, in_dim, generator=g) * 2 - 1) * bound, (torch.rand(out_dim, generator=g) * 2 - 1) * bound


def scalar_mix_state(n_layers: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """``ScalarMixWithDropout(mixture_size=n_layers, dropout=0.1)``: weights, gamma, dropout buffers."""
    sd = {f"scalar_mix.scalar_parameters.{k}": torch.randn(1, generator=g) for k in range(n_layers)}
    sd["scalar_mix.gamma"] = torch.tensor([1.0 + 0.5 * float(torch.rand(1, generator=g))])
    sd["scalar_mix.dropout_mask"] = torch.zeros(n_layers)
    sd["scalar_mix.dropout_fill"] = torch.full((n_layers,), -1e20)
    return sd


def feedforward_state(in_dim: int, hidden: list[int], g: torch.Generator) -> dict[str, torch.Tensor]:
    """``Sequential(FeedForward(in_dim, hidden_sizes), Sigmoid())``: ``ff.0.ff.linear_k.*``."""
    sizes = [in_dim, *hidden, 1]
    sd = {}
    for k in range(1, len(sizes)):
        w, b = _linear(sizes[k], sizes[k - 1], g)
        sd[f"ff.0.ff.linear_{k}.weight"], sd[f"ff.0.ff.linear_{k}.bias"] = w, b
    return sd


def polos_state(folder: Path, seed: int = 0, hidden: tuple[int, int] = (24, 12)) -> dict[str, torch.Tensor]:
    """``PolosEstimator.state_dict()``: encoder.model.*, scalar_mix.*, ff.0.ff.*, clip.*."""
    g = torch.Generator().manual_seed(seed)
    enc = roberta_state(folder, seed)
    clip = clip_state(seed + 1)
    d, e = enc["embeddings.word_embeddings.weight"].shape[1], clip["text_projection"].shape[1]
    n_layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"] + 1
    sd = {f"encoder.model.{k}": v for k, v in enc.items()}
    sd.update(scalar_mix_state(n_layers, g))
    sd.update(feedforward_state(4 * d + 6 * e, list(hidden), g))
    sd.update({f"clip.{k}": v for k, v in clip.items()})
    return sd


def positional_table(rows: int, d_model: int) -> torch.Tensor:
    """DENEB's ``PositionalEncoding.pe`` buffer: (rows, 1, d_model) sinusoids."""
    position = torch.arange(rows).unsqueeze(1)
    div = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
    pe = torch.zeros(rows, 1, d_model)
    pe[:, 0, 0::2] = torch.sin(position * div)
    pe[:, 0, 1::2] = torch.cos(position * div)
    return pe


def deneb_state(folder: Path, seed: int = 0, hidden: tuple[int, int] = (24, 12), pe_rows: int = 1000,
                ff_dim: int = 2048) -> dict[str, torch.Tensor]:
    """``DenebEstimator.state_dict()`` (CLIP width = RoBERTa width, as DENEB requires)."""
    g = torch.Generator().manual_seed(seed)
    enc = roberta_state(folder, seed)
    clip = clip_state(seed + 1)
    d = enc["embeddings.word_embeddings.weight"].shape[1]
    assert clip["text_projection"].shape[1] == d
    n_layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"] + 1
    sd = {f"encoder.model.{k}": v for k, v in enc.items()}
    sd.update(scalar_mix_state(n_layers, g))
    sd.update(feedforward_state(6 * d, list(hidden), g))
    for name in ("transformer", "transformer2"):
        torch.manual_seed(seed + (7 if name == "transformer" else 8))
        layer = torch.nn.TransformerEncoderLayer(d_model=2 * d, nhead=8, dim_feedforward=ff_dim, batch_first=True)
        enc_mod = torch.nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False)
        with torch.no_grad():
            for p in enc_mod.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
        sd.update({f"{name}.{k}": v.clone() for k, v in enc_mod.state_dict().items()})
    for name in ("upsampler", "upsampler2"):
        w, b = _linear(d, d, g)
        sd[f"{name}.weight"], sd[f"{name}.bias"] = w, b
    sd["pos_encoder.pe"] = positional_table(pe_rows, 2 * d)
    sd["pos_encoder2.pe"] = positional_table(pe_rows, 2 * d)
    sd["cls_token1"] = 0.1 * torch.randn(1, 1, 2 * d, generator=g)
    sd["cls_token2"] = 0.1 * torch.randn(1, 1, 2 * d, generator=g)
    sd.update({f"pacs_clip.{k}": v for k, v in clip.items()})
    return sd


def save_lightning(path: Path, sd: dict[str, torch.Tensor], hparams: dict) -> Path:
    """A checkpoint shaped as PyTorch Lightning 1.2 writes it (state_dict, hyper_parameters, callbacks keyed
    by class, optimizer states), the callback class pickled under its Lightning module name."""
    import sys
    import types

    names = ["pytorch_lightning", "pytorch_lightning.callbacks", "pytorch_lightning.callbacks.model_checkpoint"]
    mods = {n: types.ModuleType(n) for n in names}
    ModelCheckpoint = type("ModelCheckpoint", (), {"__module__": names[-1]})
    mods[names[-1]].ModelCheckpoint = ModelCheckpoint
    saved = {n: sys.modules.get(n) for n in names}
    sys.modules.update(mods)
    try:
        torch.save({"epoch": 3, "global_step": 120, "pytorch-lightning_version": "1.2.10", "state_dict": sd,
                    "callbacks": {ModelCheckpoint: {"monitor": "kendall", "best_model_score": torch.tensor(0.5)}},
                    "optimizer_states": [{"state": {}, "param_groups": [{"lr": 3e-5}]}], "lr_schedulers": [],
                    "hparams_name": "hparams", "hyper_parameters": dict(hparams)}, path)
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
    return path


POLOS_HPARAMS = {"model": "PolosEstimator", "encoder_model": "BERT", "pretrained_model": "princeton-nlp/sup-simcse-roberta-base",
                 "layer": "mix", "pool": "cls", "scalar_mix_dropout": 0.1, "dropout": 0.1, "activations": "Tanh",
                 "hidden_sizes": "24,12", "final_activation": False, "batch_size": 64}
DENEB_HPARAMS = {**POLOS_HPARAMS, "model": "DenebEstimator", "hidden_sizes": "24, 12", "loss": "huber"}


def weights_dir(root: Path, *, polos: bool = True, deneb: bool = False, seed: int = 0) -> Path:
    """``--metric-weights DIR`` with sup-simcse-roberta-base/ and polos/reprod.ckpt (and deneb/deneb.ckpt)."""
    folder = roberta_folder(root / "sup-simcse-roberta-base")
    if polos:
        (root / "polos").mkdir(parents=True, exist_ok=True)
        save_lightning(root / "polos" / "reprod.ckpt", polos_state(folder, seed), POLOS_HPARAMS)
    if deneb:
        (root / "deneb").mkdir(parents=True, exist_ok=True)
        save_lightning(root / "deneb" / "deneb.ckpt", deneb_state(folder, seed), DENEB_HPARAMS)
    return root


# ------------------------------------------------------------------------------------ a tiny LLaVA (the judges)
LLAVA_SYSTEM = ("A chat between a curious human and an artificial intelligence assistant. The assistant gives "
                "helpful, detailed, and polite answers to the human's questions.")
LLAVA_CORPUS = [
    LLAVA_SYSTEM, "USER: ASSISTANT: Your task is to evaluate and rate the caption candidate on a scale of 0.0 to 1.0",
    "based on the given Grading Criteria. (Print Real Number Score ONLY) Reference Captions Candidate Caption:",
    "The caption does not describe the image at all. accurately and clearly describes the image.",
    "Score(Choose a rating from 0.0 to 1.0): Why? Tell me the reason. a dog runs two cats sleep",
    "Evaluate the caption and assign a score Score (0.0~1.0): Provide a brief explanation",
    "Fluency: good\nRelevance: ok\nDescriptiveness: fine", "0 1 2 3 4 5 6 7 8 9 . abc"]


def llava_folder(folder: Path) -> Path:
    """A tiny LLaVA folder in the transformers layout: config + safetensors + tokenizer + image processor."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import (CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, PreTrainedTokenizerFast)

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    special = ["<unk>", "<s>", "</s>", "<pad>", "<image>"]
    tok.train_from_iterator(LLAVA_CORPUS * 3, trainers.BpeTrainer(vocab_size=300, special_tokens=special,
                                                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", additional_special_tokens=["<image>"])
    fast.save_pretrained(str(folder))
    text = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                       bos_token_id=1, eos_token_id=2, pad_token_id=3)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                              image_size=28, patch_size=14)
    cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_index=tok.token_to_id("<image>"),
                      vision_feature_layer=-2, vision_feature_select_strategy="default")
    torch.manual_seed(0)
    LlavaForConditionalGeneration(cfg).save_pretrained(str(folder))
    CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}).save_pretrained(str(folder))
    return folder
