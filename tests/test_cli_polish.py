"""Small things a user trips on: counts printed as counts, help that tells the truth, scenes drawn at the
default model's size, warnings without source lines."""
from __future__ import annotations

import subprocess
import sys

from PIL import Image

from capscore.cli import main


def test_a_count_stays_an_integer_where_another_row_has_no_value():
    from capscore.report.tables import format_table

    # the probe summary's shape: per-subset rows with n_invalid, a mean row without it
    text = format_table([{"subset": "color", "n": 62, "n_invalid": 0, "accuracy": 0.5},
                         {"subset": "mean", "n": 62, "accuracy": 0.25}], indent="")
    assert text.splitlines() == ["subset  n n_invalid accuracy",
                                 "color  62         0   0.5000",
                                 "mean   62             0.2500"]


def test_a_float_column_with_an_integer_keeps_its_decimals_aligned():
    from capscore.report.tables import format_table

    assert format_table([{"x": 1.5}, {"x": 2}], indent="", digits=2).splitlines() == ["   x", "1.50", "2.00"]


def test_scenes_help_lists_only_its_own_actions(capsys):
    assert main(["scenes", "--help"]) == 0
    out = capsys.readouterr().out
    actions = out.split("positional arguments:", 1)[1].split("options:", 1)[0]
    listed = [ln.split()[0] for ln in actions.splitlines() if ln.startswith("    ") and ln[4:5] != " "]
    assert listed == ["generate", "eval"]
    # `train scenes-tiny` is named only as the capscore train command it is
    assert "train scenes-tiny" not in out.replace("capscore train scenes-tiny", "")


def test_scenes_generate_draws_at_the_default_models_input_size(tmp_path):
    from capscore.backbones import load_backbone

    assert main(["-q", "scenes", "generate", "--n", "2", "--out", str(tmp_path / "s")]) == 0
    size = load_backbone("scenes-tiny").image_size
    assert size == 96
    for p in (tmp_path / "s" / "images").iterdir():
        assert Image.open(p).size == (size, size)
    assert main(["-q", "scenes", "generate", "--n", "1", "--size", "64", "--out", str(tmp_path / "t")]) == 0
    assert Image.open(next((tmp_path / "t" / "images").iterdir())).size == (64, 64)


def test_python_api_warnings_print_the_message_only():
    code = ("import warnings\n"
            "from capscore.backbones import load_backbone\n"
            "load_backbone('capscore-test-tiny')\n"
            "warnings.warn('a third-party warning')\n")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    lines = err.splitlines()
    assert lines[0] == ("capscore: warning: capscore-test-tiny: no pretrained tag given; using RANDOM weights "
                        "(seed=0) — for tests and benchmarks only")
    assert lines[1:] == ["<string>:4: UserWarning: a third-party warning"]  # others keep their format
