"""The light core install: every optional dependency is an extra, and a missing one is one line naming it.

A missing package is simulated by ``sys.modules[name] = None`` (Python then refuses to import it), and
each extra is reached through a real entry point that needs it, not through the helper alone.
"""
from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from capscore.errors import CapscoreError

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _hide(monkeypatch, *modules: str) -> None:
    for name in modules:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            monkeypatch.delitem(sys.modules, loaded)
        monkeypatch.setitem(sys.modules, name, None)


def _use_nlp():
    from capscore import nlp

    nlp._load.cache_clear()
    try:
        nlp.load_spacy("en_core_web_sm")
    finally:
        nlp._load.cache_clear()


def _use_video():
    from capscore.data.video import _av

    _av()


def _use_report():
    from capscore.report.html import figure

    figure(2, 2)


def _use_data():
    from capscore.report.writers import output_format

    output_format("scores.parquet")


def _use_data_frame(tiny_backbone, tmp_path):
    from PIL import Image

    import capscore

    Image.new("RGB", (32, 32), "red").save(tmp_path / "a.png")
    capscore.score([tmp_path / "a.png"], ["a red square"], model=tiny_backbone, as_frame=True)


def _use_hf(tmp_path):
    from capscore.data.hf_dataset import list_arrow_files

    list_arrow_files(str(tmp_path))


def _use_ray():
    from capscore.engines import require_ray

    require_ray()


def _use_torchmetrics():
    sys.modules.pop("capscore.integrations.torchmetrics", None)
    importlib.import_module("capscore.integrations.torchmetrics")


CASES = [  # (extra, the packages hidden, how a user reaches it)
    ("nlp", ("spacy",), lambda **_: _use_nlp()),
    ("video", ("av",), lambda **_: _use_video()),
    ("report", ("matplotlib",), lambda **_: _use_report()),
    ("data", ("pyarrow",), lambda **_: _use_data()),
    ("data", ("pandas",), lambda tiny_backbone, tmp_path: _use_data_frame(tiny_backbone, tmp_path)),
    ("hf", ("datasets",), lambda tmp_path, **_: _use_hf(tmp_path)),
    ("ray", ("ray",), lambda **_: _use_ray()),
    ("torchmetrics", ("torchmetrics",), lambda **_: _use_torchmetrics()),
]


@pytest.mark.parametrize("extra,hidden,use", CASES, ids=[f"{c[0]}-{c[1][0]}" for c in CASES])
def test_a_missing_extra_is_one_line_naming_it(extra, hidden, use, monkeypatch, tmp_path, tiny_backbone):
    _hide(monkeypatch, *hidden)
    with pytest.raises(CapscoreError) as e:
        use(tiny_backbone=tiny_backbone, tmp_path=tmp_path)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"needs the '{extra}' extra: pip install 'capscore[{extra}]' ({hidden[0]} is not installed)" in msg
    assert isinstance(e.value, ImportError)  # `except ImportError` and pytest.importorskip still work


def test_the_cli_prints_the_missing_extra_on_one_line(monkeypatch, tmp_path, capsys):
    from capscore.cli import main

    from PIL import Image

    _hide(monkeypatch, "pyarrow")
    Image.new("RGB", (32, 32), "red").save(tmp_path / "a.png")
    (tmp_path / "caps.json").write_text('{"a": "a red square"}')
    rc = main(["score", "--images", str(tmp_path), "--captions", str(tmp_path / "caps.json"),
               "--model", "capscore-test-tiny", "--out", str(tmp_path / "out.parquet")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err == ("capscore: error: out.parquet (a .parquet file) needs the 'data' extra: "
                   "pip install 'capscore[data]' (pyarrow is not installed)\n")


def test_pyproject_declares_every_extra_and_all_of_them_in_all():
    from capscore._optional import EXTRAS

    extras = PYPROJECT["optional-dependencies"]
    assert set(EXTRAS) <= set(extras)
    assert extras["all"] == [f"capscore[{','.join(EXTRAS)}]"]
    assert "capscore[all]" in extras["test"]  # CI tests everything


def test_the_core_dependencies_hold_no_optional_package_and_no_exact_pin():
    core = " ".join(PYPROJECT["dependencies"]).lower()
    for pkg in ("spacy", "en-core-web", "av>", "matplotlib", "pandas", "pyarrow", "braceexpand", "transformers",
                "datasets", "ray", "torchmetrics"):
        assert pkg not in core, pkg
    assert "==" not in core


def test_the_demo_runs_with_every_optional_package_missing(tmp_path):
    """What ``pip install capscore`` alone gives: the demo and CLIP-S scoring import no extra."""
    from capscore._optional import EXTRAS

    hidden = [m for mods in EXTRAS.values() for m in mods]
    code = (f"import sys\nfor m in {hidden!r}: sys.modules[m] = None\n"
            "from capscore.cli import main\n"
            f"sys.exit(main(['-q', 'demo', '--n', '4', '--out', {str(tmp_path / 'demo')!r}]))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "probe: does the correct caption outscore its twin" in r.stdout
    assert (tmp_path / "demo" / "summary.json").is_file()
