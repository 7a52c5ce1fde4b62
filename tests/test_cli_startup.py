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


# ---------------------------------------------------------------- exit without the interpreter's teardown
EXIT = """
import atexit, os, sys, threading, time
import torch  # noqa: F401  (what makes the teardown slow, and the fast exit worth it)
from capscore.cli import exit_fast

class Finalised:
    def __del__(self):
        print("teardown ran", flush=True)

KEEP = Finalised()  # a module global: only the interpreter's teardown finalises it
atexit.register(lambda: print("atexit ran", flush=True))
if sys.argv[1] == "thread":  # a non-daemon thread still working: a normal exit waits for it
    threading.Thread(target=lambda: (time.sleep(0.5), open(sys.argv[2], "w").write("done"))).start()
print("unflushed", end="")
exit_fast(3)
"""


@pytest.mark.parametrize("mode", ["fast", "thread", "off"])
def test_exit_fast_skips_only_the_teardown(mode, tmp_path):
    """After torch is imported, the console script leaves without Python's teardown (0.5-1 s), but runs the
    atexit handlers, flushes stdout and keeps the exit code; a live non-daemon thread or CAPSCORE_FAST_EXIT=0
    means a normal exit."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if mode == "off":
        env["CAPSCORE_FAST_EXIT"] = "0"
    done = tmp_path / "thread-done"
    proc = subprocess.run([sys.executable, "-c", EXIT, mode, str(done)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 3, proc.stderr
    assert "unflushed" in proc.stdout and "atexit ran" in proc.stdout
    assert ("teardown ran" in proc.stdout) == (mode != "fast")
    assert done.exists() == (mode == "thread")


def test_console_script_is_the_fast_exit_entry():
    from capscore import cli

    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert 'capscore = "capscore.cli:entry"' in text and callable(cli.entry)


def test_python_dash_m_capscore_is_the_command(tmp_path):
    """``python -m capscore`` runs the command: its version, and a user error's one line and exit 2."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    ok = subprocess.run([sys.executable, "-m", "capscore", "--version"], capture_output=True, text=True, env=env,
                        timeout=120)
    assert ok.returncode == 0 and ok.stdout.startswith("capscore ")
    bad = subprocess.run([sys.executable, "-m", "capscore", "scroe"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert bad.returncode == 2 and "score" in bad.stderr and "Traceback" not in bad.stderr
