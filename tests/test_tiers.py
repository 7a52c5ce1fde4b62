"""Two test tiers: the README's command runs the fast one; CI runs that command verbatim, then `-m slow`."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = [ln for block in re.findall(r"```bash\n(.*?)```", readme, re.S) for ln in block.splitlines()
                if "pip install -e" in ln and "pytest" in ln]
    assert len(commands) == 1, commands
    return commands[0].strip()


def test_the_readme_runs_the_fast_tier_and_ci_runs_it_verbatim_then_the_slow_tier():
    command = _readme_test_command()
    assert command.endswith('python -m pytest -q -m "not slow"')
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert command in lines
    after = lines[lines.index(command) + 1:]
    assert "python -m pytest -q -m slow" in after
    before = lines[:lines.index(command)]
    assert 'export PYTEST_ADDOPTS="--durations=25"' in before  # both tiers print their slowest tests


def test_the_slow_marker_is_declared():
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert any(m.startswith("slow:") for m in ini["markers"])
    assert "-m" not in ini.get("addopts", "").split()  # the tier is chosen on the command line, visibly
