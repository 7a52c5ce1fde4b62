"""``capscore correlate --scores S --human H`` joins each score row with the judged item it is about: by id, and by
image where both files name one; ids that are line numbers (a file without an id column) are used only where every
row's image confirms its item. A reordered file never pairs other items silently."""
from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.stats as st

from capscore.cli import main

N = 8
RNG = np.random.default_rng(3)
HUMAN = RNG.integers(1, 6, N).astype(float)
SCORE = HUMAN + RNG.normal(0, 1.0, N)  # item k's score
ORDER = [5, 2, 7, 0, 3, 6, 1, 4]  # a reordered copy of the scores file


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _human(tmp_path, *, images=True, name="i{k}.png"):
    return _jsonl(tmp_path / "h.jsonl", [{"id": f"{k + 1}", "score": float(HUMAN[k]),
                                          **({"image": name.format(k=k)} if images else {})} for k in range(N)])


def _scores(tmp_path, order, *, ids="line", images=True, name="/data/imgs/i{k}.png"):
    """Rows of items ``order``: ids 1..N in file order (line numbers) or each item's own id."""
    rows = [{"id": str(n + 1 if ids == "line" else k + 1), "score": float(SCORE[k]),
             **({"image": name.format(k=k)} if images else {})} for n, k in enumerate(order)]
    return _jsonl(tmp_path / "s.jsonl", rows)


def _correlate(tmp_path, scores, human, capsys):
    code = main(["-q", "correlate", "--scores", scores, "--human", human, "--stats", "pearson", "tau_b",
                 "--bootstrap", "0", "--out", str(tmp_path / "o")])
    out, err = capsys.readouterr()
    if code != 0:
        return code, err.strip().splitlines()
    res = json.loads((tmp_path / "o" / "correlate.json").read_text())["results"][0]
    return code, {s["name"]: s["value"] for s in res["stats"]}


EXPECTED = {"pearson": 100 * st.pearsonr(SCORE, HUMAN).statistic,
            "tau_b": 100 * st.kendalltau(SCORE, HUMAN, variant="b").statistic}


@pytest.mark.parametrize("ids", ["line", "own"])
def test_rows_in_the_judgments_order_correlate_item_with_item(tmp_path, capsys, ids):
    code, got = _correlate(tmp_path, _scores(tmp_path, range(N), ids=ids), _human(tmp_path), capsys)
    assert code == 0, got
    assert got == pytest.approx(EXPECTED)


def test_a_reordered_file_of_line_number_ids_is_refused_in_one_line_naming_it(tmp_path, capsys):
    scores = _scores(tmp_path, ORDER)
    code, err = _correlate(tmp_path, scores, _human(tmp_path), capsys)
    assert code == 2 and len(err) == 1, err
    assert f"{scores}: id '1'" in err[0] and "line numbers" in err[0] and "different orders" in err[0]
    assert "/data/imgs/i5.png" in err[0] and "i0.png" in err[0]


def test_a_reordered_file_with_its_own_ids_gives_the_same_numbers(tmp_path, capsys):
    code, got = _correlate(tmp_path, _scores(tmp_path, ORDER, ids="own"), _human(tmp_path), capsys)
    assert code == 0, got
    assert got == pytest.approx(EXPECTED)


@pytest.mark.parametrize("scores_images, human_images, side", [(False, True, "the scores file"),
                                                              (True, False, "the judgments")])
def test_line_number_ids_without_images_to_check_are_refused(tmp_path, capsys, scores_images, human_images, side):
    scores = _scores(tmp_path, range(N), images=scores_images)
    code, err = _correlate(tmp_path, scores, _human(tmp_path, images=human_images), capsys)
    assert code == 2 and len(err) == 1, err
    assert f"error: {scores}: its ids are line numbers (1..{N}" in err[0] and side in err[0]
    assert "cannot be matched with the judgments safely" in err[0]


def test_own_ids_that_name_other_images_are_refused(tmp_path, capsys):
    scores = _scores(tmp_path, range(N), ids="own", name="/data/imgs/other{k}.png")
    code, err = _correlate(tmp_path, scores, _human(tmp_path), capsys)
    assert code == 2 and len(err) == 1 and f"{scores}: id '1'" in err[0] and "other0.png" in err[0], err


def test_own_ids_without_images_join_on_id(tmp_path, capsys):
    code, got = _correlate(tmp_path, _scores(tmp_path, ORDER, ids="own", images=False),
                           _human(tmp_path, images=False), capsys)
    assert code == 0 and got == pytest.approx(EXPECTED)


@pytest.mark.parametrize("human_name", ["i{k}", "imgs/i{k}.png", "/data/imgs/i{k}.png"])
def test_an_image_named_by_its_stem_or_a_shorter_path_is_the_same_image(tmp_path, capsys, human_name):
    code, got = _correlate(tmp_path, _scores(tmp_path, range(N)), _human(tmp_path, name=human_name), capsys)
    assert code == 0 and got == pytest.approx(EXPECTED)


def test_capscore_score_output_of_a_reordered_caption_file_is_refused(tmp_path, capsys):
    """End to end: `capscore score` on a caption file without ids (its ids are line numbers) in the judgments'
    order correlates; on a reordered copy it is refused instead of pairing other captions."""
    from PIL import Image

    (tmp_path / "imgs").mkdir()
    for k in range(N):
        Image.new("RGB", (16, 16), (30 * k, 0, 0)).save(tmp_path / "imgs" / f"i{k}.png")
    human = _human(tmp_path)
    for name, order, want in (("same", range(N), 0), ("reordered", ORDER, 2)):
        caps = _jsonl(tmp_path / f"{name}.jsonl", [{"image": f"i{k}.png", "caption": f"a picture {k}"} for k in order])
        out = tmp_path / f"{name}-scores.jsonl"
        assert main(["-q", "score", "--model", "scenes-tiny", "--images", str(tmp_path / "imgs"), "--captions", caps,
                     "--no-cache", "--out", str(out)]) == 0
        capsys.readouterr()
        code = main(["-q", "correlate", "--scores", str(out), "--human", human, "--bootstrap", "0"])
        err = capsys.readouterr().err
        assert code == want, err
        if want:
            assert err.count("\n") == 1 and str(out) in err and "line numbers" in err
