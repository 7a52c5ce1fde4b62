"""Training recipes that cannot train: refused with one line and exit 2, or stopped when they diverge.

Recipe files (TOML) and ``--set``/flag values are checked where they are read: numbers must be finite
and in range, stage names are plain file names, ``{NAME}`` references are well formed. A run whose
loss, gradient norm or weights stop being finite stops at that step with one line and exit 2; the
checkpoints written before it stay, nothing of the bad step is saved and no model is exported.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from capscore.errors import CapscoreError
from capscore.train.spec import STAGE_NAME, load_recipe_file
from test_hostile_inputs import assert_one_error, run  # one-line error checks, shared

TINY = "openclip:scenes-tiny-v1"  # random init from the seed: no weights file needed


def recipe_file(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "r.toml"
    f.write_text(text)
    return f


TRAIN = f'[train]\nmodel = "{TINY}"\ndata = "scenes:8"\nsteps = 3\nbatch_size = 4\neval_scenes = 0\n'
# (id, recipe file text, strings the error must contain)
FILE_CASES = [
    ("lr-inf", 'recipe = "contrastive"\n' + TRAIN + "lr = inf\n", ["r.toml", "'lr'", "finite", "inf"]),
    ("lr-nan", 'recipe = "contrastive"\n' + TRAIN + "lr = nan\n", ["'lr'", "nan"]),
    ("loss-weight-inf", 'recipe = "pacs"\n' + TRAIN + "[params]\nlambda_v = inf\n", ["'lambda_v'", "finite"]),
    ("specs-beta-neg-inf", 'recipe = "specs"\n' + TRAIN + "[params]\nbeta = -inf\n", ["'beta'"]),
    ("prmcs-margin-inf", 'recipe = "prmcs"\n' + TRAIN + "[params]\nmargin = inf\n", ["'margin'", "finite"]),
    ("negative-weights-inf", 'recipe = "scenes-tiny"\n[params]\nnegative_weights = [1, inf, 1, 1, 1, 1]\n',
     ["'negative_weights'", "finite"]),
    ("negative-weights-negative", 'recipe = "scenes-tiny"\n[params]\nnegative_weights = [1, -1, 1, 1, 1, 1]\n',
     ["'negative_weights'", "non-negative"]),
    ("betas-inf", 'recipe = "contrastive"\n' + TRAIN + "betas = [0.9, inf]\n", ["'betas'"]),
    ("batch-1e9", 'recipe = "scenes-tiny"\n[train]\nbatch_size = 1000000000\n', ["'batch_size'", "65,536"]),
    ("scenes-1e9", 'recipe = "contrastive"\n[train]\ndata = "scenes:1000000000"\n', ["'data'", "100,000"]),
    ("scenes-negative", 'recipe = "contrastive"\n[train]\ndata = "scenes:-5"\n', ["'data'"]),
    ("eval-scenes-1e9", 'recipe = "contrastive"\n[train]\neval_scenes = 1000000000\n', ["'eval_scenes'"]),
    ("seed-huge", 'recipe = "contrastive"\n[train]\nseed = 9223372036854775807\n', ["'seed'"]),
    ("seed-negative", 'recipe = "contrastive"\n[train]\nseed = -1\n', ["'seed'"]),
    ("stage-int", 'recipe = "scenes-tiny"\nstage = 5\n', ["r.toml", "[[stage]] tables", "got 5"]),
    ("stage-empty", 'recipe = "scenes-tiny"\nstage = []\n', ["r.toml", "[[stage]] tables"]),
    ("stage-list-of-ints", 'recipe = "scenes-tiny"\nstage = [1, 2]\n', ["[[stage]] tables"]),
    ("stage-dotdot", 'recipe = "scenes-tiny"\n[[stage]]\nname = ".."\n', ["stage 1", "unique name", "'..'"]),
    ("stage-dot", 'recipe = "scenes-tiny"\n[[stage]]\nname = "."\n', ["stage 1", "unique name"]),
    ("stage-absolute", 'recipe = "scenes-tiny"\n[[stage]]\nname = "/tmp/x"\n', ["unique name"]),
    ("stage-backslash", 'recipe = "scenes-tiny"\n[[stage]]\nname = "..\\\\x"\n', ["unique name"]),
    ("stage-unclosed-brace",
     'recipe = "scenes-tiny"\n[[stage]]\nname = "a"\n[[stage]]\nname = "b"\n[stage.train]\nmodel = "ckpt:{a/x"\n',
     ["stage 'b'.train.model", "'ckpt:{a/x'", "brace"]),
    ("stage-lone-closing-brace",
     'recipe = "scenes-tiny"\n[[stage]]\nname = "a"\n[[stage]]\nname = "b"\n[stage.train]\nmodel = "ckpt:a}/x"\n',
     ["stage 'b'.train.model", "brace"]),
    ("stage-conversion",
     'recipe = "scenes-tiny"\n[[stage]]\nname = "a"\n[[stage]]\nname = "b"\n[stage.train]\nmodel = "ckpt:{a!r}/x"\n',
     ["{a!r}", "not a stage reference"]),
]


@pytest.mark.parametrize("case", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_recipe_file_values_that_cannot_train_are_one_line(case, tmp_path, capsys):
    _, text, names = case
    recipe = text.split('"')[1]
    out = tmp_path / "out"
    code, _, err = run(["train", recipe, "--config", recipe_file(tmp_path, text), "--out", out], capsys)
    assert_one_error(code, err, *names)
    assert not out.exists()  # refused before anything was written
    assert not (tmp_path / "x").exists() and not (tmp_path.parent / "x").exists()


@pytest.mark.parametrize("argv,names", [
    (["--set", "lambda_v=inf"], ["'lambda_v'", "finite"]),
    (["--set", "lambda_t=1e999"], ["'lambda_t'", "finite"]),
    (["--set", "stretch=inf"], ["'stretch'", "true or false"]),
    (["--batch-size", "1000000000"], ["'batch_size'"]),
    (["--seed", "100000000000000000000000"], ["--seed", "2**63 - 1"]),
    (["--seed", str(2**40)], ["'seed'", "4294967295"]),
    (["--lr", "inf"], ["--lr", "finite"]),
])
def test_flag_values_that_cannot_train_are_one_line(argv, names, tmp_path, capsys):
    code, _, err = run(["train", "pacs", "--out", tmp_path / "o", *argv], capsys)
    line = assert_one_error(code, err, *names)
    if "stretch" in argv[-1]:
        assert "finite" not in line  # a bool is not a number: "finite" would mislead


def test_a_batch_larger_than_the_data_is_refused_before_the_model_loads(tmp_path, capsys):
    code, _, err = run(["train", "contrastive", "--model", TINY, "--data", "scenes:6", "--batch-size", "7",
                        "--steps", "1", "--eval-scenes", "0", "--out", tmp_path / "o"], capsys)
    assert_one_error(code, err, "batch_size 7", "6 training examples", "at most 6")
    assert not (tmp_path / "o").exists()


def test_braces_in_a_plain_model_path_are_literal(tmp_path, capsys):
    """Without a several-stage recipe file, ``{x}`` in --model is part of the path, not a stage reference."""
    missing = tmp_path / "run{x}" / "m.safetensors"
    code, _, err = run(["train", "contrastive", "--model", f"ckpt:{missing}", "--data", "scenes:4",
                        "--batch-size", "2", "--steps", "1", "--eval-scenes", "0", "--out", tmp_path / "o"], capsys)
    assert_one_error(code, err, str(missing), "not found")


def test_a_stage_named_elsewhere_in_an_override_is_refused(tmp_path, capsys):
    text = 'recipe = "contrastive"\n[[stage]]\nname = "a"\n[stage.train]\nsteps = 1\n'
    code, _, err = run(["train", "contrastive", "--config", recipe_file(tmp_path, text), "--model", "ckpt:{zz}/m",
                        "--out", tmp_path / "o"], capsys)
    assert_one_error(code, err, "{zz}", "not a stage of this run")


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=12))
def test_a_stage_name_is_accepted_only_as_a_plain_folder_name(tmp_path_factory, name):
    """Property: a stage name the recipe file accepts names one folder directly under --out."""
    text = 'recipe = "scenes-tiny"\n[[stage]]\nname = ' + json.dumps(name) + "\n"
    d = tmp_path_factory.mktemp("stage")
    try:
        _, stages = load_recipe_file(recipe_file(d, text))
    except CapscoreError:
        assert not STAGE_NAME.fullmatch(name)
        return
    out = (d / "out").resolve()
    folder = (out / stages[0].name).resolve()
    assert folder.parent == out and folder != out


def test_a_diverging_run_stops_with_one_line_and_keeps_the_last_finite_checkpoint(tmp_path, capsys):
    """lr = 1e30 (finite, so accepted) blows the weights up within a few steps: the run stops at the first
    step whose loss, gradient norm or weights are not finite, exit 2, nothing of it saved or exported."""
    out = tmp_path / "o"
    code, stdout, err = run(["train", "contrastive", "--model", TINY, "--data", "scenes:8", "--batch-size", "4",
                             "--steps", "6", "--warmup", "0", "--lr", "1e30", "--ckpt-every", "1",
                             "--eval-scenes", "0", "--out", out], capsys)
    line = assert_one_error(code, err, "training diverged at step", "lower learning rate")
    step = int(line.split("at step ")[1].split(":")[0])
    assert 1 <= step <= 6
    assert not (out / "model.safetensors").exists() and not (out / "MODEL_CARD.md").exists()
    kept = sorted((out / "checkpoints").glob("step-*"))
    assert [p.name for p in kept] == [f"step-{k:06d}" for k in range(1, step)]  # every step before, none after
    if kept:
        assert str(kept[-1]) in line
        for t in load_file(str(kept[-1] / "model.safetensors")).values():
            assert torch.isfinite(t.float()).all()
    else:
        assert "no checkpoint had been saved" in line
    logged = [json.loads(ln) for ln in (out / "log.jsonl").read_text().splitlines() if ln.strip()]
    assert [e["step"] for e in logged] == list(range(1, step))  # the diverged step is not logged
    assert all(math.isfinite(e["loss"]) for e in logged)


def test_finite_weights():
    from capscore.train.loop import finite_weights

    w = [torch.zeros(3), torch.ones(2, 2)]
    assert finite_weights(w) and finite_weights([])
    w[1][0, 1] = float("nan")
    assert not finite_weights(w)
    assert not finite_weights([torch.tensor([float("-inf")])])


@pytest.mark.parametrize("row,names", [
    ({"image": 5, "caption": "a"}, ["d.jsonl:1", "'image' (a path)"]),
    ({"image": "", "caption": "a"}, ["d.jsonl:1", "'image' (a path)"]),
    ({"image": "a.png", "caption": "a", "base": ["x"]}, ["d.jsonl:1", "'base' must be a string"]),
    ({"image": "a.png", "caption": "a", "gen_image": 3}, ["d.jsonl:1", "'gen_image' must be a string"]),
    ({"image": "a.png", "caption": "a", "translations": {"de": 1}}, ["d.jsonl:1", "'translations'"]),
])
def test_training_rows_of_the_wrong_type_are_one_line(row, names, tmp_path, capsys):
    d = tmp_path / "d.jsonl"
    d.write_text(json.dumps(row) + "\n" + json.dumps({"image": "b.png", "caption": "b"}) + "\n")
    code, _, err = run(["train", "contrastive", "--model", TINY, "--data", d, "--batch-size", "1", "--steps", "1",
                        "--eval-scenes", "0", "--out", tmp_path / "o"], capsys)
    assert_one_error(code, err, *names)
