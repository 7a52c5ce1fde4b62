"""mclip:DIR — a multilingual text student (tiny random BERT, WordPiece) + a CLIP image tower."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from capscore.backbones import load_backbone
from capscore.embed.engine import Encoder
from capscore.errors import CapscoreError

WORDS = ["a", "dog", "cat", "the", "on", "sofa", "un", "chien", "le", "chat", "sur", "canapé", "ein", "hund", "##s", "."]
TEXTS = ["a dog", "le chat sur le canapé .", "ein hund", "the cats on a sofa . a dog on the sofa", "un"]


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    from transformers import BertConfig, BertModel, BertTokenizer

    from capscore.backbones.multilingual import save_multilingual

    d = tmp_path_factory.mktemp("mclip")
    vocab = d / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer(str(vocab))
    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=len(WORDS) + 5, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=32, max_position_embeddings=40), add_pooling_layer=False).eval()
    projection = torch.nn.Linear(16, 32)
    folder = save_multilingual(d / "student", text_model=bert, tokenizer=tokenizer, projection=projection,
                               image_spec="capscore-test-tiny", image_seed=0)
    return dict(folder=folder, bert=bert, tokenizer=tokenizer, projection=projection)


def _load(spec, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_backbone(spec, **kw)


def test_text_vectors_are_masked_mean_then_projection(student):
    """Expected: each caption alone (no padding at all) -> mean of its token states -> projection."""
    bb = _load(f"mclip:{student['folder']}")
    assert bb.family == "mclip" and bb.embed_dim == 32 and bb.context_length == 40
    assert bb.pad_to_longest_exact and not bb.has_token_features
    expected = []
    with torch.no_grad():
        for t in TEXTS:
            ids = torch.tensor([student["tokenizer"](t)["input_ids"]])
            h = student["bert"](input_ids=ids).last_hidden_state[0]  # (L, 16), every position real
            expected.append(student["projection"](h.sum(0) / h.shape[0]))
    expected = F.normalize(torch.stack(expected), dim=-1)
    got = Encoder(bb, batch_size=2).encode_texts(TEXTS)  # batches padded to their longest caption
    assert (got - expected).abs().max() <= 1e-5


def test_padding_to_context_changes_nothing(student):
    bb = _load(f"mclip:{student['folder']}")
    ids = bb.tokenize(TEXTS)
    lengths = torch.tensor([len(r) for r in ids])
    short = torch.full((len(ids), int(lengths.max())), bb.pad_id)
    full = torch.full((len(ids), bb.context_length), bb.pad_id)
    for i, r in enumerate(ids):
        short[i, : len(r)] = torch.tensor(r)
        full[i, : len(r)] = torch.tensor(r)
    with torch.no_grad():
        a, _ = bb.forward_texts(short, lengths)
        b, _ = bb.forward_texts(full, lengths)
    assert (a - b).abs().max() <= 1e-5


def test_images_go_through_the_named_clip_tower(student, tmp_path):
    bb = _load(f"mclip:{student['folder']}")
    tower = _load("capscore-test-tiny", seed=0)
    rng = np.random.default_rng(2)
    paths = []
    for i in range(2):
        p = tmp_path / f"{i}.png"
        Image.fromarray((rng.random((40, 36, 3)) * 255).astype("uint8")).save(p)
        paths.append(p)
    with torch.no_grad():
        expected = F.normalize(tower.model.encode_image(torch.stack([tower.preprocess(Image.open(p).convert("RGB"))
                                                                     for p in paths])), dim=-1)
    assert (Encoder(bb).encode_images(paths) - expected).abs().max() <= 1e-5
    assert bb.has_patch_tokens == tower.has_patch_tokens


def test_folder_errors_name_the_folder(student, tmp_path):
    with pytest.raises(CapscoreError, match=r"nowhere: multilingual model folder not found"):
        load_backbone(f"mclip:{tmp_path / 'nowhere'}")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CapscoreError, match=r"empty: not a capscore multilingual folder \(no capscore_mclip.json\)"):
        load_backbone(f"mclip:{empty}")
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(student["folder"], bad)
    cfg = json.loads((bad / "capscore_mclip.json").read_text())
    (bad / "capscore_mclip.json").write_text(json.dumps({**cfg, "embed_dim": 64}))
    with pytest.raises(CapscoreError, match=r"joint-space widths disagree: projection 32, image tower 32, capscore_mclip.json 64"):
        _load(f"mclip:{bad}")
    (bad / "capscore_mclip.json").write_text(json.dumps({**cfg, "pooling": "max"}))
    with pytest.raises(CapscoreError, match=r"pooling must be one of mean, cls; got 'max'"):
        _load(f"mclip:{bad}")
    (bad / "capscore_mclip.json").write_text(json.dumps(cfg))
    (bad / "projection.safetensors").unlink()
    with pytest.raises(CapscoreError, match=r"bad: missing projection.safetensors"):
        _load(f"mclip:{bad}")
