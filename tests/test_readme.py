"""The README is a user guide that works: at most 200 lines, its offline example runs and prints what it
shows, and every command line it gives parses with capscore's own parser."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
TEXT = README.read_text(encoding="utf-8")


def _section(title: str) -> str:
    return TEXT.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _blocks(section: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", section, flags=re.S)


def _commands(block: str) -> list[list[str]]:
    """The capscore command lines of a bash block (continuations joined, comments and [optional] parts cut)."""
    joined = block.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = re.sub(r"\[[^\]]*\]", "", line.split("#", 1)[0]).strip()
        if line.startswith("capscore "):
            out.append(shlex.split(line)[1:])
    return out


def test_readme_is_a_short_user_guide():
    assert len(TEXT.splitlines()) <= 200
    assert "issue" not in TEXT.lower()  # no tracker history in the user guide
    assert 'python -m pytest -q -m "not slow"' in TEXT and "pip install -e . && capscore demo" in TEXT


def test_every_command_line_in_the_readme_parses():
    from capscore.cli import _available, build_parser

    parser = build_parser(_available())
    lines = [c for title in ("Offline, end to end", "With real models", "Commands")
             for block in _blocks(_section(title), "bash") for c in _commands(block)]
    assert len(lines) >= 20
    for argv in lines:
        parser.parse_args(argv)  # an unknown command, flag or choice exits with an error here


def test_the_offline_example_prints_what_the_readme_shows(tmp_path):
    section = _section("Offline, end to end")
    (bash,) = _blocks(section, "bash")
    (expected,) = _blocks(section, "text")
    printed = []
    for argv in _commands(bash):
        done = subprocess.run([sys.executable, "-m", "capscore.cli", *argv], cwd=tmp_path, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        printed.append(done.stdout)
    score_out = printed[1]
    for line in expected.strip().splitlines():
        assert line.strip() in score_out, (line, score_out)
    assert (tmp_path / "report.html").stat().st_size > 1000


@pytest.mark.parametrize("argv", [["models"], ["reproduce", "--list"], ["doctor"]])
def test_offline_commands_of_the_readme_run(argv, tmp_path):
    done = subprocess.run([sys.executable, "-m", "capscore.cli", *argv], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
