"""Hostile inputs on the newest surfaces, found by a second pass over them (docs/research/hostile-inputs-53.md,
"second pass"): lone surrogates in JSON text, printed magnitudes, correlate's flags and counts, a metric's
name on an undefined correlation, training sizes that look like a hang, empty recipe strings, --set items.
Each is one line naming the file, line, item or flag, and exit 2 — or, where the input is valid, the right
output."""
from __future__ import annotations

import json
import re

import pytest

from capscore.errors import InputError
from test_hostile_inputs import assert_one_error, run  # one-line error checks, shared

pytest.importorskip("pycocoevalcap")

ROWS = [{"id": str(i), "image": f"i{i}.png", "caption": "a dog runs", "refs": ["a dog running", "a dog"]}
        for i in range(4)]


def _jsonl(path, first: str, rows=ROWS[1:]):
    path.write_text(first + "\n" + "".join(json.dumps(r) + "\n" for r in rows))
    return path


# ------------------------------------------------------------------------------------ lone surrogates
@pytest.mark.parametrize("first, what", [
    ('{"id": "0", "image": "i0.png", "caption": "a \\ud800 dog", "refs": ["a dog"]}', "caption"),
    ('{"id": "0", "image": "i0.png", "caption": "a dog", "refs": ["a \\udfff dog"]}', "reference"),
    ('{"id": "\\udc80", "image": "i0.png", "caption": "a dog", "refs": ["a dog"]}', "id"),
])
def test_a_lone_surrogate_escape_in_a_jsonl_line_is_one_line_naming_it(tmp_path, capsys, first, what):
    """`json` accepts "\\ud800" without its pair; no output file can hold it (the rows writer failed with
    UnicodeEncodeError, exit 1 "this is a bug"). It is a bad line: exit 2 naming FILE:1, or with --skip-bad
    an error row (and the other rows scored)."""
    f = _jsonl(tmp_path / "c.jsonl", first)
    code, _, err = run(["score", "--captions", f, "--metric", "bleu4", "--tokenizer", "simple",
                        "--out", tmp_path / "o.jsonl"], capsys)
    assert_one_error(code, err, "c.jsonl:1", "lone surrogate")
    code, _, err = run(["score", "--skip-bad", "--captions", f, "--metric", "bleu4", "--tokenizer", "simple",
                        "--out", tmp_path / "o2.jsonl"], capsys)
    assert code == 0, err
    rows = [json.loads(ln) for ln in (tmp_path / "o2.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 4 and rows[0]["score"] is None and "c.jsonl:1" in rows[0]["error"]
    assert all(r["score"] is not None for r in rows[1:])


def test_a_surrogate_pair_is_one_character_and_scores(tmp_path, capsys):
    f = _jsonl(tmp_path / "c.jsonl", '{"id": "0", "image": "i0.png", "caption": "a dog \\ud83d\\ude00", '
                                     '"refs": ["a dog"]}')
    code, _, err = run(["score", "--captions", f, "--metric", "bleu4", "--tokenizer", "simple",
                        "--out", tmp_path / "o.jsonl"], capsys)
    assert code == 0, err
    first = json.loads((tmp_path / "o.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert first["caption"] == "a dog \U0001F600" and first["score"] is not None


def test_a_lone_surrogate_in_a_json_captions_file_and_in_a_judgment_file(tmp_path, capsys):
    (tmp_path / "c.json").write_text('{"i0.png": "a dog \\ud800"}')
    (tmp_path / "r.json").write_text('{"i0.png": ["a dog"]}')
    code, _, err = run(["score", "--captions", tmp_path / "c.json", "--refs", tmp_path / "r.json", "--metric",
                        "bleu4", "--tokenizer", "simple", "--out", tmp_path / "o.jsonl"], capsys)
    assert_one_error(code, err, "c.json", "lone surrogate")
    from capscore.meta.datasets import load_flickr8k

    (tmp_path / "f8k.json").write_text('{"k1": {"image_path": "a.jpg", "ground_truth": ["x"], '
                                       '"human_judgement": [{"caption": "a \\udbff", "rating": 2}]}}')
    with pytest.raises(InputError, match="f8k.json: .*lone surrogate"):
        load_flickr8k(tmp_path / "f8k.json", tmp_path, variant="expert")


def test_the_api_names_the_item_holding_a_lone_surrogate():
    import capscore

    with pytest.raises(InputError, match=r"captions\[1\]: the caption holds a lone surrogate"):
        capscore.score(None, ["a dog", "a \ud800 dog"], [["a dog"], ["a dog"]], metric="bleu4")
    with pytest.raises(InputError, match=r"captions\[0\]: a reference holds a lone surrogate"):
        capscore.score(None, ["a dog"], [["a \udc00dog"]], metric="rouge-l")


def test_the_rows_writer_never_fails_on_a_cell_that_is_not_text(tmp_path):
    """Last line of defence (an error row keeps what the input said): a lone surrogate is written as U+FFFD."""
    from capscore.report.writers import RowWriter

    w = RowWriter(tmp_path / "o.jsonl", "jsonl", existing=False, columns=("id", "caption", "score", "error"))
    w.write([{"id": "a\udc80", "caption": "x\ud800", "score": None, "error": "bad"}])
    w.close()
    row = json.loads((tmp_path / "o.jsonl").read_text(encoding="utf-8"))
    assert row["id"] == "a\ufffd" and row["caption"] == "x\ufffd"


# ------------------------------------------------------------------------------------ compare, correlate
def _scores(path, values, metric="clip-s"):
    path.write_text("".join(json.dumps({"id": str(i), "image": f"i{i}.png", "caption": "x", "metric": metric,
                                        "score": v, "error": None}) + "\n" for i, v in enumerate(values)))
    return path


def test_compare_prints_huge_finite_means_in_exponent_notation(tmp_path, capsys):
    """Scores of ±1e300 are finite and compared; their means print as 2.5000e+299, not 300 digits."""
    a = _scores(tmp_path / "a.jsonl", [0.1, 0.5, 0.3, 0.7])
    b = _scores(tmp_path / "b.jsonl", [1e300, -1e300, 1e300, 0.0])
    code, out, err = run(["compare", a, b, "--resamples", "200"], capsys)
    assert code == 0, err
    assert "2.5000e+299" in out and "-2.5000e+299" in out  # mean B = (1e300 - 1e300 + 1e300 + 0) / 4, by hand
    assert not re.search(r"\d{20}", out), out


def test_correlate_alpha_out_of_range_names_the_flag(tmp_path, capsys):
    s = _scores(tmp_path / "s.jsonl", [0.1, 0.5, 0.3, 0.7])
    h = _scores(tmp_path / "h.jsonl", [1, 3, 2, 4])
    for alpha in ("2", "0", "1", "nan"):
        code, _, err = run(["correlate", "--scores", s, "--human", h, "--alpha", alpha], capsys)
        line = assert_one_error(code, err, "--alpha", "(0, 1)" if alpha != "nan" else "finite")
        assert "CorrelateJob" not in line


def test_reproduce_names_the_metric_whose_scores_are_constant(tmp_path, capsys):
    """Every caption of the table's dataset gets the same BLEU-4: the correlation is undefined, and the one
    line says for which metric and dataset (a table runs many)."""
    from PIL import Image

    root = tmp_path / "data" / "composite"
    root.mkdir(parents=True)
    lines = ["imgid,mt,refs,score"]
    for i in range(6):
        Image.new("RGB", (8, 8), "red").save(root / f"im{i}.jpg")
        lines.append(f"im{i}.jpg,a dog on the grass,\"['a dog on grass']\",{1 + i % 5}")
    (root / "composite.csv").write_text("\n".join(lines) + "\n")
    table = tmp_path / "t.csv"
    table.write_text("dataset,split,metric,backbone,model,statistic,paper,tolerance,source\n"
                     "composite,test,bleu4,-,-,tau_b,28.3,0.5,a test row\n")
    code, _, err = run(["reproduce", table, "--data-root", tmp_path / "data"], capsys)
    assert_one_error(code, err, "bleu4 on composite", "constant")


# ------------------------------------------------------------------------------------ training
TRAIN = '[train]\nmodel = "openclip:scenes-tiny-v1"\ndata = "scenes:8"\nsteps = 2\neval_scenes = 0\n'


@pytest.mark.parametrize("extra, names", [
    ("accum = 1000000000\n", ["'accum'", "65,536"]),  # was: a first step of 10^9 micro-batches (a hang)
    ("accum = 65536\nbatch_size = 65536\n", ["'accum'", "examples per step"]),
    ('model = ""\n', ["'model'", "non-empty"]),  # was: silently the recipe's default model
    ('data = " "\n', ["'data'", "non-empty"]),
])
def test_training_sizes_and_empty_strings_are_one_line(tmp_path, capsys, extra, names):
    f = tmp_path / "r.toml"
    key = extra.split(" =")[0]
    f.write_text('recipe = "contrastive"\n' + "".join(ln + "\n" for ln in TRAIN.splitlines() if
                                                     not ln.startswith(key + " ")) + extra)
    code, _, err = run(["train", "contrastive", "--config", f, "--out", tmp_path / "out"], capsys)
    assert_one_error(code, err, "r.toml", *names)
    assert not (tmp_path / "out").exists()


def test_set_without_equals_names_the_flag(tmp_path, capsys):
    code, _, err = run(["train", "contrastive", "--set", "lr", "--out", tmp_path / "out"], capsys)
    line = assert_one_error(code, err, "--set", "KEY=VALUE", "'lr'")
    assert "build_stages" not in line


def test_report_names_the_row_holding_a_lone_surrogate(tmp_path, capsys):
    f = tmp_path / "r.jsonl"
    f.write_text('{"id": "\\ud800", "image": "i", "caption": "x", "metric": "clip-s", "score": 0.1, "error": null}\n')
    code, _, err = run(["report", f, "--out", tmp_path / "r.html"], capsys)
    assert_one_error(code, err, "r.jsonl:1", "lone surrogate")


def test_a_captions_file_whose_name_is_not_utf8_scores_resumes_and_reports(tmp_path, capsys):
    """The system is named after the file; a name that is not UTF-8 (b'\\xfe.jsonl', carried by Python as a
    lone surrogate) is shown as U+FFFD in the rows, the summary keeps the path as given (so --resume finds
    it equal), and the report renders (was exit 1 "this is a bug": the summary writer failed)."""
    import os

    name = os.fsdecode(b"\xfe.jsonl")
    f = tmp_path / name
    f.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = tmp_path / "o.jsonl"
    argv = ["score", "--captions", f, "--metric", "bleu4", "--tokenizer", "simple", "--out", out]
    code, _, err = run(argv, capsys)
    assert code == 0, err
    rows = [json.loads(ln) for ln in out.read_text(encoding="utf-8").splitlines()]
    assert {r["system"] for r in rows} == {"\ufffd"} and len(rows) == 4
    summary = json.loads((tmp_path / "o.jsonl.summary.json").read_text(encoding="utf-8"))
    assert summary["captions"] == [str(f)]
    code, _, err = run([*argv, "--resume"], capsys)
    assert code == 0, err
    assert len(out.read_text(encoding="utf-8").splitlines()) == 4  # nothing doubled
    code, _, err = run(["report", out, "--out", tmp_path / "r.html"], capsys)
    assert code == 0, err


def test_spice_with_broken_corenlp_jars_says_what_is_wrong_with_them(tmp_path, monkeypatch):
    """A 0-byte jar or an HTML page saved as one (doctor calls them MISSING) is named with its problem
    when SPICE is asked for, not only 'put them in DIR' while they are there."""
    from capscore.errors import CapscoreError
    from capscore.scores import classic

    (tmp_path / "stanford-corenlp-3.6.0.jar").write_bytes(b"")
    (tmp_path / "stanford-corenlp-3.6.0-models.jar").write_text("<html>")
    monkeypatch.setenv("CAPSCORE_SPICE_DIR", str(tmp_path))
    monkeypatch.setattr("capscore.embed.cache.DEFAULT_CACHE_DIR", tmp_path / "cache")
    with pytest.raises(CapscoreError, match=r"stanford-corenlp-3.6.0.jar: empty \(0 bytes\); .*models.jar: not a jar"):
        classic.classic_score("spice", ["a dog"], [["a dog"]], tokenizer="none")


@pytest.mark.skipif(__import__("shutil").which("java") is None, reason="no Java (PTB tokenizer)")
def test_compare_refuses_a_classic_metric_on_other_tokens(tmp_path, capsys):
    """BLEU-4 on PTB tokens and BLEU-4 on the simple tokenizer's are two definitions of the metric (as two
    metrics are); the summaries say which, and compare refuses the pair. The backends agree to 1e-12 and
    are compared."""
    caps = tmp_path / "c.jsonl"
    caps.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:3]) + json.dumps(
        {"id": "3", "image": "i3.png", "caption": "two cats sleep", "refs": ["two cats asleep"]}) + "\n")
    outs = {}
    for name, extra in (("ptb", ["--tokenizer", "ptb"]), ("simple", ["--tokenizer", "simple"]),
                        ("pycoco", ["--tokenizer", "simple", "--classic-backend", "pycocoevalcap"])):
        outs[name] = tmp_path / f"{name}.jsonl"
        code, _, err = run(["score", "--captions", caps, "--metric", "bleu4", *extra, "--out", outs[name]], capsys)
        assert code == 0, err
    code, _, err = run(["compare", outs["ptb"], outs["simple"], "--resamples", "100"], capsys)
    assert_one_error(code, err, "ptb.jsonl holds bleu4 on ptb tokens", "simple tokens")
    code, out, err = run(["compare", outs["simple"], outs["pycoco"], "--resamples", "100"], capsys)
    assert code == 0, err
