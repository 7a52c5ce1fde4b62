"""`capscore demo` end to end (reduced size): files, numbers recomputed from its own rows, determinism."""
from __future__ import annotations

import json

from capscore.cli import main


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_demo_end_to_end(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--n", "10", "--seed", "3"]) == 0
    printed = capsys.readouterr().out
    assert "color" in printed and "correct wins" in printed and str(out) in printed
    summary = json.loads((out / "summary.json").read_text())
    rows = _rows(out / "scores.jsonl")
    assert len(list((out / "images").glob("*.png"))) == 10
    assert sum(r["system"] == "correct" for r in rows) == 10
    assert all(r["error"] is None and 0.0 <= r["score"] <= 2.5 for r in rows)
    # the probe, recomputed by hand from the per-caption rows
    by_id = {r["id"]: r["score"] for r in rows}
    for kind, p in summary["probe"].items():
        ids = [i[: -len("/correct")] for i in by_id if i.endswith(f"/{kind}/correct")]
        wins = [by_id[i + "/correct"] > by_id[i + "/flawed"] for i in ids]
        assert p["n"] == len(ids) and abs(p["correct_wins"] - sum(wins) / len(wins)) < 1e-12
    # oracle: true captions have F1 > 0; a flawed twin states the same or more facts with >= 1 false,
    # so its F1 is strictly below its correct twin's (it may be 0: a one-mention caption, all wrong)
    f1 = {r["id"]: r["oracle_f1"] for r in rows}
    assert all(v > 0 for k, v in f1.items() if not k.endswith("/flawed"))
    pairs = [(f1[k], f1[k[: -len("flawed")] + "correct"]) for k in f1 if k.endswith("/flawed")]
    assert pairs and all(bad < good for bad, good in pairs)
    assert summary["oracle_f1"]["short"] > summary["oracle_f1"]["flawed"]
    assert summary["seed"] == 3 and summary["backbone_identity"].startswith("open_clip:scenes-tiny|w=")

    again = tmp_path / "again"
    assert main(["demo", "--out", str(again), "--n", "10", "--seed", "3"]) == 0
    assert json.loads((again / "summary.json").read_text()) == summary
    assert _rows(again / "scores.jsonl") == [dict(r, image=r["image"].replace(str(out), str(again))) for r in rows]


def test_demo_bad_model_is_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "nothing"
    assert main(["demo", "--out", str(out), "--model", "scenes-tinny"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("capscore: error:") and err.count("\n") == 1
    assert not out.exists()
