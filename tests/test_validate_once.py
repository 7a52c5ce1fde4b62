"""One check per public boundary: the typed job checks itself once, before any model loads; its errors name
parameters from the library and flags on the command line (errors.OptionError's fields)."""
from __future__ import annotations

from pathlib import Path

import pytest

from capscore.data.images import ImageRef
from capscore.data.records import Record
from capscore.data.sources import InMemory
from capscore.errors import CapscoreError, OptionError
from capscore.pipeline import FileOutput, ScoreJob, ShardFolder

NOT_A_MODEL = "no-such-model-is-ever-loaded"  # the job is checked before a model is looked up


def _job(**kw) -> ScoreJob:
    source = InMemory((Record.make("1", ImageRef(path=Path("a.png")), "a dog"),))
    return ScoreJob(**{"source": source, "models": (NOT_A_MODEL,), "metrics": ("clip-s",), **kw})


def test_an_option_error_spells_parameters_for_the_library_and_flags_for_the_command_line():
    e = OptionError("{metrics:--metric} {{x}} with {chunk_size} and {resume}")
    assert str(e) == "metrics {x} with chunk_size and resume"
    assert e.on_command_line() == "--metric {x} with --chunk-size and --resume"


@pytest.mark.parametrize("kw, library", [
    ({"metrics": ("emscore",)}, "metrics 'emscore' scores videos, not images; use it with videos"),
    ({"metrics": ("clip-z",)}, "unknown metric 'clip-z'; did you mean 'clip-s'"),
    ({"options": {"abe": {"k": 3}}}, "ABE-CLIP's options apply to metrics abe only"),
    ({"metrics": ("abe",), "options": {"abe": {"k": 0}}}, "The 'k' parameter of AbeConfig must be an int >= 1"),
    ({"metrics": ("abe",), "options": {"abe": {"omega": 2.0}}}, "The 'omega' parameter of AbeConfig must be a number"),
    ({"metrics": ("abe",), "options": {"abe": {"pool": "/nonexistent/pool.txt"}}}, "concept pool file not found"),
    ({"options": {"sampling": "uniform:4"}}, "the sampling and idf options apply to videos only"),
    ({"options": {"idf": True}}, "the sampling and idf options apply to videos only"),
])
def test_the_job_checks_itself_once_naming_parameters(kw, library):
    with pytest.raises(CapscoreError) as e:
        _job(**kw)
    assert library in str(e.value)


def test_the_outputs_check_themselves_when_made(tmp_path):
    with pytest.raises(CapscoreError, match="unsupported output format '.txt'"):
        FileOutput(tmp_path / "rows.txt")
    with pytest.raises(OptionError) as e:
        ShardFolder(tmp_path / "rows.jsonl")
    assert "out " in str(e.value) and "--out " in e.value.on_command_line()
    (tmp_path / "file").write_text("x")
    with pytest.raises(OptionError, match="is a file; a folder output needs a folder"):
        ShardFolder(tmp_path / "file")


def test_the_command_line_names_the_flags_of_the_jobs_checks(tmp_path, capsys):
    from PIL import Image

    from capscore.cli import main

    (tmp_path / "images").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "images" / "a.png")
    (tmp_path / "caps.json").write_text('{"a": "a dog"}')
    base = ["score", "--model", "scenes-tiny", "--images", str(tmp_path / "images"), "--captions",
            str(tmp_path / "caps.json")]
    for extra, flags in ((["--frames", "uniform:3"], "the --frames and --idf options apply to videos only"),
                         (["--abe-k", "2"], "ABE-CLIP's --abe-k/--abe-p/--abe-omega/--concept-pool apply to --metric "
                                           "abe only"),
                         (["--out", str(tmp_path / "rows.txt")], "unsupported output format '.txt'")):
        argv = base + extra + ([] if "--out" in extra else ["--out", str(tmp_path / "o.jsonl")])
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and flags in err[0], err


@pytest.mark.parametrize("flag, value, says", [
    ("--abe-k", "0", "argument --abe-k: must be a positive integer; got 0"),
    ("--abe-omega", "1.5", "argument --abe-omega: must be a probability in [0, 1]; got 1.5"),
    ("--workers", "0", "argument --workers: must be a positive integer; got 0"),
    ("--threads-per-worker", "-1", "argument --threads-per-worker: must be a positive integer; got -1"),
    ("--gpus-per-worker", "0", "argument --gpus-per-worker: must be a number > 0; got 0"),
    ("--max-member-mb", "inf", "argument --max-member-mb: must be a finite number; got 'inf'"),
])
def test_flag_values_out_of_range_are_refused_while_parsing(tmp_path, capsys, flag, value, says):
    from capscore.cli import main

    assert main(["score", "--webdataset", str(tmp_path / "none.tar"), "--out", str(tmp_path / "o/"), flag, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
