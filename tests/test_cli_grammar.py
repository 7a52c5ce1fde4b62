"""One CLI grammar: --model/--metric lists, --device/--dtype everywhere, -q/--debug after the subcommand,
--version, a light --help, the README's model table, logging that leaves the root logger alone."""
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from capscore.cli import COMMANDS, _available, build_parser, main

ROOT = Path(__file__).resolve().parents[1]
ENCODING = {  # command -> argv prefix that parses (required options filled in)
    "score": ["score", "--images", "i", "--captions", "c.json", "--out", "o.jsonl"],
    "probe": ["probe", "--suite", "scenes-flips", "--out", "o"],
    "explain": ["explain", "--image", "i.png", "--caption", "c", "--word", "w", "--out", "o.png"],
    "correlate": ["correlate", "--dataset", "scenes-oracle"],
    "train": ["train", "contrastive", "--out", "o"],
    "demo": ["demo"],
    "scenes eval": ["scenes", "eval"],
}


def parse(argv):
    parser = build_parser(_available())
    return parser.parse_args(argv)


@pytest.mark.parametrize("name", list(ENCODING))
def test_every_encoding_command_takes_device_dtype_and_its_default_model(name):
    args = parse(ENCODING[name] + ["--device", "cuda:1", "--dtype", "bf16"])
    assert (args.device, args.dtype) == ("cuda:1", "bf16")
    model = parse(ENCODING[name]).model
    if name == "correlate":
        assert model == []  # correlate scores only the models it is given
    elif name.startswith("train"):
        # resolved per recipe at run time: scenes-tiny, or the recipe's own start (scenes-tiny recipe: random init)
        assert model is None
    elif name == "score":
        assert model == ["ViT-B-32/openai"]  # CLIP-S's backbone; offline the error names --model scenes-tiny
    else:
        assert model in ("scenes-tiny", ["scenes-tiny"])


@pytest.mark.parametrize("name", ["score", "probe", "correlate"])
def test_several_models_one_flag_or_repeated_flag_are_the_same(name):
    assert parse(ENCODING[name] + ["--model", "A", "B"]).model == ["A", "B"]
    assert parse(ENCODING[name] + ["--model", "A", "--model", "B"]).model == ["A", "B"]
    if name != "probe":  # probe chooses a pair scorer (--scorer), not a metric
        assert parse(ENCODING[name] + ["--metric", "clip-s", "refclip-s"]).metric == ["clip-s", "refclip-s"]
        assert parse(ENCODING[name] + ["--metric", "clip-s", "--metric", "refclip-s"]).metric == [
            "clip-s", "refclip-s"]


@pytest.mark.parametrize("argv, needle", [
    (ENCODING["score"] + ["--model", "A", "--model", "A"], "--model A is given twice"),
    (ENCODING["explain"] + ["--model", "A", "--model", "B"], "takes one model"),
    (ENCODING["train"] + ["--model", "A", "B"], "takes one model"),
    (ENCODING["score"] + ["--metric", "clip-z"], "did you mean 'clip-s'"),
    (ENCODING["correlate"] + ["--metric", "abe-clip"], "unknown metric 'abe-clip'"),
])
def test_a_repeated_or_unknown_value_is_an_error_never_dropped(argv, needle, capsys):
    assert main(argv) == 2  # argparse's exit becomes capscore's one-line error and exit status 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err


def test_quiet_and_debug_after_the_subcommand():
    assert parse(["models", "-q"]).quiet and parse(["-q", "models"]).quiet
    assert not parse(["models"]).quiet
    assert parse(["scenes", "eval", "-q", "--debug"]).debug


def test_version_and_help_do_not_import_torch():
    code = ("import sys; from capscore.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('TORCH', 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "TORCH False" in out and "score" in out and "correlate" in out
    v = subprocess.run([sys.executable, "-m", "capscore.cli", "--version"], capture_output=True, text=True)
    assert re.fullmatch(r"capscore \d+\.\d+\.\d+\S*\n", v.stdout)


def test_backbones_doc_model_table_is_the_registry_table(capsys):
    from capscore.backbones.registry import GRAMMAR, grammar_markdown

    assert grammar_markdown() in (ROOT / "docs" / "backbones.md").read_text(encoding="utf-8")
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for spec, _, _ in GRAMMAR:
        assert spec.replace("`", "") in out


def test_root_logger_is_left_alone_and_capscore_logs_once(capsys):
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    assert main(["-q", "models"]) == 0
    assert (list(root.handlers), root.level) == before
    from capscore._log import log, setup_logging

    setup_logging()
    setup_logging()  # idempotent: one handler, not two
    log.warning("hello")
    err = capsys.readouterr().err
    assert err.count("capscore: hello") == 1


def test_did_you_mean_lists_each_name_once():
    from capscore.errors import unknown_name

    msg = str(unknown_name("model", "ViT-B-23", ["ViT-B-32", "ViT-B-32", "ViT-B-16", "vit-b-32"]))
    names = re.findall(r"'([^']+)'", msg.split("did you mean", 1)[1])
    assert len(names) == len(set(names)) and "ViT-B-32" in names


def test_progress_bar_is_closed_before_an_error_is_printed():
    from capscore import _log
    from capscore.errors import CapscoreError

    with pytest.raises(CapscoreError):
        with _log.progress(10, desc="x", disable=False):
            assert len(_log._open_bars) == 1
            raise CapscoreError("boom")
    assert _log._open_bars == []
    bar = _log.open_bar(5, desc="y", disable=False)  # e.g. the encoder's, open when an error escapes
    _log.close_bars()
    assert bar.disable or bar not in _log._open_bars and _log._open_bars == []


def test_commands_table_matches_modules():
    assert set(_available()) == set(COMMANDS)
