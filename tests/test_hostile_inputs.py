"""Hostile inputs across every command: one line ``capscore: error: ...``, exit 2, no traceback.

Each case of :data:`ERROR_CASES` runs ``capscore.cli.main`` in-process (``-q``: no
warnings, so stderr must be exactly the error line) and checks that the line names
the file, line, option or item at fault and that no output file was left behind.
Cases that must *succeed* despite a hostile input (BOM, corrupt cache, --skip-bad
with a decompression bomb, 16-bit images...) are separate tests below, as are the
two-process tests (a real ``fcntl`` lock, one shared cache) which use subprocesses.
"""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import warnings
import zlib
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import capscore.backbones.openclip  # noqa: F401  (registers capscore-test-tiny)
from capscore.cli import main

MODEL = "capscore-test-tiny"
DEEP = "[" * 100_000 + "]" * 100_000
BIG_INT = "7" * 5000


# ------------------------------------------------------------------------------------ hostile files
def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def bomb_png(path: Path, width: int = 20000, height: int = 20000) -> Path:
    """A valid 1-bit grayscale PNG of width x height that is tiny on disk (all zeros compress to nothing)."""
    row = b"\x00" + b"\x00" * ((width + 7) // 8)
    comp = zlib.compressobj(9)
    data = b"".join(comp.compress(row) for _ in range(height)) + comp.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", data)
                     + _png_chunk(b"IEND", b""))
    return path


class _Evil:
    """Unpickling this would create the file ``marker``; weights_only=True must refuse it first."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    """The hostile world: good images and captions plus one bad file per case."""
    d = tmp_path_factory.mktemp("hostile")
    rng = np.random.default_rng(0)
    img = d / "images"
    img.mkdir()
    for i in range(3):
        Image.fromarray((rng.random((32, 32, 3)) * 255).astype("uint8")).save(img / f"im{i}.png")
    bad = d / "bad_images"
    bad.mkdir()
    bomb_png(bad / "bomb.png")
    bomb_png(bad / "strip.png", width=100_000, height=1)
    (bad / "trunc.png").write_bytes((img / "im0.png").read_bytes()[:60])
    (bad / "text.png").write_text("not an image")
    f = {}

    def put(name: str, content: str | bytes) -> Path:
        p = d / name
        p.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        f[name] = p
        return p

    put("good.json", json.dumps({"im0": "a red square", "im1": "a blue circle"}))
    put("good.jsonl", "".join(json.dumps({"image": f"im{i}.png", "caption": f"caption {i}"}) + "\n" for i in range(3)))
    put("empty.json", b"")
    put("empty.jsonl", b"")
    put("empty.csv", b"")
    put("unterminated.csv", 'image,caption\nim0.png,"a dog\nim1.png,a cat\nim2.png,a cow\n')
    put("deep.json", DEEP)
    put("deep.jsonl", '{"image": "im0.png", "caption": ' + DEEP + "}\n")
    put("bigint.jsonl", '{"image": "im0.png", "caption": ' + BIG_INT + "}\n")
    put("bigint.json", '{"im0": ' + BIG_INT + "}")
    put("latin1.jsonl", '{"image": "im0.png", "caption": "caf\xe9"}\n'.encode("latin-1"))
    put("missing_image.jsonl", json.dumps({"image": "nope.png", "caption": "x"}) + "\n")
    put("empty_caption.jsonl", json.dumps({"image": "im0.png", "caption": "  "}) + "\n")
    put("bomb.jsonl", json.dumps({"image": str(bad / "bomb.png"), "caption": "a bomb"}) + "\n")
    put("strip.jsonl", json.dumps({"image": str(bad / "strip.png"), "caption": "a strip"}) + "\n")
    put("trunc.jsonl", json.dumps({"image": str(bad / "trunc.png"), "caption": "cut"}) + "\n")
    put("text_image.jsonl", json.dumps({"image": str(bad / "text.png"), "caption": "x"}) + "\n")
    put("deep_refs.json", '{"im0": ' + DEEP + "}")
    put("manifest_unterminated.csv", 'id,path\nim0,"images/im0.png\nim1,images/im1.png\n')
    put("no_caption_col.csv", "image,text\nim0.png,x\n")
    # correlate
    put("scores.jsonl", "".join(json.dumps({"id": f"c{i}", "score": s}) + "\n" for i, s in enumerate([.1, .5, .3, .9])))
    put("scores_bigint.jsonl", json.dumps({"id": "c0", "score": 0.5}) + "\n" + '{"id": "c1", "score": ' + BIG_INT + "}\n")
    put("scores_hugeint.jsonl", json.dumps({"id": "c0", "score": int(BIG_INT[:4000])}) + "\n")
    put("human_unterminated.csv", 'id,score\nc0,1\nc1,"2\nc2,3\n')
    put("human_inf.csv", f"id,score\nc0,1\nc1,{'9' * 5000}\nc2,3\n")
    put("human_deep.json", DEEP)
    # train
    put("train_deep.jsonl", '{"image": "images/im0.png", "caption": ' + DEEP + "}\n")
    put("train_bigint.jsonl", '{"image": "images/im0.png", "caption": "ok", "x": ' + BIG_INT + "}\n")
    # probe
    put("probe_unterminated.csv", 'image,caption\nim0.png,"a dog\nim1.png,a cat\n')
    put("probe_deep.jsonl", '{"image": "im0.png", "caption": ' + DEEP + "}\n")
    put("probe_bigint.json", "[" + '{"image": "im0.png", "caption": ' + BIG_INT + "}]")
    put("a_file", "I am a file, not a folder\n")
    (d / "dir.jsonl").mkdir()
    # models: malicious pickles through every loader path, an mclip loop
    marker = d / "PWNED"
    torch.save({"w": torch.zeros(1), "x": _Evil(str(marker))}, d / "evil.pt")
    ld = d / "localdir"
    ld.mkdir()
    import open_clip

    (ld / "open_clip_config.json").write_text(json.dumps({"model_cfg": open_clip.get_model_config(MODEL),
                                                          "preprocess_cfg": {}}))
    torch.save({"x": _Evil(str(marker))}, ld / "open_clip_pytorch_model.bin")
    hf = d / "hfdir"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({
        "model_type": "clip", "projection_dim": 8,
        "text_config": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                        "vocab_size": 100, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 1},
        "vision_config": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                          "num_attention_heads": 2, "image_size": 32, "patch_size": 16}}))
    torch.save({"x": _Evil(str(marker))}, hf / "pytorch_model.bin")
    mc = d / "mclip_evil"
    mc.mkdir()
    from safetensors.torch import save_file

    (mc / "capscore_mclip.json").write_text(json.dumps({"image_spec": MODEL}))
    save_file({"weight": torch.zeros(32, 16)}, str(mc / "projection.safetensors"))
    (mc / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 1,
                                                "num_attention_heads": 2, "intermediate_size": 32,
                                                "vocab_size": 30}))
    torch.save({"x": _Evil(str(marker))}, mc / "pytorch_model.bin")
    loop = d / "mclip_loop"
    loop.mkdir()
    (loop / "capscore_mclip.json").write_text(json.dumps({"image_spec": f"mclip:{loop}"}))
    save_file({"weight": torch.zeros(32, 16)}, str(loop / "projection.safetensors"))
    (loop / "config.json").write_text((mc / "config.json").read_text())
    from transformers import BertConfig, BertModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        BertModel(BertConfig(**json.loads((mc / "config.json").read_text())), add_pooling_layer=False) \
            .save_pretrained(loop)
    (loop / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "dog"]) + "\n")
    (loop / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer"}))
    return {"d": d, "img": img, "bad": bad, "f": f, "marker": marker, "ld": ld, "hf": hf, "mc": mc, "loop": loop}


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    with warnings.catch_warnings():
        code = main(["-q", *[str(a) for a in argv]])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_error(code: int, err: str, *names: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err, err
    assert code == 2, (code, err)
    assert len(lines) == 1, err
    assert lines[0].startswith("capscore: error: "), lines[0]
    assert "this is a bug" not in lines[0], lines[0]
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def score(w, captions, *extra, out=None, images=None):
    out = out or (w["d"] / "out" / f"o{len(os.listdir(w['d']))}.jsonl")
    return ["score", "--model", MODEL, "--images", images or w["img"], "--captions", captions, "--out", out, *extra]


# ------------------------------------------------------------------------------------ the corpus
# (id, argv builder, strings the error line must contain); every case writes to OUT, which must not exist after.
ERROR_CASES = [
    # --- score: caption/reference/manifest parsers
    ("score-empty-json", lambda w, o: score(w, w["f"]["empty.json"], out=o), ["empty.json", "empty"]),
    ("score-empty-jsonl", lambda w, o: score(w, w["f"]["empty.jsonl"], out=o), ["empty.jsonl", "empty"]),
    ("score-empty-csv", lambda w, o: score(w, w["f"]["empty.csv"], out=o), ["empty.csv", "empty"]),
    ("score-csv-unterminated", lambda w, o: score(w, w["f"]["unterminated.csv"], out=o),
     ["unterminated.csv:2", "unterminated"]),
    ("score-csv-unterminated-skip-bad", lambda w, o: score(w, w["f"]["unterminated.csv"], "--skip-bad", out=o),
     ["unterminated.csv:2", "unterminated"]),
    ("score-json-deep", lambda w, o: score(w, w["f"]["deep.json"], out=o), ["deep.json", "nested too deeply"]),
    ("score-jsonl-deep", lambda w, o: score(w, w["f"]["deep.jsonl"], out=o), ["deep.jsonl:1", "nested too deeply"]),
    ("score-jsonl-bigint", lambda w, o: score(w, w["f"]["bigint.jsonl"], out=o), ["bigint.jsonl:1", "4300 digits"]),
    ("score-json-bigint", lambda w, o: score(w, w["f"]["bigint.json"], out=o), ["bigint.json", "4300 digits"]),
    ("score-not-utf8", lambda w, o: score(w, w["f"]["latin1.jsonl"], out=o), ["latin1.jsonl:1", "UTF-8"]),
    ("score-no-caption-column", lambda w, o: score(w, w["f"]["no_caption_col.csv"], out=o),
     ["no_caption_col.csv:1", "caption"]),
    ("score-refs-deep", lambda w, o: score(w, w["f"]["good.json"], "--refs", w["f"]["deep_refs.json"],
                                           "--metric", "refclip-s", out=o), ["deep_refs.json", "nested too deeply"]),
    ("score-manifest-unterminated", lambda w, o: score(w, w["f"]["good.jsonl"], out=o,
                                                       images=w["f"]["manifest_unterminated.csv"]),
     ["manifest_unterminated.csv:2", "unterminated"]),
    ("score-captions-missing", lambda w, o: score(w, w["d"] / "nope.jsonl", out=o), ["nope.jsonl", "not found"]),
    ("score-images-missing", lambda w, o: score(w, w["f"]["good.json"], out=o, images=w["d"] / "noimg"),
     ["noimg", "not found"]),
    # --- score: bad items (fatal without --skip-bad)
    ("score-image-missing", lambda w, o: score(w, w["f"]["missing_image.jsonl"], out=o), ["nope.png", "not found"]),
    ("score-empty-caption", lambda w, o: score(w, w["f"]["empty_caption.jsonl"], out=o),
     ["empty_caption.jsonl:1", "empty"]),
    ("score-decompression-bomb", lambda w, o: score(w, w["f"]["bomb.jsonl"], out=o), ["bomb.png", "megapixel limit"]),
    ("score-aspect-strip", lambda w, o: score(w, w["f"]["strip.jsonl"], out=o), ["strip.png", "aspect ratio"]),
    ("score-truncated-image", lambda w, o: score(w, w["f"]["trunc.jsonl"], out=o), ["trunc.png"]),
    ("score-text-as-image", lambda w, o: score(w, w["f"]["text_image.jsonl"], out=o), ["text.png", "not an image"]),
    # --- score: options and outputs
    ("score-batch-size-0", lambda w, o: score(w, w["f"]["good.json"], "--batch-size", "0", out=o),
     ["--batch-size", "positive"]),
    ("score-chunk-size-neg", lambda w, o: score(w, w["f"]["good.json"], "--chunk-size", "-3", out=o),
     ["--chunk-size", "positive"]),
    ("score-context-length-0", lambda w, o: score(w, w["f"]["good.json"], "--context-length", "0", out=o),
     ["--context-length"]),
    ("score-device-nonsense", lambda w, o: score(w, w["f"]["good.json"], "--device", "nonsense", out=o),
     ["nonsense", "available here: cpu"]),
    ("score-device-cuda-9", lambda w, o: score(w, w["f"]["good.json"], "--device", "cuda:9", out=o),
     ["cuda:9", "available here: cpu"]),
    ("score-dtype-bad", lambda w, o: score(w, w["f"]["good.json"], "--dtype", "fp8", out=o), ["--dtype", "fp8"]),
    ("score-out-suffix", lambda w, o: score(w, w["f"]["good.json"], out=o.with_suffix(".txt")), [".txt"]),
    ("score-out-is-folder", lambda w, o: score(w, w["f"]["good.json"], out=w["d"] / "dir.jsonl"),
     ["dir.jsonl", "is a folder"]),
    ("score-out-is-input-overwrite", lambda w, o: score(w, w["f"]["good.jsonl"], "--overwrite",
                                                        out=w["f"]["good.jsonl"]), ["good.jsonl", "--captions input"]),
    ("score-out-parent-is-file", lambda w, o: score(w, w["f"]["good.json"], out=w["f"]["a_file"] / "o.jsonl"),
     ["a_file"]),
    ("score-out-sysfs", lambda w, o: score(w, w["f"]["good.json"], out=Path("/sys/capscore-test/o.jsonl")),
     ["/sys/capscore-test"]),
    ("score-resume-and-overwrite", lambda w, o: score(w, w["f"]["good.json"], "--resume", "--overwrite", out=o),
     ["--resume and --overwrite"]),
    ("score-duplicate-stems", lambda w, o: score(w, w["f"]["good.json"], out=o)[:-2]
     + [w["f"]["good.jsonl"], "--out", o], ["named 'good'"]),
    # --- score: models
    ("model-missing-ckpt", lambda w, o: score(w, w["f"]["good.json"], out=o)[:1] + ["--model", "ckpt:/no/such.pt"]
     + score(w, w["f"]["good.json"], out=o)[3:], ["/no/such.pt", "not found"]),
    ("model-unknown-arch", lambda w, o: _model(w, o, "ViT-Q-99"), ["ViT-Q-99"]),
    ("model-pickle-arch-path", lambda w, o: _model(w, o, f"{MODEL}/{w['d'] / 'evil.pt'}"),
     ["evil.pt", "pickled Python objects"]),
    ("model-pickle-ckpt", lambda w, o: _model(w, o, f"ckpt:{w['d'] / 'evil.pt'}"), ["evil.pt", "pickled"]),
    ("model-pickle-local-dir", lambda w, o: _model(w, o, f"local-dir:{w['ld']}"),
     ["open_clip_pytorch_model.bin", "pickled"]),
    ("model-pickle-hf-bin", lambda w, o: _model(w, o, f"hf:{w['hf']}"), ["hfdir/pytorch_model.bin", "pickled"]),
    ("model-pickle-mclip", lambda w, o: _model(w, o, f"mclip:{w['mc']}"), ["mclip_evil/pytorch_model.bin", "pickled"]),
    ("model-mclip-loop", lambda w, o: _model(w, o, f"mclip:{w['loop']}"), ["mclip_loop", "loop"]),
    ("model-offline-tag", lambda w, o: _model(w, o, "ViT-B-32/openai"), ["ViT-B-32/openai", "not in the local cache",
                                                                          "huggingface/hub"]),
    ("model-offline-hf-hub", lambda w, o: _model(w, o, "hf-hub:someorg/missing"),
     ["hf-hub:someorg/missing", "not in the local cache"]),
    ("model-offline-hf", lambda w, o: _model(w, o, "hf:someorg/missing"), ["hf:someorg/missing", "HF_HOME"]),
    # --- probe
    ("probe-n-scenes-0", lambda w, o: ["probe", "--model", MODEL, "--suite", "scenes-flips", "--n-scenes", "0",
                                       "--out", o], ["--n-scenes", "positive"]),
    ("probe-batch-size-0", lambda w, o: ["probe", "--model", MODEL, "--suite", "perturb", "--data",
                                         w["f"]["good.jsonl"], "--batch-size", "0", "--out", o], ["--batch-size"]),
    ("probe-p-out-of-range", lambda w, o: ["probe", "--model", MODEL, "--suite", "perturb", "--data",
                                           w["f"]["good.jsonl"], "--p", "1.5", "--out", o], ["--p", "[0, 1]"]),
    ("probe-out-is-file", lambda w, o: ["probe", "--model", MODEL, "--suite", "perturb", "--data",
                                        w["f"]["good.jsonl"], "--images", w["img"], "--out", w["f"]["a_file"]],
     ["a_file", "existing file"]),
    ("probe-unknown-suite", lambda w, o: ["probe", "--model", MODEL, "--suite", "sugarcrepes", "--data",
                                          w["f"]["good.jsonl"], "--out", o], ["sugarcrepes", "did you mean"]),
    ("probe-csv-unterminated", lambda w, o: ["probe", "--model", MODEL, "--suite", "perturb", "--data",
                                             w["f"]["probe_unterminated.csv"], "--images", w["img"], "--out", o],
     ["probe_unterminated.csv:2", "unterminated"]),
    ("probe-jsonl-deep", lambda w, o: ["probe", "--model", MODEL, "--suite", "perturb", "--data",
                                       w["f"]["probe_deep.jsonl"], "--images", w["img"], "--out", o],
     ["probe_deep.jsonl:1", "nested too deeply"]),
    ("probe-json-bigint", lambda w, o: ["probe", "--model", MODEL, "--suite", "lgip", "--data",
                                        w["f"]["probe_bigint.json"], "--images", w["img"], "--out", o],
     ["probe_bigint.json:1", "4300 digits"]),
    ("probe-device-nonsense", lambda w, o: ["probe", "--model", MODEL, "--suite", "perturb", "--data",
                                            w["f"]["good.jsonl"], "--images", w["img"], "--device", "gpu0",
                                            "--out", o], ["gpu0", "available here"]),
    # --- correlate
    ("correlate-human-unterminated", lambda w, o: ["correlate", "--scores", w["f"]["scores.jsonl"], "--human",
                                                   w["f"]["human_unterminated.csv"], "--out", o],
     ["human_unterminated.csv:3", "unterminated"]),
    ("correlate-human-inf", lambda w, o: ["correlate", "--scores", w["f"]["scores.jsonl"], "--human",
                                          w["f"]["human_inf.csv"], "--out", o], ["human_inf.csv:3", "infinite"]),
    ("correlate-human-deep", lambda w, o: ["correlate", "--scores", w["f"]["scores.jsonl"], "--human",
                                           w["f"]["human_deep.json"], "--out", o],
     ["human_deep.json", "nested too deeply"]),
    ("correlate-scores-bigint", lambda w, o: ["correlate", "--scores", w["f"]["scores_bigint.jsonl"], "--human",
                                              w["f"]["scores.jsonl"], "--out", o],
     ["scores_bigint.jsonl:2", "4300 digits"]),
    ("correlate-scores-hugeint", lambda w, o: ["correlate", "--scores", w["f"]["scores_hugeint.jsonl"], "--human",
                                               w["f"]["scores.jsonl"], "--out", o], ["scores_hugeint.jsonl:1", "too large"]),
    ("correlate-out-is-file", lambda w, o: ["correlate", "--scores", w["f"]["scores.jsonl"], "--human",
                                            w["f"]["scores.jsonl"], "--out", w["f"]["a_file"]],
     ["a_file", "existing file"]),
    ("correlate-bootstrap-neg", lambda w, o: ["correlate", "--scores", w["f"]["scores.jsonl"], "--human",
                                              w["f"]["scores.jsonl"], "--bootstrap", "-1"], ["--bootstrap"]),
    ("correlate-export-over-input", lambda w, o: ["correlate", "--dataset", "flickr8k-expert", "--path",
                                                  w["f"]["scores.jsonl"], "--export-items", w["f"]["scores.jsonl"]],
     ["scores.jsonl", "--path input"]),
    # --- train
    ("train-batch-size-0", lambda w, o: ["train", "contrastive", "--model", MODEL, "--batch-size", "0", "--out", o],
     ["--batch-size", "positive"]),
    ("train-lr-negative", lambda w, o: ["train", "contrastive", "--model", MODEL, "--lr", "-0.001", "--out", o],
     ["--lr", "> 0"]),
    ("train-lr-nan", lambda w, o: ["train", "contrastive", "--model", MODEL, "--lr", "nan", "--out", o],
     ["--lr", "finite"]),
    ("train-accum-0", lambda w, o: ["train", "contrastive", "--model", MODEL, "--accum", "0", "--out", o],
     ["--accum", "positive"]),
    ("train-steps-0", lambda w, o: ["train", "contrastive", "--model", MODEL, "--steps", "0", "--out", o],
     ["--steps"]),
    ("train-device-cuda", lambda w, o: ["train", "contrastive", "--model", MODEL, "--data", "scenes:4",
                                        "--batch-size", "2", "--device", "cuda:7", "--eval-scenes", "0",
                                        "--out", o],
     ["cuda:7", "available here"]),
    ("train-out-is-file", lambda w, o: ["train", "contrastive", "--model", MODEL, "--out", w["f"]["a_file"]],
     ["a_file", "existing file"]),
    ("train-data-deep", lambda w, o: ["train", "contrastive", "--model", MODEL, "--data", w["f"]["train_deep.jsonl"],
                                      "--out", o], ["train_deep.jsonl:1", "nested too deeply"]),
    ("train-data-bigint", lambda w, o: ["train", "contrastive", "--model", MODEL, "--data",
                                        w["f"]["train_bigint.jsonl"], "--out", o], ["train_bigint.jsonl:1", "4300"]),
    ("train-data-scenes-bad", lambda w, o: ["train", "contrastive", "--model", MODEL, "--data", "scenes:many",
                                            "--out", o], ["scenes:many"]),
    # --- scenes
    ("scenes-generate-n-0", lambda w, o: ["scenes", "generate", "--n", "0", "--out", o], ["--n", "positive"]),
    ("scenes-generate-out-file", lambda w, o: ["scenes", "generate", "--n", "1", "--out", w["f"]["a_file"]],
     ["a_file", "existing file"]),
    ("scenes-train-removed", lambda w, o: ["scenes", "train", "--out", o], ["train"]),
    ("train-scenes-tiny-lr-0", lambda w, o: ["train", "scenes-tiny", "--lr", "0", "--out", o], ["--lr"]),
    ("scenes-eval-n-0", lambda w, o: ["scenes", "eval", "--n", "0", "--out", o], ["--n"]),
    ("scenes-eval-out-folder", lambda w, o: ["scenes", "eval", "--model", MODEL, "--n", "2", "--out", w["img"]],
     ["images", "is a folder"]),
    # --- demo
    ("demo-n-0", lambda w, o: ["demo", "--n", "0", "--out", o], ["--n", "positive"]),
    ("demo-out-is-file", lambda w, o: ["demo", "--n", "2", "--out", w["f"]["a_file"]], ["a_file", "existing file"]),
    ("demo-model-bad", lambda w, o: ["demo", "--n", "2", "--model", "ckpt:/no/model.pt", "--out", o],
     ["/no/model.pt"]),
    # --- explain
    ("explain-k-0", lambda w, o: ["explain", "--model", MODEL, "--image", w["img"] / "im0.png", "--caption", "a dog",
                                  "--word", "dog", "--k", "0", "--out", o], ["--k", "positive"]),
    ("explain-bomb", lambda w, o: ["explain", "--model", MODEL, "--image", w["bad"] / "bomb.png", "--caption",
                                   "a dog", "--word", "dog", "--out", o.with_suffix(".png")], ["bomb.png", "megapixel limit"]),
    ("explain-image-missing", lambda w, o: ["explain", "--model", MODEL, "--image", w["d"] / "none.png", "--caption",
                                            "a dog", "--word", "dog", "--out", o.with_suffix(".png")], ["none.png"]),
    # --- the command line itself
    ("cli-unknown-command", lambda w, o: ["scoer"], ["scoer"]),
    ("cli-missing-required", lambda w, o: ["score", "--images", w["img"]], ["--out"]),
    ("cli-missing-captions", lambda w, o: ["score", "--images", w["img"], "--out", o], ["--captions"]),
]


def _model(w, out, spec):
    return ["score", "--model", spec, "--images", w["img"], "--captions", w["f"]["good.json"], "--out", out]


@pytest.mark.parametrize("case", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_hostile_input_is_one_line_exit_2(case, w, tmp_path, capsys, monkeypatch):
    name, build, must_name = case
    monkeypatch.setattr("capscore.backbones.offline.hub_reachable", lambda *a, **k: False)  # never the network
    out = tmp_path / "o" / "out.jsonl"
    if name == "score-out-sysfs" and (not Path("/sys").is_dir() or os.access("/sys", os.W_OK | os.X_OK)
                                      and _sys_writable()):
        pytest.skip("needs a read-only /sys")
    if name == "score-device-cuda-9" and torch.cuda.device_count() > 9:
        pytest.skip("has 10 GPUs")
    if name == "train-device-cuda" and torch.cuda.device_count() > 7:
        pytest.skip("has 8 GPUs")
    before = sorted(p.name for p in w["d"].iterdir())
    captions_before = w["f"]["good.jsonl"].read_bytes()
    code, _, err = run(build(w, out), capsys)
    assert_one_error(code, err, *must_name)
    assert not out.exists() and not out.with_suffix(".png").exists(), "an output file was left behind"
    assert not w["marker"].exists(), "a pickle payload ran"
    assert w["f"]["good.jsonl"].read_bytes() == captions_before
    assert sorted(p.name for p in w["d"].iterdir()) == before  # nothing half-written next to the inputs


def _sys_writable() -> bool:
    try:
        Path("/sys/capscore-probe").mkdir()
    except OSError:
        return False
    Path("/sys/capscore-probe").rmdir()
    return True


def test_offline_weights_fail_fast_without_retries(w, tmp_path, capsys, monkeypatch):
    """No network and nothing cached: one line within seconds, not a minute of retries (hub check stubbed)."""
    import time

    calls = []
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr("socket.create_connection", lambda *a, **k: calls.append(a) or (_ for _ in ()).throw(
        OSError("Name or service not known")))
    t0 = time.perf_counter()
    code, _, err = run(_model(w, tmp_path / "o.jsonl", "ViT-B-32/openai"), capsys)
    assert_one_error(code, err, "ViT-B-32/openai", "cannot be reached", "ViT-B-32/PATH/TO/weights.safetensors")
    assert len(calls) == 1 and time.perf_counter() - t0 < 10


# ------------------------------------------------------------------------------------ hostile but fine
def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]


def test_bomb_and_strip_with_skip_bad_are_error_rows(w, tmp_path, capsys):
    caps = tmp_path / "mixed.jsonl"
    caps.write_text("".join(json.dumps(r) + "\n" for r in [
        {"image": "im0.png", "caption": "a red square"},
        {"image": str(w["bad"] / "bomb.png"), "caption": "a bomb"},
        {"image": str(w["bad"] / "strip.png"), "caption": "a strip"}]))
    out = tmp_path / "rows.jsonl"
    code, _, err = run(score(w, caps, "--skip-bad", out=out), capsys)
    assert code == 0 and "Traceback" not in err
    rows = read_jsonl(out)
    assert [r["score"] is None for r in rows] == [False, True, True]
    assert "bomb.png" in rows[1]["error"] and "megapixel limit" in rows[1]["error"]
    assert "strip.png" in rows[2]["error"] and "aspect ratio" in rows[2]["error"]
    assert rows[0]["model"] == MODEL and rows[0]["metric"] == "clip-s"


def test_16bit_and_float_images_score_like_their_8bit_original(tmp_path, capsys):
    """Same picture saved as 8-bit PNG, 16-bit grayscale PNG and 32-bit float TIFF: same score (value-range
    conversion; PIL's convert('RGB') would clip the 16-bit one to white)."""
    rng = np.random.default_rng(3)
    gray8 = (rng.random((40, 40)) * 255).astype(np.uint8)
    img = tmp_path / "imgs"
    img.mkdir()
    Image.fromarray(gray8).save(img / "g8.png")
    Image.fromarray(gray8.astype(np.uint16) * 257).save(img / "g16.png")
    Image.fromarray(gray8.astype(np.float32) / 255.0).save(img / "gf.tiff")
    assert Image.open(img / "g16.png").mode.startswith("I") and Image.open(img / "gf.tiff").mode == "F"
    caps = tmp_path / "c.json"
    caps.write_text(json.dumps({"g8": "a gray picture", "g16": "a gray picture", "gf": "a gray picture"}))
    out = tmp_path / "s.jsonl"
    code, _, err = run(["score", "--model", MODEL, "--images", img, "--captions", caps, "--out", out, "--no-cache"],
                       capsys)
    assert code == 0, err
    s = {r["id"]: r["score"] for r in read_jsonl(out)}
    assert s["g16"] == pytest.approx(s["g8"], abs=1e-4) and s["gf"] == pytest.approx(s["g8"], abs=1e-4)
    # and a clipped conversion would have been far off: white vs the picture
    white = Image.fromarray(np.full((40, 40), 255, np.uint8))
    white.save(img / "white.png")
    caps.write_text(json.dumps({"white": "a gray picture"}))
    run(["score", "--model", MODEL, "--images", img, "--captions", caps, "--out", tmp_path / "w.jsonl",
         "--no-cache"], capsys)
    assert abs(read_jsonl(tmp_path / "w.jsonl")[0]["score"] - s["g8"]) > 1e-3


def test_out_of_range_float_image_is_refused(tmp_path):
    from capscore.data.images import ImageRef
    from capscore.errors import InputError

    p = tmp_path / "hdr.tiff"
    Image.fromarray(np.full((8, 8), 1000.0, np.float32)).save(p)
    with pytest.raises(InputError, match=r"hdr\.tiff: float image values span \[1000, 1000\]"):
        ImageRef.of(p).load()


def test_human_csv_with_bom_is_accepted(w, tmp_path, capsys):
    human = tmp_path / "human.csv"
    human.write_bytes("\ufeffid,score\nc0,1\nc1,4\nc2,2\nc3,5\n".encode("utf-8"))
    code, out, err = run(["correlate", "--scores", w["f"]["scores.jsonl"], "--human", human, "--bootstrap", "0",
                          "--stats", "pearson"], capsys)
    assert code == 0, err
    from scipy.stats import pearsonr

    r = pearsonr([.1, .5, .3, .9], [1, 4, 2, 5]).statistic
    assert f"{100 * r:.1f}" in out


def test_cache_dir_named_like_the_database_and_corrupt_cache(w, tmp_path, capsys):
    named = tmp_path / "embeddings.sqlite"
    named.mkdir()
    code, _, err = run(score(w, w["f"]["good.json"], "--cache-dir", named, out=tmp_path / "a.jsonl"), capsys)
    assert code == 0, err
    assert (named / "embeddings.sqlite").is_file()
    good = read_jsonl(tmp_path / "a.jsonl")
    corrupt = tmp_path / "c"
    corrupt.mkdir()
    (corrupt / "embeddings.sqlite").write_bytes(b"this is not a database, just junk bytes" * 100)
    with warnings.catch_warnings(record=True) as rec:
        code = main([str(a) for a in score(w, w["f"]["good.json"], "--cache-dir", corrupt,
                                           out=tmp_path / "b.jsonl")])
    # the CLI prints CapscoreWarnings itself (above any progress bar); other runners may record them
    err = "\n".join(str(r.message) for r in rec) + capsys.readouterr().err
    assert code == 0, err
    assert "corrupt" in err and "moved it to embeddings.sqlite.corrupt-" in err
    assert [r["score"] for r in read_jsonl(tmp_path / "b.jsonl")] == [r["score"] for r in good]
    assert len(list(corrupt.glob("embeddings.sqlite.corrupt-*"))) == 1
    assert sqlite3.connect(corrupt / "embeddings.sqlite").execute("SELECT COUNT(*) FROM emb").fetchone()[0] == 4


@pytest.mark.parametrize("change", [("--metric", "pac-s", "metric"), ("--model", f"openclip:{MODEL}", "model")])
def test_resume_refuses_other_metric_or_model_when_the_summary_is_lost(w, tmp_path, capsys, change):
    out = tmp_path / "r.jsonl"
    code, _, err = run(score(w, w["f"]["good.jsonl"], "--chunk-size", "1", out=out), capsys)
    assert code == 0, err
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:2]) + "\n")  # as if interrupted after two rows ...
    (tmp_path / "r.jsonl.summary.json").unlink()  # ... and the summary lost
    flag, value, key = change
    argv = score(w, w["f"]["good.jsonl"], "--resume", out=out)
    if flag == "--metric":
        argv += ["--metric", value]
    else:
        argv[argv.index("--model") + 1] = value
    code, _, err = run(argv, capsys)
    assert_one_error(code, err, "--resume", f"row 1 of {out}", key)
    assert out.read_text() == "\n".join(lines[:2]) + "\n"  # untouched


def test_truncation_and_metric_fit_warnings_come_once(w, tmp_path, capsys):
    long = " ".join(["word"] * 120)
    caps = tmp_path / "long.jsonl"
    caps.write_text("".join(json.dumps({"image": f"im{i % 3}.png", "caption": f"{long} {i}"}) + "\n"
                            for i in range(6)))
    warnings.onceregistry.clear()
    with warnings.catch_warnings(record=True) as rec:  # main() installs its "once" filter inside
        code = main([str(a) for a in score(w, caps, "--chunk-size", "2", "--metric", "pac-s", "--no-cache",
                                           out=tmp_path / "t.jsonl")])
    err = "\n".join(str(r.message) for r in rec) + capsys.readouterr().err  # recorded or printed by the CLI
    assert code == 0, err
    assert err.count("truncated") == 1, err  # 3 chunks, one warning
    assert err.count("metric pac-s uses w=2.0") == 1 and MODEL in err
    assert json.loads((tmp_path / "t.jsonl.summary.json").read_text())["truncated_captions"] == 6


def test_mcs_on_a_monolingual_model_warns_by_name(w, tmp_path, capsys):
    warnings.onceregistry.clear()
    with warnings.catch_warnings(record=True) as rec:
        code = main([str(a) for a in score(w, w["f"]["good.json"], "--metric", "mcs", out=tmp_path / "m.jsonl")])
    err = "\n".join(str(r.message) for r in rec) + capsys.readouterr().err  # recorded or printed by the CLI
    assert code == 0 and err.count("metric mcs expects a multilingual backbone") == 1 and MODEL in err


def test_zero_bytes_and_whitespace_only_captions(w, tmp_path, capsys):
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n  \n\n")
    code, _, err = run(score(w, blank, out=tmp_path / "x.jsonl"), capsys)
    assert_one_error(code, err, "blank.jsonl", "no captions")
    assert not (tmp_path / "x.jsonl").exists() and not (tmp_path / "x.jsonl.summary.json").exists()


def test_train_resume_repairs_a_half_written_log_line(tmp_path, capsys):
    out = tmp_path / "run"
    base = ["train", "contrastive", "--model", MODEL, "--data", "scenes:8", "--steps", "2", "--batch-size", "4",
            "--eval-scenes", "0", "--ckpt-every", "1", "--out", out]
    code, _, err = run(base, capsys)
    assert code == 0, err
    log = out / "log.jsonl"
    full = log.read_text().splitlines()
    import shutil

    shutil.rmtree(out / "checkpoints" / "step-000002")  # interrupted after step 1 ...
    log.write_text("\n".join(full) + '\n{"step": 2, "lo')  # ... while writing a log line
    code, _, err = run([*base, "--resume"], capsys)
    assert code == 0, err
    lines = log.read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [json.loads(x)["step"] for x in full]


def test_debug_shows_the_traceback_of_a_bug_and_the_guard_hides_it(w, capsys, monkeypatch):
    import capscore.commands.models as m

    monkeypatch.setattr(m, "run", lambda args: 1 / 0)
    code = main(["models"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert err.strip() == ("capscore: error: ZeroDivisionError: division by zero (this is a bug in capscore; re-run "
                           "with --debug for the traceback and report it)")
    code = main(["--debug", "models"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" in err and "ZeroDivisionError" in err


# ------------------------------------------------------------------------------------ two processes
def _env():
    src = str(Path(__file__).resolve().parents[1] / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def test_a_second_writer_of_the_same_output_is_refused(w, tmp_path, capsys):
    """The lock is an OS lock (flock on a separate open file, so it holds within one process too): while
    another writer holds it, a plain run and a --resume both get one line and write nothing."""
    from capscore.report.writers import OutputLock

    out = tmp_path / "shared.jsonl"
    held = OutputLock(out)
    try:
        for extra in ([], ["--resume"]):
            code, _, err = run(score(w, w["f"]["good.json"], *extra, out=out), capsys)
            assert_one_error(code, err, str(out), "another capscore process")
            assert not out.exists()
    finally:
        held.release()
    assert not Path(str(out) + ".lock").exists()
    code, _, err = run(score(w, w["f"]["good.json"], out=out), capsys)  # released: the next run works
    assert code == 0, err
    run_dir = tmp_path / "train_run"
    run_dir.mkdir()
    held = OutputLock(run_dir / "log.jsonl")  # and two trainings into one folder
    try:
        code, _, err = run(["train", "contrastive", "--model", MODEL, "--data", "scenes:4", "--steps", "1",
                            "--batch-size", "2", "--eval-scenes", "0", "--out", run_dir], capsys)
        assert_one_error(code, err, "train_run/log.jsonl", "another capscore process")
        assert not (run_dir / "checkpoints").exists()
    finally:
        held.release()


def test_three_processes_two_on_one_output_all_on_one_cache(w, tmp_path):
    """Real processes at once: two write the same --out (exactly one does, the other gets one line), a third
    writes elsewhere through the same --cache-dir; every finished output equals a cache-less run, with no
    duplicated or missing row."""
    caps = tmp_path / "many.jsonl"
    caps.write_text("".join(json.dumps({"image": f"im{i % 3}.png", "caption": f"caption number {i}"}) + "\n"
                            for i in range(60)))
    cache = tmp_path / "cache"
    same, other = tmp_path / "same.jsonl", tmp_path / "other.jsonl"
    cmd = lambda o: [sys.executable, "-m", "capscore.cli", "-q", *map(str, score(  # noqa: E731
        w, caps, "--cache-dir", cache, "--chunk-size", "1", "--batch-size", "1", out=o))]
    procs = [subprocess.Popen(cmd(o), stderr=subprocess.PIPE, text=True, env=_env()) for o in (same, same, other)]
    results = [(p.wait(timeout=400), p.stderr.read()) for p in procs]
    assert sorted(c for c, _ in results[:2]) == [0, 2] and results[2][0] == 0, results
    refused = next(e for c, e in results[:2] if c == 2)
    # overlapping: the lock refuses; if the first had already finished: the finished output is not clobbered
    line = assert_one_error(2, refused, str(same))
    assert "another capscore process" in line or "already exists" in line
    ref = tmp_path / "ref.jsonl"
    with warnings.catch_warnings():
        assert main(["-q", *map(str, score(w, caps, "--no-cache", out=ref))]) == 0
    want = [r["score"] for r in read_jsonl(ref)]
    for o in (same, other):
        rows = read_jsonl(o)
        assert [r["id"] for r in rows] == [str(i) for i in range(1, 61)]  # no duplicate, none lost
        assert [r["score"] for r in rows] == pytest.approx(want, abs=1e-6)
    assert not Path(str(same) + ".lock").exists()


def test_four_items_with_bootstrap_give_a_table_not_a_crash(w, capsys):
    """Bootstrap resamples of 4 items are often constant; 1 - R² must then be undefined, not a ValueError."""
    code, out, err = run(["correlate", "--scores", w["f"]["scores.jsonl"], "--human", w["f"]["scores.jsonl"]], capsys)
    assert code == 0, err
    row = next(ln for ln in out.splitlines() if ln.startswith("scores.jsonl:score"))
    assert row.split()[2:7] == ["100.0", "100.0", "100.0", "100.0", "0.0"]  # identical scores: perfect agreement
