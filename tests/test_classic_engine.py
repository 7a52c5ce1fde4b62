"""The classic-metric engine under hostile input and failing tools: line separators and METEOR's ``|||`` never
shift or merge items, bad input is one line naming the item, and a Java tool that is missing, dies, babbles or
hangs is a one-line error — with its process killed on every exit path (Ctrl-C and interpreter exit too)."""
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import unicodedata

import numpy as np
import pytest

pytest.importorskip("pycocoevalcap")

from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from capscore.errors import CapscoreError, InputError  # noqa: E402
from capscore.scores import classic, classic_java  # noqa: E402
from classic_sets import ALL, ptb_direct, pycoco_direct, session  # noqa: E402, F401
from test_classic_metrics import CANDS, REFS  # noqa: E402

needs_java = pytest.mark.skipif(shutil.which("java") is None, reason="no Java (PTB tokenizer, METEOR)")
SEPARATORS = ["\n", "\r", "\r\n", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\x00", "\t"]


def normalised(text: str) -> str:
    """The test's own statement of the rule: controls and line/paragraph separators -> space, lone
    surrogates -> U+FFFD."""
    return "".join(" " if unicodedata.category(c) in ("Cc", "Zl", "Zp") else "\ufffd"
                   if unicodedata.category(c) == "Cs" else c for c in text)


# ------------------------------------------------------------------------------------ separators
@needs_java
@pytest.mark.parametrize("sep", SEPARATORS)
def test_a_line_break_in_one_item_changes_no_other_item(sep, session):
    """The issue's case: a candidate or reference holding a line separator shifted every later text in the
    PTB tokenizer (BLEU-1 of an untouched item 0.8462 -> 0.0920); now every item equals pycocoevalcap on the
    normalised texts, and a later clean call is not poisoned by a memo."""
    cands = list(CANDS)
    refs = [list(r) for r in REFS]
    cands[1] = f"Two dogs play{sep}with a red ball"
    refs[2][0] = f"a woman with an umbrella{sep}walks in the rain"
    got = session.score(ALL, cands, refs)
    clean_c = [normalised(c) for c in cands]
    clean_r = [[normalised(r) for r in rs] for rs in refs]
    want = pycoco_direct(*ptb_direct(clean_c, clean_r))
    for m, (corpus, per) in want.items():
        np.testing.assert_allclose(got[m].values, per, rtol=0, atol=1e-12, err_msg=m)
        assert abs(got[m].corpus() - corpus) <= 1e-12
    again = session.score(["bleu1"], CANDS, REFS)
    np.testing.assert_allclose(again["bleu1"].values, pycoco_direct(*ptb_direct(CANDS, REFS), names=["bleu1"])
                               ["bleu1"][1], rtol=0, atol=1e-12)


WORDS = ["a", "dog", "on", "the", "grass", "Red", "ball", "café", "日本", "😀", "it's", "(x)", "U.S.", '"q"', "|||"]
WEIRD = SEPARATORS + ["\ud800", "\u200b", "\ufeff", "\u00a0", "\u3000", "||", "|"]
texts = st.lists(st.one_of(st.sampled_from(WORDS), st.sampled_from(WEIRD), st.text(max_size=3)), min_size=0,
                 max_size=10).map(" ".join)
items = st.lists(st.tuples(texts, st.lists(texts.filter(lambda t: normalised(t).strip()), min_size=1, max_size=3)),
                 min_size=1, max_size=5)
PROPERTY = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                           HealthCheck.function_scoped_fixture])


@needs_java
@PROPERTY
@given(items)
@example([("", ["😀"])])  # found by this test: a reference the PTB tokenizer empties (it drops emoji)
def test_arbitrary_unicode_equals_its_normalised_text_item_by_item(session, data):
    """Arbitrary text through every classic metric equals, item by item, the same text with separators
    normalised — as capscore scores it and as pycocoevalcap scores the normalised text."""
    cands = [c for c, _ in data]
    refs = [rs for _, rs in data]
    clean_c = [normalised(c) for c in cands]
    clean_r = [[normalised(r) for r in rs] for rs in refs]
    raw = session.score(ALL, cands, refs)
    clean = session.score(ALL, clean_c, clean_r)
    gts, res = ptb_direct(clean_c, clean_r)
    empty = not any(r.split() for rs in gts.values() for r in rs)  # pycocoevalcap's CIDEr fails on it; 0 here
    want = pycoco_direct(gts, res, names=ALL[:5] if empty else ALL[:6])
    if empty:
        want["cider"] = (0.0, np.zeros(len(cands)))
    # METEOR: pycocoevalcap passes a reference's `|||` on to the jar (a second reference); capscore removes it
    want.update(pycoco_direct({k: [r.replace("|||", "").replace("  ", " ") for r in rs] for k, rs in gts.items()},
                              res, names=["meteor"]))
    for m in ALL:
        np.testing.assert_array_equal(raw[m].values, clean[m].values, err_msg=m)
        np.testing.assert_allclose(raw[m].values, want[m][1], rtol=0, atol=1e-12, err_msg=m)


@needs_java
@pytest.mark.parametrize("tokenizer, backend", [("ptb", "pycocoevalcap"), ("simple", "native"),
                                                ("simple", "pycocoevalcap"), ("none", "native")])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(data=items)
def test_every_tokenizer_and_backend_scores_a_text_as_its_normalised_text(session, tokenizer, backend, data):
    """The same property on the other tokenizers and backends (METEOR included: with "simple" and "none" the
    texts reach its jar as written, `|||` and all): arbitrary text scores, item by item, exactly as the same
    text with its separators normalised."""
    cands = [c for c, _ in data]
    refs = [rs for _, rs in data]
    raw = session.score(ALL, cands, refs, tokenizer=tokenizer, backend=backend)
    clean = session.score(ALL, [normalised(c) for c in cands], [[normalised(r) for r in rs] for rs in refs],
                          tokenizer=tokenizer, backend=backend)
    for m in ALL:
        np.testing.assert_array_equal(raw[m].values, clean[m].values, err_msg=m)
        assert np.isfinite(raw[m].values).all(), m


@needs_java
@PROPERTY
@given(texts, st.integers(0, 4), st.booleans())
def test_one_items_weird_text_never_changes_another_items_score(session, weird, which, in_ref):
    """Replacing one item's candidate (or one of its references) by arbitrary text leaves every other item's
    values unchanged (CIDEr too when the candidate changes, to rounding: its n-grams are summed in another
    order; a reference changes CIDEr's IDF for everyone, by the metric's definition, so CIDEr is left out
    there)."""
    base = session.score(ALL, CANDS, REFS)
    cands = list(CANDS)
    refs = [list(r) for r in REFS]
    if in_ref:
        refs[which][0] = weird if normalised(weird).strip() else "x"
    else:
        cands[which] = weird
    got = session.score(ALL, cands, refs)
    others = [i for i in range(len(CANDS)) if i != which]
    for m in ALL:
        if m == "cider" and in_ref:
            continue
        np.testing.assert_allclose(got[m].values[others], base[m].values[others], rtol=0, atol=1e-12, err_msg=m)


@needs_java
def test_meteor_separator_in_a_reference_does_not_make_two_references(session):
    """With the simple tokenizer `|||` reaches METEOR; a reference holding it stays one reference (its
    `|||` removed, as pycocoevalcap removes it from the hypothesis) — pycocoevalcap passed it on and the jar
    split it into two."""
    cand, ref = "a man riding a horse", "a man ||| riding a horse"
    got = session.score(["meteor"], [cand], [[ref]], tokenizer="simple")["meteor"].values[0]
    want = pycoco_direct({0: ["a man riding a horse"]}, {0: [cand]}, names=["meteor"])["meteor"][1][0]
    split = pycoco_direct({0: [ref]}, {0: [cand]}, names=["meteor"])["meteor"][1][0]
    assert got == want and got != split
    hyp = session.score(["meteor"], ["a man ||| riding a horse"], [[cand]], tokenizer="none")["meteor"].values[0]
    assert hyp == pycoco_direct({0: [cand]}, {0: ["a man ||| riding a horse"]}, names=["meteor"])["meteor"][1][0]


# ------------------------------------------------------------------------------------ bad input
@needs_java
def test_empty_and_punctuation_only_captions_score_zero(session):
    got = session.score(ALL, ["", "...", CANDS[2]], REFS[:3])
    for m in ALL:
        assert got[m].values[:2].tolist() == [0.0, 0.0], m
    want = pycoco_direct(*ptb_direct(["", "...", CANDS[2]], REFS[:3]))
    for m in ALL:
        np.testing.assert_allclose(got[m].values, want[m][1], rtol=0, atol=1e-12, err_msg=m)


@needs_java
def test_non_ascii_captions_equal_pycocoevalcap(session):
    cands = ["Un chien sur l'herbe — café", "日本の犬が走る", "a dog 😀 on grass", "Ça va, naïve façade?"]
    refs = [["un chien sur l'herbe"], ["犬が走る"], ["a dog on grass"], ["naïve façade"]]
    got = session.score(ALL, cands, refs)
    want = pycoco_direct(*ptb_direct(cands, refs))
    for m in ALL:
        np.testing.assert_allclose(got[m].values, want[m][1], rtol=0, atol=1e-12, err_msg=m)


@pytest.mark.parametrize("cands, refs, message", [
    (["a", "b"], [["a"], []], "caption 1: a reference-based metric needs at least one non-empty reference"),
    (["a"], [None], "caption 0: the references must be a list of strings"),
    (["a"], [3], "caption 0: the references must be a list of strings"),
    (["a"], [["ok", None]], "caption 0: reference 1 is not a string"),
    (["a"], [["ok", "  \r\n "]], "caption 0: a reference-based metric .* reference 1 is blank"),
    ([None], [["a"]], "caption 0: the caption must be a string"),
    ([float("nan")], [["a"]], "caption 0: the caption must be a string"),
    ("a dog", [["a"]], "the candidates must be a list of strings"),
    ([], [], "at least one caption"),
    (["a"], {"a": ["a"]}, "the references must be a list"),
])
def test_bad_input_is_one_line_naming_the_item(cands, refs, message):
    with pytest.raises(InputError if "caption 0" in message or "caption 1" in message else CapscoreError,
                       match=message) as e:
        classic.classic_scores(["bleu4"], cands, refs, tokenizer="none")
    assert "\n" not in str(e.value)


def test_arrays_and_tuples_are_accepted_as_lists():
    got = classic.classic_scores(["bleu1"], np.array(["a dog"]), (np.array(["a dog", "the cat"]),), tokenizer="none")
    assert got["bleu1"].values.tolist() == pytest.approx([1.0])


def test_items_are_named_by_id_and_system():
    with classic.ClassicSession() as s:
        with pytest.raises(InputError, match="system 'b' item img-7: the caption must be a string"):
            s.score_systems(["bleu1"], {"a": (["x"], [["x"]]), "b": ([3], [["x"]])}, tokenizer="none",
                            ids={"b": ["img-7"]})


# ------------------------------------------------------------------------------------ failing Java
FAKE_JAVA = textwrap.dedent('''\
    #!{python}
    """A stand-in for java: what it does is chosen by $FAKE_JAVA_MODE."""
    import json, os, sys, time
    mode = os.environ.get("FAKE_JAVA_MODE", "")
    args = sys.argv[1:]
    log = os.environ.get("FAKE_JAVA_LOG")
    if log:
        with open(log, "a") as f:
            f.write(" ".join(args) + "\\n")
    if "edu.anu.spice.SpiceScorer" in args:
        data = json.load(open(args[args.index("edu.anu.spice.SpiceScorer") + 1]))
        out = [{{"image_id": d["image_id"], "scores": {{"All": {{"f": "NaN" if not d["test"] else
                len(d["test"].split()) / 10}}}}}} for d in reversed(data)]
        json.dump(out, open(args[args.index("-out") + 1], "w"))
        sys.exit(0)
    if mode == "exit":
        sys.stderr.write("Error: Unable to access jarfile meteor-1.5.jar\\n")
        sys.exit(1)
    if mode == "hang":
        time.sleep(600)
    stats = "5.0 5.0 2.0 2.0 2.0 2.0 2.0 2.0 1.0 1.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0 1.0 5.0 5.0"
    for n, line in enumerate(sys.stdin):
        if mode == "garbage":
            print("Error: specify SCORE or EVAL", flush=True)
        elif mode == "die-after-1" and n == 1:
            sys.stderr.write("Exception in thread main java.lang.OutOfMemoryError: Java heap space\\n"
                             "\\tat edu.cmu.meteor.aligner.Aligner.align(Unknown Source)\\n")
            sys.exit(1)
        elif line.startswith("EVAL"):  # every segment and the aggregate: 2.45 / 2.75 for that statistics line
            print("\\n".join(["0.8909090909090909"] * line.count("|||") + ["0.8909090909090909"]), flush=True)
        else:
            print(stats, flush=True)
''')


@pytest.fixture
def fake_java(tmp_path, monkeypatch):
    """A fake `java` first on PATH; returns a function setting its mode."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "java"
    exe.write_text(FAKE_JAVA.format(python=sys.executable))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_JAVA_LOG", str(tmp_path / "java.log"))
    monkeypatch.setattr(classic, "_PTB_MEMO", {})
    _BEFORE.clear()
    _BEFORE.update(classic_java._LIVE)

    def mode(m: str) -> None:
        monkeypatch.setenv("FAKE_JAVA_MODE", m)
    return mode


_BEFORE: set = set()


def _no_live_process():
    """No Java process started by this test is still running (the module's shared session may be)."""
    return not any(p.alive for p in set(classic_java._LIVE) - _BEFORE)


def test_java_missing_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(classic, "_PTB_MEMO", {})
    for name, tok in (("meteor", "none"), ("bleu4", "ptb")):
        with pytest.raises(CapscoreError, match="needs Java, which was not found on PATH"):
            classic.classic_score(name, ["a dog"], [["a dog"]], tokenizer=tok)


@pytest.mark.parametrize("mode, message", [
    ("exit", r"METEOR \(java\) stopped at caption 0: Error: Unable to access jarfile meteor-1.5.jar"),
    ("garbage", "METEOR \\(java\\) answered 'Error: specify SCORE or EVAL' for caption 0, not a statistics line"),
    ("die-after-1", r"METEOR \(java\) stopped at caption 1: Exception in thread main java.lang.OutOfMemoryError"),
])
def test_a_failing_meteor_jar_is_one_line_naming_the_item(fake_java, mode, message):
    fake_java(mode)
    with pytest.raises(CapscoreError, match=message) as e:
        classic.classic_score("meteor", ["a dog", "a cat", "a cow"], [["a dog"], ["a cat"], ["a cow"]],
                              tokenizer="none")
    assert "\n" not in str(e.value)
    assert _no_live_process()


def test_a_failing_ptb_tokenizer_is_one_line(fake_java):
    fake_java("exit")
    with pytest.raises(CapscoreError, match="the PTB tokenizer \\(java\\) failed: Error: Unable to access"):
        classic.classic_score("bleu4", ["a dog"], [["a dog"]])
    assert _no_live_process()


def test_a_silent_jar_is_stopped_after_the_timeout(fake_java):
    fake_java("hang")
    t = time.monotonic()
    with classic.ClassicSession(timeout=1) as s:
        with pytest.raises(CapscoreError, match=r"METEOR \(java\) gave no answer for 1 s at caption 0; it was stopped"):
            s.score("meteor", ["a dog"], [["a dog"]], tokenizer="none")
    assert time.monotonic() - t < 30 and _no_live_process()


def test_ctrl_c_in_the_middle_of_an_exchange_kills_the_jar(fake_java):
    fake_java("hang")
    with classic.ClassicSession(timeout=60) as s:
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt):
            s.score("meteor", ["a dog"], [["a dog"]], tokenizer="none")
        assert _no_live_process()


def test_one_meteor_process_per_session_and_none_left_after(fake_java, tmp_path):
    fake_java("")
    with classic.ClassicSession() as s:
        s.score("meteor", ["a dog"], [["a dog"]], tokenizer="none")
        s.score("meteor", ["a cat", "a dog"], [["a cat"], ["a dog"]], tokenizer="none")
        s.score_systems("meteor", {"x": (["a cow"], [["a cow"]]), "y": (["a hen"], [["a hen"]])}, tokenizer="none")
        pid = s._meteor._p.proc.pid
    starts = [ln for ln in (tmp_path / "java.log").read_text().splitlines() if "-stdio" in ln]
    assert len(starts) == 1 and _no_live_process()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(CapscoreError, match="closed"):
        s.score("meteor", ["a"], [["a"]], tokenizer="none")
    # outside a session each call has its own, closed when it returns
    classic.classic_score("meteor", ["a dog"], [["a dog"]], tokenizer="none")
    assert _no_live_process()


def test_the_jar_is_killed_at_interpreter_exit(fake_java, tmp_path):
    fake_java("hang")
    code = ("from capscore.scores.classic_java import Meteor\n"
            "m = Meteor(timeout=5)\nprint(m._p.proc.pid, flush=True)\n")  # never closed: atexit must kill it
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    pid = int(out.stdout.split()[0])
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_spice_runs_once_for_several_systems_and_matches_results_by_id(fake_java, tmp_path, monkeypatch):
    """SPICE through its jar (faked here: the CoreNLP jars are not on this machine): one run for every system
    of a session, results matched by image id (the fake writes them in reverse), NaN where the jar gives no F
    (averaged over the others, with a warning), and no second run for pairs already scored."""
    fake_java("")
    spice_dir = tmp_path / "corenlp"
    spice_dir.mkdir()
    for jar in classic.CORENLP_JARS:  # an empty zip archive: a jar as far as the jar check can tell
        (spice_dir / jar).write_bytes(b"PK\x05\x06" + bytes(18))
    monkeypatch.setenv("CAPSCORE_SPICE_DIR", str(spice_dir))
    with classic.ClassicSession() as s:
        got = s.score_systems("spice", {"a": (["one two", "one two three four", ""], [["x"], ["y"], ["z"]]),
                                        "b": (["one", "two"], [["x"], ["y"]])}, tokenizer="none")
        again = s.score("spice", ["one", "two"], [["x"], ["y"]], tokenizer="none")
    runs = [ln for ln in (tmp_path / "java.log").read_text().splitlines() if "SpiceScorer" in ln]
    assert len(runs) == 1
    a = got["a"]["spice"]
    np.testing.assert_allclose(a.values[:2], [0.2, 0.4])
    assert np.isnan(a.values[2])
    assert a.corpus() == pytest.approx(0.3) and "no F for 1 of 3" in a.warnings[0]
    np.testing.assert_allclose(got["b"]["spice"].values, [0.1, 0.1])
    np.testing.assert_allclose(again["spice"].values, [0.1, 0.1])


@pytest.mark.slow
@needs_java
def test_meteor_out_of_memory_on_a_huge_repetitive_caption_names_the_item():
    """The real jar: 10,000 words repeating five exhaust METEOR's 2 GB heap in its aligner — one line naming
    the item, not a hang (pycocoevalcap reads an empty line and fails with a ValueError)."""
    _BEFORE.clear()
    _BEFORE.update(classic_java._LIVE)
    huge = " ".join(["dog", "runs", "fast", "on", "grass"] * 2000)
    with pytest.raises(CapscoreError, match=r"METEOR \(java\) stopped at caption 1: .*OutOfMemoryError"):
        classic.classic_score("meteor", ["a dog", huge], [["a dog"], [huge]], tokenizer="none")
    assert _no_live_process()
