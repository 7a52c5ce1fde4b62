"""The first five minutes: pipes, typos, missing extras, the report's plots, the licence.

* A closed pipe (``capscore doctor | head -1``) ends every command quietly: nothing on stderr, exit status
  141 (128 + SIGPIPE, as the shell reports a Unix tool stopped by the signal). Tested with real pipes in
  subprocesses: a reader that is gone before the command writes (``| true``), and ``| head -1``.
* A mistyped command gets a did-you-mean; a suite without data names the flag to give.
* ``capscore report`` without matplotlib writes a page of tables that says why it has no plots.
* Report plots: whole-number ticks on count and step axes, legends beside the plot, one training panel per
  logged quantity (so a loss near 1 is not drawn flat on the axis of a gradient norm near 100).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from capscore.cli import EXIT_CLOSED_PIPE, main

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
       "OMP_NUM_THREADS": "1"}
CLI = [sys.executable, "-m", "capscore.cli"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("pipes")
    def rows(s: float) -> str:
        return "".join(json.dumps({"id": f"c{i}", "image": f"i{i}", "caption": "x", "score": s * i}) + "\n"
                       for i in range(6))

    (d / "a.jsonl").write_text(rows(0.1))
    (d / "b.jsonl").write_text(rows(0.2))
    (d / "h.jsonl").write_text("".join(json.dumps({"id": f"c{i}", "score": i % 3}) + "\n" for i in range(6)))
    return d


def commands(d: Path) -> dict[str, list[str]]:
    return {
        "help": ["--help"],
        "doctor": ["doctor", "--data-root", str(d), "--weights-root", str(d)],
        "models": ["models", "--arch"],
        "compare": ["compare", str(d / "a.jsonl"), str(d / "b.jsonl"), "--resamples", "50"],
        "correlate": ["correlate", "--scores", str(d / "a.jsonl"), "--human", str(d / "h.jsonl"), "--bootstrap", "0"],
        "reproduce": ["reproduce", "--list"],
    }


@pytest.mark.parametrize("name,buffered", [("help", True), ("help", False), ("doctor", True), ("models", True),
                                           ("models", False), ("compare", True), ("correlate", True),
                                           ("reproduce", True)])
def test_a_reader_that_is_gone_ends_the_command_quietly(files, name, buffered):
    """stdout is a real pipe whose reading end was closed before capscore started: every write fails with
    EPIPE (Python ignores SIGPIPE), as after ``| head -1`` has exited; with Python's own buffering or
    without it (PYTHONUNBUFFERED=1)."""
    env = {k: v for k, v in ENV.items() if k != "PYTHONUNBUFFERED"} | ({} if buffered else {"PYTHONUNBUFFERED": "1"})
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.run(CLI + commands(files)[name], stdout=w, stderr=subprocess.PIPE, text=True, env=env,
                              timeout=300)
    finally:
        os.close(w)
    assert (proc.returncode, proc.stderr) == (EXIT_CLOSED_PIPE, "")


def test_head_gets_the_first_line_and_capscore_ends_quietly(files):
    argv = " ".join(f"'{a}'" for a in CLI + ["reproduce", "--list"])
    proc = subprocess.run(["bash", "-c", f"{argv} 2>{files / 'head.err'} | head -1; echo status ${{PIPESTATUS[0]}}"],
                          capture_output=True, text=True, env=ENV, timeout=300)
    first, status = proc.stdout.splitlines()
    assert re.fullmatch(r"[a-z0-9-]+ \(\d+ rows.*\)", first)  # the first table's title line, e.g. "pac-s-foil (8 rows)"
    assert status in ("status 0", f"status {EXIT_CLOSED_PIPE}")  # 0 when all was written before head closed
    assert (files / "head.err").read_text() == ""


def test_a_closed_stdout_in_process_is_141_not_a_bug(files, capsys, monkeypatch):
    """The same rule inside main(): a BrokenPipeError from print is the closed-pipe exit, not 'this is a bug'."""
    import builtins

    def broken(*a, **k):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(builtins, "print", broken)
    assert main(["-q", "compare", str(files / "a.jsonl"), str(files / "b.jsonl"), "--resamples", "20"]) == 141
    monkeypatch.undo()
    assert "bug" not in capsys.readouterr().err


# ----------------------------------------------------------------------------- typos and missing data
@pytest.mark.parametrize("typed,suggested", [("scroe", "'score'"), ("corelate", "'correlate'"),
                                            ("reprodcue", "'reproduce'"), ("reprot", "'report'")])
def test_a_mistyped_command_gets_did_you_mean(typed, suggested, capsys):
    assert main([typed, "--model", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"unknown command {typed!r}; did you mean" in err and suggested in err


def test_a_suite_family_by_its_first_word(capsys):
    assert main(["-q", "probe", "--suite", "aro", "--model", "scenes-tiny", "--out", "x"]) == 2
    err = capsys.readouterr().err
    assert "unknown suite 'aro'; did you mean 'aro-vg-relation', 'aro-vg-attribution', 'aro-coco-order'" in err


@pytest.mark.parametrize("suite", ["sugarcrepe", "winoground", "retrieval"])
def test_a_suite_without_data_names_the_flag(suite, tmp_path, capsys):
    assert main(["-q", "probe", "--suite", suite, "--model", "scenes-tiny", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give --data" in err and "load_inputs" not in err and "'data'" not in err


# ----------------------------------------------------------------------------- report without matplotlib
def _rows(folder: Path, systems=("A", "B"), n=3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"{s}{i}", "image": f"i{i}.png", "caption": "c", "system": s, "model": "m", "metric": "clip-s",
             "score": 0.5 + 0.1 * i + 0.05 * k} for k, s in enumerate(systems) for i in range(n)]
    p = folder / "s.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_report_without_matplotlib_is_a_page_of_tables_saying_so(tmp_path):
    _rows(tmp_path / "run")
    code = ("import sys; sys.modules['matplotlib'] = None\n"  # as if the report extra were not installed
            "from capscore.cli import main\n"
            f"sys.exit(main(['report', {str(tmp_path / 'run')!r}, '--out', {str(tmp_path / 'p.html')!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "plots need matplotlib" in proc.stdout and "capscore[report]" in proc.stdout
    page = (tmp_path / "p.html").read_text()
    assert "plots need matplotlib" in page and "<img" not in page and "<table" in page


# ----------------------------------------------------------------------------- the plots themselves
@pytest.fixture
def figures(monkeypatch):
    """Every figure the report draws, kept instead of being turned into a PNG."""
    from capscore.report import html

    made = []
    monkeypatch.setattr(html, "img", lambda fig, alt: made.append((fig, alt)) or "")
    return made


def test_count_axes_have_whole_ticks_and_legends_sit_beside_the_lines(tmp_path, figures):
    from capscore.report.html import render
    from capscore.report.runs import discover

    _rows(tmp_path / "run")
    render(discover([tmp_path / "run"]))
    (fig, alt), = [f for f in figures if "score distribution" in f[1]]
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # lays the figure out as the PNG would be
    renderer = canvas.get_renderer()
    hist = fig.axes[0]
    ticks = [t for t in hist.get_yticks() if hist.get_ylim()[0] <= t <= hist.get_ylim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)  # 'captions' is a count
    legend = hist.get_legend()
    assert legend.get_window_extent(renderer).x0 >= hist.get_window_extent(renderer).x1 - 1  # beside, not over


def test_each_training_quantity_has_its_own_axis(tmp_path, figures):
    from capscore.report.html import render
    from capscore.report.runs import discover

    run = tmp_path / "train"
    run.mkdir()
    lines = [{"step": k, "lr": 1e-3, "loss": 1.0 - 0.02 * k, "grad_norm": 100.0 + k, "accuracy": 0.5 + 0.01 * k}
             for k in range(1, 11)]
    lines.insert(0, {"step": 0, "eval": {"r1": 0.2, "tau": 30.0}})
    lines.append({"step": 10, "eval": {"r1": 0.4, "tau": 40.0}})
    (run / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    render(discover([run]))
    (fig, _), = [f for f in figures if "training" in f[1]]
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert sorted(ax.get_title() for ax in shown) == sorted(["loss", "grad_norm", "accuracy", "lr", "eval: r1",
                                                             "eval: tau"])
    loss = next(ax for ax in shown if ax.get_title() == "loss")
    assert len(loss.get_lines()) == 1
    lo, hi = loss.get_ylim()
    assert hi - lo < 1.0  # the loss (0.8..0.98) fills its axis; on the grad-norm axis it would be a flat line
    for ax in shown:  # steps are whole numbers
        assert all(float(t).is_integer() for t in ax.get_xticks())


def test_the_licence_is_the_one_pyproject_names():
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("MIT License") and "Copyright (c) the capscore authors" in text
    assert 'license = {text = "MIT"}' in (REPO / "pyproject.toml").read_text()
