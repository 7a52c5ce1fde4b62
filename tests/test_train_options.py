"""Typed training options and recipe files: types, one-line errors, the bundled models' recipe files
against their documented command lines, and a run from a file equal to the same run from flags."""
from __future__ import annotations

import json
import shlex
import tomllib

import pytest
import torch

from capscore.cli import main
from capscore.errors import CapscoreError
from capscore.train.options import RUN_OPTIONS, bundled_recipe_files, find_recipe_file
from capscore.train.spec import SPEC_KEYS, TrainSpec, load_recipe_file
from capscore.train.recipes import RECIPES, get_recipe, resolve_params
from capscore.train.run import train_config
from capscore.train.scenes_tiny import ScenesTinyParams

# The documented commands of the bundled models, copied from capscore/scenes/MODEL_CARD.md (v3: "Training
# data and recipe"; v4: "Recipe: v3's stage 1, then stage 2 ..."; v1: its card at the end).
V3_STAGE1 = """capscore train scenes-tiny --model openclip:scenes-tiny-v3 --out runs/scenes-tiny-v3-c500t --steps 1000 \
    --batch-size 128 --lr 1.5e-3 --warmup 50 --seed 0 --ckpt-every 100 --eval-scenes 300 \
    --set dense=filip --set dense_weight=0.5 \
    --set negative_kinds=color,shape,count,attribute_swap,relation,hallucination \
    --set negative_weights=1,2,2,1,2,1 --set single_object_steps=500 --set lock_text_steps=300 --set twins=0.5"""
V3_STAGE2 = """capscore train scenes-tiny --model 'ckpt:runs/scenes-tiny-v3-c500t/scenes-tiny.safetensors#arch=scenes-tiny-v3' \
    --out runs/scenes-tiny-v3-stage2 --steps 700 --batch-size 128 --lr 7.5e-4 --warmup 50 --seed 1 \
    --ckpt-every 100 --eval-scenes 300 --set dense=filip --set dense_weight=0.5 --set twins=0.5 \
    --set negative_kinds=color,shape,count,attribute_swap,relation,hallucination --set negative_weights=1,3,3,1,1,1"""
V4_STAGE2 = """capscore train scenes-tiny --model 'ckpt:runs/scenes-tiny-v3-c500t/scenes-tiny.safetensors#arch=scenes-tiny-v4' \
    --out runs/v4-mo3 --steps 1200 --batch-size 64 --lr 7.5e-4 --warmup 100 --seed 1 --ckpt-every 100 \
    --eval-scenes 0 --keep-checkpoints 1 --set dense=filip --set dense_weight=0.5 --set twins=0.5 \
    --set negative_kinds=color,shape,count,attribute_swap,relation,hallucination --set negative_weights=1,3,3,1,1,1 \
    --set min_objects=3"""
V1 = "capscore train scenes-tiny --out DIR --steps 800 --lr 1.5e-3 --eval-scenes 300"
V1_DEFAULT_MODEL = "openclip:scenes-tiny-v1"  # `capscore train scenes-tiny` starts from it without --model (docs/train.md)

DOCUMENTED = {  # bundled recipe file -> [(stage name, documented command)]
    "scenes-tiny-v3": [("stage1", V3_STAGE1), ("stage2", V3_STAGE2)],
    "scenes-tiny-v4": [("stage1", V3_STAGE1), ("stage2", V4_STAGE2)],
    "scenes-tiny-v1": [("", V1)],
}


def _literal(text: str):
    """A --set value as plain Python reads it: a comma list as a tuple, else an int, a float or the string."""
    if "," in text:
        return tuple(_literal(x) for x in text.split(","))
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _documented(command: str) -> tuple[str, dict, dict]:
    """(the --out folder, {run option: value}, {recipe parameter: value}) of a documented command line."""
    words = shlex.split(command)
    assert words[:3] == ["capscore", "train", "scenes-tiny"]
    options, params, out, i = {}, {}, None, 3
    while i < len(words):
        flag, value = words[i], words[i + 1]
        i += 2
        if flag == "--set":
            key, _, raw = value.partition("=")
            params[key] = _literal(raw)
        elif flag == "--out":
            out = value
        else:
            options[flag[2:].replace("-", "_")] = value if flag == "--model" else _literal(value)
    return out, options, params


def _same(a, b) -> bool:
    """Equal values of the same kind (a bool is not a number here; a list equals a tuple)."""
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b) \
            and all(_same(x, y) for x, y in zip(a, b))
    return a == b and isinstance(a, bool) == isinstance(b, bool)


# ----------------------------------------------------------------------------- types and errors
def test_set_strings_are_parsed_with_each_fields_type():
    p = resolve_params(get_recipe("scenes-tiny"), {"negative_kinds": "shape, count", "negative_weights": "3,1",
                                                   "twins": "0.5", "lock_text_steps": "300", "dense": "none"})
    assert p.negative_kinds == ("shape", "count") and p.negative_weights == (3.0, 1.0)
    assert type(p.negative_weights[0]) is float and type(p.twins) is float and type(p.lock_text_steps) is int
    assert p.dense == "none"  # a word of the field, not a missing value
    assert resolve_params(get_recipe("scenes-tiny"), {"negative_weights": ""}).negative_weights == ()  # uniform
    s = resolve_params(get_recipe("specs"), {"symmetric": "true", "stretch": "0", "fixed_margin": "null"})
    assert (s.symmetric, s.stretch, s.fixed_margin) == (True, False, None)
    assert resolve_params(get_recipe("pacs"), {"infonce_mean": "1", "freeze": "visual.conv1,token_"}).freeze == \
        ("visual.conv1", "token_")


@pytest.mark.parametrize("sets, message", [
    ({"twins": "abc"}, "The 'twins' parameter of recipe scenes-tiny must be a probability in [0, 1]; got 'abc' instead."),
    ({"twins": "1.5"}, "The 'twins' parameter of recipe scenes-tiny must be a probability in [0, 1]; got 1.5 instead."),
    ({"lock_text_steps": "2.5"}, "The 'lock_text_steps' parameter of recipe scenes-tiny must be a number of steps >= 0; "
                                 "got '2.5' instead."),
    ({"negative_kinds": "colour"}, "The 'negative_kinds' parameter of recipe scenes-tiny must be a list of the error "
                                   "kinds color, shape, count, attribute_swap, relation, hallucination; got ('colour',) "
                                   "instead."),
    ({"twinz": "1"}, "unknown parameter of recipe scenes-tiny 'twinz'; did you mean 'twins'?"),
    ({"lr": "1"}, "unknown parameter of recipe scenes-tiny 'lr'; 'lr' is a run option (the [train] table of a recipe "
                  "file, --lr of capscore train)"),
])
def test_bad_parameters_are_one_line_errors_naming_the_parameter(sets, message):
    with pytest.raises(CapscoreError) as e:
        resolve_params(get_recipe("scenes-tiny"), sets)
    assert str(e.value) == message


def test_specs_bool_and_choice_errors():
    with pytest.raises(CapscoreError, match=r"^The 'symmetric' parameter of recipe specs must be true or false; "
                                            r"got 'maybe' instead\.$"):
        resolve_params(get_recipe("specs"), {"symmetric": "maybe"})
    with pytest.raises(CapscoreError, match=r"^The 'theta' parameter of recipe specs must be 'logit' or 'cosine'"):
        resolve_params(get_recipe("specs"), {"theta": "angle"})


def test_run_options_are_typed_and_checked_and_resolve_to_the_recipes_defaults():
    r = get_recipe("scenes-tiny")
    with pytest.raises(CapscoreError) as e:
        TrainSpec("scenes-tiny", r.defaults(), lr="abc")
    assert str(e.value) == "The 'lr' parameter of recipe scenes-tiny must be a positive float; got 'abc' instead."
    with pytest.raises(CapscoreError, match="The 'steps' parameter of recipe specs must be a positive whole number"):
        TrainSpec("specs", get_recipe("specs").defaults(), steps=0)
    with pytest.raises(CapscoreError, match="The 'params' parameter of recipe specs must be a SpecsParams"):
        TrainSpec("specs", r.defaults())
    # the scenes-tiny recipe's v1 schedule (its card: lr 1e-3, batch 128, 600 steps, 50 warm-up, cosine to
    # 10 %, clip 1.0, no decay on embeddings); betas/eps are CLIP's
    cfg = train_config(TrainSpec("scenes-tiny", r.defaults()))
    assert (cfg.lr, cfg.batch_size, cfg.steps, cfg.warmup, cfg.min_lr_ratio, cfg.grad_clip, cfg.no_decay) == \
        (1e-3, 128, 600, 50, 0.1, 1.0, ("embedding",))
    assert (cfg.betas, cfg.eps, cfg.weight_decay) == ((0.9, 0.98), 1e-6, 0.1)
    cfg = train_config(TrainSpec("scenes-tiny", r.defaults(), steps=20, warmup=50, lr=2))
    assert (cfg.steps, cfg.warmup, cfg.lr) == (20, 20, 2.0)  # warm-up at most the run; a whole lr becomes a float


def test_every_recipe_has_typed_defaults():
    for name, recipe in RECIPES.items():
        p = recipe.defaults()
        assert type(p).RECIPE == name and p == resolve_params(recipe, {})
        json.dumps(p.as_dict())  # the model card records them


# ----------------------------------------------------------------------------- recipe files
def test_recipe_file_errors_name_the_file_the_table_and_the_key(tmp_path):
    f = tmp_path / "r.toml"
    f.write_text('recipe = "scenes-tiny"\n[train]\nsteps = 10\n[params]\ntwinz = 0.5\n')
    with pytest.raises(CapscoreError, match=r"r.toml.params: unknown parameter of recipe scenes-tiny 'twinz'; "
                                            r"did you mean 'twins'\?"):
        load_recipe_file(f)
    f.write_text('recipe = "scenes-tiny"\n[train]\nlr = "abc"\n')
    with pytest.raises(CapscoreError, match=r"r\.toml: The 'lr' parameter of recipe scenes-tiny must be a positive "
                                            r"float; got 'abc' instead\.$"):
        load_recipe_file(f)
    f.write_text('recipe = "scenes-tiny"\n[train]\nstep = 10\n')
    with pytest.raises(CapscoreError, match=r"r.toml.train: unknown parameter of recipe scenes-tiny 'step'; did you "
                                            r"mean 'steps'"):
        load_recipe_file(f)
    f.write_text('recipe = "scenes-tiny"\n[params]\ntwins = true\n')  # a bool is not a probability
    with pytest.raises(CapscoreError, match="The 'twins' parameter of recipe scenes-tiny"):
        load_recipe_file(f)
    f.write_text('recipe = "scenes-tin"\n')
    with pytest.raises(CapscoreError, match="r.toml: unknown recipe 'scenes-tin'; did you mean 'scenes-tiny'"):
        load_recipe_file(f)
    f.write_text('recipe = "scenes-tiny"\n[[stage]]\nname = "a"\n[stage.train]\nmodel = "ckpt:{b}/x"\n')
    with pytest.raises(CapscoreError, match=r"stage 1: model names \{b\}, which is not an earlier stage"):
        load_recipe_file(f)
    f.write_text('recipe = "scenes-tiny"\n[train\n')
    with pytest.raises(CapscoreError, match="r.toml: not a TOML file"):
        load_recipe_file(f)
    with pytest.raises(CapscoreError, match="did you mean 'scenes-tiny-v3'"):
        find_recipe_file("scenes-tiny-v33")


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_each_bundled_recipe_file_is_exactly_its_documented_command_line(name):
    path = bundled_recipe_files()[name]
    raw = tomllib.loads(path.read_text())
    recipe, stages = load_recipe_file(path)
    assert recipe == raw["recipe"] == "scenes-tiny"
    tables = raw.get("stage", [{"name": "", **{k: raw[k] for k in ("train", "params") if k in raw}}])
    assert [s.name for s in stages] == [t["name"] for t in tables] == [n for n, _ in DOCUMENTED[name]]
    outs = {}
    for stage, table, (_, command) in zip(stages, tables, DOCUMENTED[name]):
        out, options, params = _documented(command)
        outs[stage.name] = out
        options.setdefault("model", V1_DEFAULT_MODEL)  # v1's command relies on the recipe's start model
        train = dict(table.get("train", {}))
        for ref, folder in outs.items():  # {stage1} is the earlier stage's output folder
            if ref:
                train["model"] = train["model"].replace("{" + ref + "}", folder)
        # the file sets exactly the documented options and parameters, to the same values ...
        assert set(train) == set(options) and set(table.get("params", {})) == set(params)
        assert all(_same(train[k], v) for k, v in options.items()), (train, options)
        assert all(_same(table["params"][k], v) for k, v in params.items())
        # ... and the typed spec holds them (as its field types), everything else at its default
        spec = stage.spec
        for k, v in options.items():
            got = getattr(spec, k)
            if k == "model":
                for ref, folder in outs.items():
                    got = got.replace("{" + ref + "}", folder) if ref else got
            assert _same(got, v), (k, got, v)
        assert spec.params == ScenesTinyParams.from_values({k: list(v) if isinstance(v, tuple) else v
                                                            for k, v in params.items()})
        default = TrainSpec("scenes-tiny", ScenesTinyParams())
        assert {k for k in spec.as_dict() if spec.as_dict()[k] != default.as_dict()[k]} - {"params"} <= set(options)


# ----------------------------------------------------------------------------- a run from a file = from flags
SHORT = ["--steps", "1", "--batch-size", "4", "--warmup", "1", "--eval-scenes", "0", "--ckpt-every", "0"]


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors")), load_file(str(folder / "scenes-tiny.safetensors"))


def _assert_identical(a, b):
    for x, y in zip(_weights(a), _weights(b)):
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
    ca, cb = (json.loads((d / "card.json").read_text()) for d in (a, b))
    assert ca["recipe_params"] == cb["recipe_params"] and ca["train_config"] == cb["train_config"]
    if not ca["base_model"].startswith("ckpt:"):  # a later stage starts from its own stage-1 folder
        assert ca["base_model"] == cb["base_model"]
    la, lb = ([json.loads(x) for x in (d / "log.jsonl").read_text().splitlines()] for d in (a, b))
    assert [{k: v for k, v in e.items() if k != "sec"} for e in la] == \
        [{k: v for k, v in e.items() if k != "sec"} for e in lb]


def _flags(command: str, out, model: str | None = None) -> list[str]:
    words = shlex.split(command)[1:]
    i = words.index("--out")
    words[i + 1] = str(out)
    if model is not None:
        words[words.index("--model") + 1] = model
    return ["-q", *words, *SHORT]


def test_the_v4_file_runs_both_stages_as_the_documented_commands_bit_for_bit(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert main(["-q", "train", "scenes-tiny", "--config", "scenes-tiny-v4", "--out", str(tmp_path / "file"),
                     *SHORT]) == 0
        assert main(_flags(V3_STAGE1, tmp_path / "s1")) == 0
        assert main(_flags(V4_STAGE2, tmp_path / "s2",
                           model=f"ckpt:{tmp_path / 's1'}/scenes-tiny.safetensors#arch=scenes-tiny-v4")) == 0
    finally:
        torch.set_num_threads(threads)
    _assert_identical(tmp_path / "file" / "stage1", tmp_path / "s1")
    _assert_identical(tmp_path / "file" / "stage2", tmp_path / "s2")
    card = json.loads((tmp_path / "file" / "stage2" / "card.json").read_text())
    assert card["recipe_params"]["min_objects"] == 3 and card["train_config"]["batch_size"] == 4  # flag over file
    assert card["base_model"].endswith("file/stage1/scenes-tiny.safetensors#arch=scenes-tiny-v4")


def test_the_v3_and_v1_files_run_as_their_documented_commands_bit_for_bit(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:  # v3's stage 2 alone, from a stage-1 folder made by the documented stage-1 command
        assert main(_flags(V3_STAGE1, tmp_path / "v3" / "stage1")) == 0
        assert main(["-q", "train", "scenes-tiny", "--config", str(bundled_recipe_files()["scenes-tiny-v3"]),
                     "--stage", "stage2", "--out", str(tmp_path / "v3"), *SHORT]) == 0
        assert main(_flags(V3_STAGE2, tmp_path / "s2",
                           model=f"ckpt:{tmp_path / 'v3' / 'stage1'}/scenes-tiny.safetensors#arch=scenes-tiny-v3")) == 0
        assert main(["-q", "train", "scenes-tiny", "--config", "scenes-tiny-v1", "--out", str(tmp_path / "v1"),
                     *SHORT]) == 0
        assert main(_flags(V1, tmp_path / "f1")) == 0
    finally:
        torch.set_num_threads(threads)
    _assert_identical(tmp_path / "v3" / "stage2", tmp_path / "s2")
    _assert_identical(tmp_path / "v1", tmp_path / "f1")


def test_config_and_stage_errors_are_one_line(tmp_path, capsys):
    base = ["train", "scenes-tiny", "--out", str(tmp_path / "x")]
    assert main([*base, "--config", "scenes-tiny-v3", "--stage", "stage3"]) == 2
    assert "unknown stage of" in capsys.readouterr().err
    assert main(["train", "specs", "--out", str(tmp_path / "x"), "--config", "scenes-tiny-v3"]) == 2
    assert "is a recipe file for 'scenes-tiny', not 'specs'" in capsys.readouterr().err
    assert main([*base, "--stage", "stage1"]) == 2
    assert "give --config" in capsys.readouterr().err
    assert main([*base, "--config", "scenes-tiny-v3", "--set", "twins=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("The 'twins' parameter of recipe scenes-tiny must be a probability in [0, 1]; got 2.0 "
                        "instead.") and "\n" not in err
    assert not (tmp_path / "x").exists()  # options are checked before anything is written


def test_the_run_option_hint_names_exactly_the_train_spec_fields():
    """a recipe parameter named like a run option gets a hint; the names it knows are TrainSpec's fields"""
    assert RUN_OPTIONS == SPEC_KEYS
