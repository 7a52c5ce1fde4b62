"""Start-up: help, version, the model grammar and argument errors import neither torch nor open_clip."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")
PROBE = """
import json, sys
sys.argv = ["capscore"] + json.loads(sys.argv[1])
from capscore.cli import main
try:
    code = main()
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "torch": "torch" in sys.modules, "open_clip": "open_clip" in sys.modules,
                  "transformers": "transformers" in sys.modules}), file=sys.stderr)
"""


def _run(args: list[str]) -> tuple[dict, str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True, env=env,
                          timeout=300)
    *lines, last = proc.stderr.strip().splitlines()
    return json.loads(last), "\n".join(lines) + proc.stdout


@pytest.mark.parametrize("args, code", [
    (["--help"], 0),
    (["--version"], 0),
    (["models"], 0),
    (["score", "--help"], 0),
    (["score", "--bogus"], 2),  # argparse error
    (["score", "--images", "x", "--captions", "y.json", "--out", "o.jsonl", "--batch-size", "0"], 2),
    (["score", "--model", "ViT-B-99", "--images", "x", "--captions", "y.json", "--out", "o.jsonl"], 2),  # typo
])
def test_no_deep_learning_imports(args, code):
    seen, out = _run(args)
    assert seen["code"] == code
    assert not (seen["torch"] or seen["open_clip"] or seen["transformers"]), (args, seen)


def test_model_typo_is_reported_with_suggestions():
    seen, out = _run(["score", "--model", "ViT-B-99", "--images", "x", "--captions", "y.json", "--out", "o.jsonl"])
    assert "unknown open_clip architecture 'ViT-B-99'" in out and "ViT-B-32" in out


def test_architecture_names_read_without_open_clip_match_its_list():
    import open_clip

    import capscore.backbones.openclip  # noqa: F401  (registers capscore's own configs with open_clip)
    from capscore.backbones.registry import known_architectures

    assert known_architectures() == sorted(open_clip.list_models())
