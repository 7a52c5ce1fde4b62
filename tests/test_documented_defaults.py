"""The defaults and signatures the reference pages document are the code's.

``capscore score``: docs/score.md's usage block names every option of the command's parser, and its option
table gives each option's default, compared with the parser's (argparse) default or, where the parser leaves
the choice to the code (None), with the value the code uses. The Python faces: each signature written in
docs/api.md is parsed and compared, parameter by parameter (name, kind, default), with ``inspect.signature``.
A change to either side alone fails here.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
GLOBAL = {"-h", "--help", "-q", "--quiet", "--debug"}  # every command's, documented once in the CLI's help


# ------------------------------------------------------------------------------------ capscore score
def _score_parser() -> argparse.ArgumentParser:
    from capscore.cli import _available, build_parser

    parser = build_parser(_available(["score"]), configure={"score"})
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["score"]


def _options(parser) -> dict[str, argparse.Action]:
    return {flag: a for a in parser._actions for flag in a.option_strings if flag not in GLOBAL}


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def _table_rows(section: str) -> list[list[str]]:
    """The cells of each body row of the first Markdown table in ``section`` (``\\|`` is a literal bar)."""
    rows = [ln for ln in section.splitlines() if ln.startswith("|")]
    cells = [[c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", ln)[1:-1]] for ln in rows]
    return cells[2:]  # after the header and its --- line


def _documented_defaults(text: str) -> dict[str, str]:
    """``--flag`` -> its default cell, from docs/score.md's option table (first cell: `--flag METAVAR`)."""
    out = {}
    for option, default, _ in _table_rows(_section(text, "## Options")):
        flags = re.findall(r"`(--[a-z0-9-]+)", option)
        assert len(flags) == 1, f"one option per row: {option!r}"
        assert flags[0] not in out, f"{flags[0]} is documented twice"
        out[flags[0]] = default
    return out


def _code_defaults() -> dict:
    """Where the parser leaves a default to the code (None), the value the code uses."""
    from capscore.data.video import DEFAULT_SAMPLING
    from capscore.scores.abe import AbeConfig

    abe = {f.name: f.default for f in dataclasses.fields(AbeConfig)}
    return {"--frames": str(DEFAULT_SAMPLING), "--abe-k": abe["k"], "--abe-p": abe["p"], "--abe-omega": abe["omega"]}


def _same(documented: str, value) -> bool:
    if isinstance(value, (list, tuple)):
        value = " ".join(map(str, value))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(documented) == float(value)
        except ValueError:
            return False
    return documented == str(value)


def check_score_page(text: str, parser) -> list[str]:
    """Every way docs/score.md and the parser of ``capscore score`` disagree (empty when they agree)."""
    problems = []
    options = _options(parser)
    usage = re.search(r"```\n(capscore score .*?)```", text, re.S).group(1)
    in_usage = set(re.findall(r"--[a-z0-9-]+", usage))
    problems += [f"usage block names {f}, which the parser does not have" for f in sorted(in_usage - set(options))]
    problems += [f"usage block lacks {f}" for f in sorted(set(options) - in_usage)]
    documented = _documented_defaults(text)
    problems += [f"option table names {f}, which the parser does not have" for f in sorted(set(documented) - set(options))]
    problems += [f"option table lacks {f}" for f in sorted(set(options) - set(documented))]
    code = _code_defaults()
    for flag in sorted(set(documented) & set(options)):
        cell, action = documented[flag], options[flag]
        literal = re.fullmatch(r"`([^`]*)`", cell)
        if cell == "required":
            ok = action.required
        elif cell == "off":  # a switch
            ok = isinstance(action, argparse._StoreTrueAction) and action.default is False
        elif cell == "—":  # no default: an input the user names, or nothing
            ok = action.default is None and flag not in code and not action.required
        elif literal is not None:
            value = action.default if action.default is not None else code.get(flag)
            ok = value is not None and _same(literal.group(1), value)
        else:  # in words: decided when the run starts, so the parser must not fix a value
            ok = action.default is None and flag not in code
        if not ok:
            shown = code.get(flag) if action.default is None else action.default
            problems.append(f"{flag}: documented default {cell!r}, code default {shown!r}"
                            + (" (required)" if action.required else ""))
    return problems


def test_capscore_score_page_documents_every_option_with_the_code_default():
    assert check_score_page((DOCS / "score.md").read_text(encoding="utf-8"), _score_parser()) == []


def test_the_score_page_check_fails_when_either_side_changes_alone():
    text, parser = (DOCS / "score.md").read_text(encoding="utf-8"), _score_parser()
    assert "| `--batch-size N` | `64` |" in text
    assert check_score_page(text.replace("| `--batch-size N` | `64` |", "| `--batch-size N` | `32` |"), parser) == [
        "--batch-size: documented default '`32`', code default 64"]
    _options(parser)["--chunk-size"].default = 4096
    assert check_score_page(text, parser) == ["--chunk-size: documented default '`2048`', code default 4096"]


# ------------------------------------------------------------------------------------ the Python faces
def _faces():
    import capscore
    from capscore.scores.functional import score_batch

    faces = {"capscore.score": capscore.score, "capscore.score_frame": capscore.score_frame,
             "capscore.score_batch": score_batch}
    assert capscore.score_batch is score_batch
    return faces


def _documented_signature(text: str, name: str) -> ast.arguments:
    """The parameters of the signature ``name(...)`` written at the start of a line of a python block."""
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    starts = [(b, m.end()) for b in blocks for m in re.finditer(rf"^{re.escape(name)}\(", b, re.M)]
    assert len(starts) == 1, f"{name}: {len(starts)} signatures documented; expected one"
    block, i = starts[0]
    depth, j = 1, i
    while depth:
        depth += {"(": 1, ")": -1}.get(block[j], 0)
        j += 1
    return ast.parse(f"def f({block[i:j - 1]}): pass").body[0].args


def compare_signature(documented: ast.arguments, func, *, skip_self: bool = False) -> list[str]:
    """Every way a documented parameter list and ``func``'s signature differ (empty when they agree)."""
    params = list(inspect.signature(func).parameters.values())[1 if skip_self else 0:]
    doc: list[tuple[str, str, object]] = []
    positional = documented.posonlyargs + documented.args
    pad = [inspect.Parameter.empty] * (len(positional) - len(documented.defaults))
    for a, d in zip(positional, pad + [ast.literal_eval(x) for x in documented.defaults]):
        doc.append((a.arg, "POSITIONAL_OR_KEYWORD", d))
    if documented.vararg:
        doc.append((documented.vararg.arg, "VAR_POSITIONAL", inspect.Parameter.empty))
    for a, d in zip(documented.kwonlyargs, documented.kw_defaults):
        doc.append((a.arg, "KEYWORD_ONLY", inspect.Parameter.empty if d is None else ast.literal_eval(d)))
    if documented.kwarg:
        doc.append((documented.kwarg.arg, "VAR_KEYWORD", inspect.Parameter.empty))
    code = [(p.name, p.kind.name, p.default) for p in params]
    problems = []
    for i in range(max(len(doc), len(code))):
        d = doc[i] if i < len(doc) else None
        c = code[i] if i < len(code) else None
        if d != c:
            problems.append(f"parameter {i}: documented {d}, code {c}")
    return problems


@pytest.mark.parametrize("name", ["capscore.score", "capscore.score_frame", "capscore.score_batch"])
def test_the_api_page_gives_each_functions_signature(name):
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    assert compare_signature(_documented_signature(text, name), _faces()[name]) == []


def test_the_api_page_gives_caption_scores_signature():
    pytest.importorskip("torchmetrics")
    from capscore.integrations.torchmetrics import CaptionScore

    text = (DOCS / "api.md").read_text(encoding="utf-8")
    assert compare_signature(_documented_signature(text, "CaptionScore"), CaptionScore.__init__, skip_self=True) == []


def test_the_signature_check_fails_when_either_side_changes_alone():
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    import capscore

    changed = text.replace("batch_size=64, seed=0, context_length=None,\n               skip_bad=False",
                           "batch_size=32, seed=0, context_length=None,\n               skip_bad=False")
    assert changed != text
    assert compare_signature(_documented_signature(changed, "capscore.score"), capscore.score) == [
        "parameter 9: documented ('batch_size', 'KEYWORD_ONLY', 32), code ('batch_size', 'KEYWORD_ONLY', 64)"]

    def score(images, captions, refs=None, *, model="ViT-B-32/openai", metric="clip-s", prefix=None, device="cpu",
              dtype="fp32", cache=None, batch_size=64, seed=0, context_length=None, skip_bad=False, as_frame=False,
              aggregate=False, metric_weights=None):
        """capscore.score with another default metric."""

    assert compare_signature(_documented_signature(text, "capscore.score"), score) == [
        "parameter 4: documented ('metric', 'KEYWORD_ONLY', None), code ('metric', 'KEYWORD_ONLY', 'clip-s')"]
