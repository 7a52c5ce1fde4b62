"""`capscore report`: a self-contained HTML page from real score/probe/correlate/train/explain runs.

The run folders are made by the real commands (in-process, scenes-tiny, tiny sizes); expected
numbers are recomputed here from those commands' own output files with numpy/scipy.
"""
from __future__ import annotations

import html
import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from scipy import stats as st

from capscore.cli import main

PWNED = "<script>document.title='pwned'</script>"
TRAIN_LOG = [{"step": 0, "eval": {"r1_i2t": 0.5, "oracle_tau": 0.25}},
             {"step": 1, "lr": 1e-6, "loss": 2.0, "sec": 0.5}, {"step": 2, "lr": 2e-6, "loss": 1.5, "sec": 0.5},
             {"step": 2, "eval": {"r1_i2t": 0.75, "oracle_tau": 0.375}}]
SECTIONS = ("scores", "lgip", "perturb", "specificity", "correlation", "training", "explain")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from capscore.scenes import generate_scenes

    root = tmp_path_factory.mktemp("runs")
    img_dir = root / "images"
    img_dir.mkdir()
    scenes = generate_scenes(3, seed=0)
    for s in scenes:
        s.render().save(img_dir / f"{s.id}.png")
    caps = [{"image": s.id, "caption": s.short_caption(), "system": "truth"} for s in scenes]
    caps += [{"image": scenes[0].id, "caption": f"{PWNED} a blue circle", "system": "bad<b>"},
             {"image": scenes[1].id, "caption": "A red circle.", "system": "bad<b>"},
             {"image": scenes[2].id, "caption": "Three green stars.", "system": "bad<b>"}]
    (root / "caps.jsonl").write_text("".join(json.dumps(c) + "\n" for c in caps))
    q = ["-q"]
    assert main(q + ["score", "--model", "scenes-tiny", "--images", str(img_dir),
                     "--captions", str(root / "caps.jsonl"),
                     "--out", str(root / "score" / "scores.jsonl"), "--no-cache"]) == 0
    for suite in ("scenes-lgip", "scenes-perturb", "scenes-specificity"):
        assert main(q + ["probe", "--model", "scenes-tiny", "--suite", suite, "--n-scenes", "3",
                         "--out", str(root / "probes")]) == 0
    assert main(q + ["correlate", "--dataset", "scenes-oracle", "--scenes", "4", "--model", "scenes-tiny",
                     "--metric", "clip-s", "refclip-s", "--bootstrap", "20", "--no-cache",
                     "--out", str(root / "corr")]) == 0
    # train's log.jsonl as train/loop.py writes it (a real 2-step run with evaluation takes ~20 s here)
    (root / "train").mkdir()
    (root / "train" / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in TRAIN_LOG))
    (root / "explain").mkdir()
    assert main(q + ["explain", "--model", "scenes-tiny", "--image", str(img_dir / f"{scenes[0].id}.png"),
                     "--caption", f"{PWNED} a red triangle", "--word", "triangle",
                     "--out", str(root / "explain" / "heat.png")]) == 0
    out = root / "report.html"
    dirs = [str(root / d) for d in ("score", "probes", "corr", "train", "explain")]
    assert main(q + ["report", *dirs, "--out", str(out), "--title", f"runs {PWNED}"]) == 0
    return root, out, out.read_text(encoding="utf-8")


def _section(page: str, sid: str) -> str:
    m = re.search(rf'<section id="{sid}">(.*?)</section>', page, re.S)
    assert m, f"section {sid} missing"
    return m.group(1)


def _cells(fragment: str) -> list[list[str]]:
    return [[html.unescape(re.sub("<[^>]+>", "", c)) for c in re.findall(r"<td>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr>(.*?)</tr>", fragment, re.S)]


def test_every_section_has_its_plot_and_the_page_is_self_contained(runs):
    _, _, page = runs
    for sid in SECTIONS:
        body = _section(page, sid)
        assert re.search(r'<img class="plot" alt="[^"]*" src="data:image/png;base64,[A-Za-z0-9+/=]{200,}">', body), sid
    # nothing is fetched at view time: every src/href is inline data or an in-page anchor, no script at all
    assert all(v.startswith("data:image/png;base64,") for v in re.findall(r'src="([^"]*)"', page))
    assert all(v.startswith("#") for v in re.findall(r'href="([^"]*)"', page))
    assert "<script" not in page.lower() and "url(" not in page


def test_user_text_is_escaped_never_raw(runs):
    _, _, page = runs
    escaped = html.escape(PWNED, quote=True)
    assert f"<title>runs {escaped}</title>" in page
    assert f"{escaped} a blue circle" in _section(page, "scores")  # a caption from the score rows
    assert f"{escaped} a red triangle" in _section(page, "explain")  # the caption stored in the explain PNG
    assert "bad&lt;b&gt;" in page and "bad<b>" not in page  # a system name


def test_score_table_matches_the_rows(runs):
    root, _, page = runs
    rows = [json.loads(x) for x in (root / "score" / "scores.jsonl").read_text().splitlines()]
    table = {r[0]: r for r in _cells(_section(page, "scores")) if len(r) == 7}
    for system in ("truth", "bad<b>"):
        x = np.array([r["score"] for r in rows if r["system"] == system])
        name, n, mean, median, std, lo, hi = table[system]
        assert int(n) == len(x)
        assert [float(v) for v in (mean, median, std, lo, hi)] == pytest.approx(
            [x.mean(), np.median(x), x.std(), x.min(), x.max()], abs=6e-5)


def test_perturb_percentages_follow_pr_mcs_table_7(runs):
    """% = (mean perturbed - mean original) / mean original x 100 (PR-MCS Table 7: 1.0562 vs 1.0659 -> -0.91%)."""
    root, _, page = runs
    rows = [json.loads(x) for x in (root / "probes" / "scenes-perturb__scenes-tiny.jsonl").read_text().splitlines()]
    body = _section(page, "perturb")
    head = [html.unescape(h) for h in re.findall(r"<th>(.*?)</th>", body)]
    kinds = head[2:head.index("average") + 1]
    lang_row = next(r for r in _cells(body) if len(r) == len(kinds) + 2)
    for kind, cell in zip(kinds, lang_row[2:]):
        if kind == "average":
            continue
        pairs = np.array([(r["score"], r["perturbed_score"]) for r in rows
                          if r["kind"] == kind and r["perturbed_score"] is not None])
        pct = 100 * (pairs[:, 1].mean() - pairs[:, 0].mean()) / pairs[:, 0].mean()
        m = re.fullmatch(r"(-?[\d.]+) \(([+-][\d.]+)%\)", cell)
        assert m, cell
        assert float(m.group(1)) == pytest.approx(pairs[:, 1].mean(), abs=6e-5)
        assert float(m.group(2)) == pytest.approx(pct, abs=6e-3)


def test_correlation_table_and_scatter_data(runs):
    root, _, page = runs
    res = json.loads((root / "corr" / "correlate.json").read_text())["results"]
    rows = _cells(_section(page, "correlation"))
    for r in res:
        tau = next(s for s in r["stats"] if s["name"] == "tau_b")
        row = next(x for x in rows if x and x[0] == r["metric"])
        assert f"{tau['value']:.1f} [{tau['ci_low']:.1f}, {tau['ci_high']:.1f}]" in row
        # the scatter's points are the pairs behind the statistic
        items = [json.loads(x) for x in (root / "corr" / "correlate_items.jsonl").read_text().splitlines()]
        mine = [i for i in items if i["metric"] == r["metric"]]
        assert len(mine) == r["n"] == 24  # 4 scenes x 6 captions
        expect = 100 * st.kendalltau([i["score"] for i in mine], [i["human"] for i in mine]).statistic
        assert tau["value"] == pytest.approx(expect)


def test_significance_of_metrics_and_of_systems_is_on_the_page(runs):
    """correlate's p-value matrices and best cluster, and score's paired tests between systems, as written."""
    root, _, page = runs
    sig = json.loads((root / "corr" / "correlate.json").read_text())["significance"]
    corr = html.unescape(re.sub(r"<[^>]+>", " ", _section(page, "correlation")))
    assert "cluster of the best:  " + ", ".join(sig["cluster"]) in corr
    for row in sig["tau_p"]:
        for v in row:
            assert v is None or f"{v:.3f}" in corr
    (t,) = json.loads((root / "score" / "scores.jsonl.summary.json").read_text())["system_tests"]
    scores = html.unescape(re.sub(r"<[^>]+>", " ", _section(page, "scores")))
    p, resamples = t["tests"][1]["p_value"], t["tests"][1]["n_resamples"]
    assert resamples == 1000  # so p is shown to 3 decimals, or as below the resolution 1/1000
    assert "paired tests between systems" in scores and (f"{p:.3f}" if p >= 0.001 else "< 0.001") in scores
    assert "bad&lt;b&gt;" in _section(page, "scores")  # the system's name stays escaped


def test_training_section_reads_the_log(runs):
    _, _, page = runs
    body = _section(page, "training")
    assert ["r1_i2t", "0.5000", "0.7500"] in _cells(body) and ["oracle_tau", "0.2500", "0.3750"] in _cells(body)


def test_explain_png_keeps_a_fixed_colour_range_and_its_description(runs, tmp_path, capsys):
    from PIL import Image

    root, _, _ = runs
    about = json.loads(Image.open(root / "explain" / "heat.png").text["capscore-explain"])
    assert about["color_range"] == [-1.0, 1.0] and about["word"] == "triangle"
    assert about["caption"] == f"{PWNED} a red triangle" and about["min"] <= about["max"]
    rc = main(["explain", "--model", "scenes-tiny", "--image", str(root / "explain" / "heat.png"), "--caption",
               "a red triangle", "--word", "red", "--color-range", "0.5", "0.1", "--out", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "LOW < HIGH" in err


def test_bad_inputs_are_one_line_errors(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for argv, what in ((["report", str(tmp_path / "empty"), "--out", str(tmp_path / "r.html")], "no capscore outputs"),
                       (["report", str(tmp_path / "nope"), "--out", str(tmp_path / "r.html")], "not found"),
                       (["report", str(tmp_path), "--out", str(tmp_path / "r.pdf")], ".html")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("capscore: error: ") and err.count("\n") == 1 and what in err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "correlate.json").write_text('{"results": [\n oops')
    assert main(["report", str(tmp_path / "bad"), "--out", str(tmp_path / "r.html")]) == 2
    assert f"{tmp_path / 'bad' / 'correlate.json'}:2: malformed JSON" in capsys.readouterr().err


def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _browse(chrome, tmp_path, page, *extra):
    cmd = [chrome, "--headless=new", "--disable-gpu", "--no-sandbox", "--enable-logging=stderr", "--v=0",
           f"--user-data-dir={tmp_path / 'profile'}", *extra, page.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (Debian: apt-get install chromium)")
def test_page_in_headless_chromium(runs, tmp_path):
    from PIL import Image

    chrome = _chromium()
    _, out, _ = runs
    # the check can fail: a page with a script error and a script setting the title is caught
    bad = tmp_path / "bad.html"
    bad.write_text(f"<html><head><title>x</title></head><body>{PWNED}<script>nosuch()</script></body></html>")
    p = _browse(chrome, tmp_path, bad, "--dump-dom")
    assert "<title>pwned</title>" in p.stdout and ":CONSOLE" in p.stderr

    shot = tmp_path / "shot.png"
    p = _browse(chrome, tmp_path, out, "--dump-dom", f"--screenshot={shot}", "--window-size=1280,2000",
                "--hide-scrollbars")
    assert p.returncode == 0, p.stderr[-2000:]
    console = [ln for ln in p.stderr.splitlines() if ":CONSOLE" in ln]  # errors, CSP violations, any log
    assert not console, console
    title = html.unescape(re.search(r"<title>(.*?)</title>", p.stdout, re.S).group(1))
    assert title == f"runs {PWNED}"  # shown as text: document.title was never set to 'pwned'
    assert p.stdout.count("data:image/png;base64,") >= len(SECTIONS)
    assert shot.exists(), p.stderr[-2000:]
    im = np.asarray(Image.open(shot).convert("RGB"))
    assert im.shape[:2] == (2000, 1280)
    assert im.std() > 20  # not a blank page
    assert len(np.unique(im.reshape(-1, 3), axis=0)) > 50  # text, plots, header colours
    assert (np.abs(im - [0x23, 0x39, 0x5D]).sum(-1) < 10).mean() > 0.01  # the header band rendered
