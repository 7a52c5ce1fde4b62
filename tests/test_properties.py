"""Property-based layer (hypothesis): parsers, perturbations and the segmenter never crash.

For arbitrary unicode, arbitrary bytes, empty and huge inputs, each function either
returns a well-formed result or raises :class:`~capscore.errors.CapscoreError`
(a one-line user error). Any other exception is a bug and fails the test.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from capscore.errors import CapscoreError

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                            HealthCheck.too_slow])
HUGE = "a red car " * 20_000  # 200 000 characters
DEEP = "[" * 50_000 + "]" * 50_000

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
row_keys = st.sampled_from(["image", "caption", "refs", "id", "system", "score", "human", "path", "x"])
rows = st.dictionaries(row_keys, json_values, max_size=6)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from PIL import Image

    d = tmp_path_factory.mktemp("props")
    (d / "images").mkdir()
    Image.new("RGB", (8, 8), (10, 20, 30)).save(d / "images" / "a.png")
    return d


_n = [0]


def _file(d: Path, suffix: str, content: bytes) -> Path:
    _n[0] += 1
    p = d / f"f{_n[0]}{suffix}"
    p.write_bytes(content)
    return p


def _drain_captions(path: Path, d: Path, refs=None) -> list:
    from capscore.data.captions import BadItem, index_images, read_captions
    from capscore.data.records import Record

    items = list(read_captions(path, images=index_images(d / "images"), refs=refs))
    for it in items:
        assert isinstance(it, (Record, BadItem))
        if isinstance(it, BadItem):
            assert it.where.startswith(str(path))  # every bad item names its file
    return items


@SETTINGS
@given(content=st.binary(max_size=400), suffix=st.sampled_from([".json", ".jsonl", ".csv"]))
@example(content=b"", suffix=".csv")
@example(content=b"\xef\xbb\xbfimage,caption\na.png,\"open\n", suffix=".csv")
@example(content=DEEP.encode(), suffix=".json")
@example(content=('{"image": "a.png", "caption": ' + "9" * 5000 + "}\n").encode(), suffix=".jsonl")
def test_caption_files_of_arbitrary_bytes(world, content, suffix):
    try:
        _drain_captions(_file(world, suffix, content), world)
    except CapscoreError:
        pass


@SETTINGS
@given(data=st.lists(rows, max_size=5), shape=st.sampled_from(["jsonl", "json", "csv"]))
def test_caption_files_of_arbitrary_rows(world, data, shape):
    if shape == "jsonl":
        path = _file(world, ".jsonl", "".join(json.dumps(r) + "\n" for r in data).encode())
    elif shape == "json":
        path = _file(world, ".json", json.dumps({str(i): r.get("caption") for i, r in enumerate(data)}).encode())
    else:
        import csv
        import io

        buf = io.StringIO()
        wr = csv.writer(buf, lineterminator="\n")
        wr.writerow(["image", "caption", "refs"])
        for r in data:
            wr.writerow([str(r.get("image", "a.png")), str(r.get("caption", "")), json.dumps(r.get("refs"))])
        path = _file(world, ".csv", buf.getvalue().encode())
    try:
        items = _drain_captions(path, world)
    except CapscoreError:
        return
    from capscore.data.records import Record

    for it in items:  # a Record always holds a string caption and a tuple of string references
        if isinstance(it, Record):
            assert all(isinstance(r, str) for r in it.refs)


@SETTINGS
@given(content=st.binary(max_size=300), suffix=st.sampled_from([".json", ".jsonl", ".csv"]))
@example(content=DEEP.encode(), suffix=".json")
@example(content=b'image,refs\na.png,"[[[[[[[[[[\n', suffix=".csv")
def test_reference_files_of_arbitrary_bytes(world, content, suffix):
    from capscore.data.captions import load_refs

    try:
        refs = load_refs(_file(world, suffix, content))
    except CapscoreError:
        return
    assert all(isinstance(k, str) and all(isinstance(r, str) for r in v) for k, v in refs.items())


@SETTINGS
@given(content=st.binary(max_size=300), suffix=st.sampled_from([".jsonl", ".csv", ".json"]))
@example(content=b"\xef\xbb\xbfid,score\nc0,1\n", suffix=".csv")
@example(content=("id,score\nc0," + "9" * 5000 + "\n").encode(), suffix=".csv")
@example(content=b'id,score\nc0,"1\n', suffix=".csv")
def test_human_rating_files_of_arbitrary_bytes(world, content, suffix):
    import math

    from capscore.meta.evaluate import read_human

    try:
        ratings = read_human(_file(world, suffix, content))
    except CapscoreError:
        return
    assert all(not math.isinf(r.human) for r in ratings.items)  # never an infinite "rating"


@SETTINGS
@given(rows_=st.lists(st.fixed_dictionaries({"id": st.text(max_size=8), "score": json_values}), max_size=6))
def test_human_rating_rows_of_arbitrary_values(world, rows_):
    from capscore.meta.evaluate import read_human

    try:
        ratings = read_human(_file(world, ".jsonl", "".join(json.dumps(r) + "\n" for r in rows_).encode()))
    except CapscoreError:
        return
    assert len(ratings.items) + sum(ratings.skipped.values()) == len(rows_)


# ------------------------------------------------------------------------------------ perturbations
@pytest.fixture(scope="module")
def nlp():
    from capscore.probes.segment import load_parser

    return load_parser()


captions = st.text(max_size=200)


@SETTINGS
@given(caption=captions, kind=st.sampled_from(["repetition", "removal", "masking", "jumble", "substitution"]),
       p=st.floats(0, 1), seed=st.integers(0, 2**32))
@example(caption="", kind="jumble", p=0.4, seed=0)
@example(caption=HUGE, kind="removal", p=0.4, seed=0)
@example(caption="\u200b\u3000\n\t", kind="masking", p=1.0, seed=1)
def test_perturbations_never_crash(nlp, caption, kind, p, seed):
    from capscore.perturb import perturb

    try:
        out = perturb(caption, kind, p=p, seed=seed, nlp=nlp)
    except CapscoreError:
        return
    assert out.text is None or isinstance(out.text, str)
    assert out.text is not None or out.reason  # not perturbable: says why
    again = perturb(caption, kind, p=p, seed=seed, nlp=nlp)
    assert again == out  # deterministic for a seed


@SETTINGS
@given(caption=captions, seed=st.integers(0, 2**32))
@example(caption="", seed=0)
@example(caption=HUGE[:20_000], seed=0)
def test_lgip_variants_never_crash(caption, seed):
    from capscore.perturb import lgip_variants

    try:
        v = lgip_variants(caption, seed=seed)
    except CapscoreError:
        return
    assert all(isinstance(s, str) and s != v.original for s in v.paraphrases)
    assert all(isinstance(f.text, str) and f.text != v.original and f.old != f.new for f in v.flips)


@SETTINGS
@given(caption=captions)
@example(caption="")
@example(caption="   ")
@example(caption=HUGE[:5_000])
@example(caption="a dog on a sofa . . . ,,, ;; — 犬がソファの上にいる 🐶")
def test_detail_unit_segmenter_tiles_the_caption(nlp, caption):
    from capscore.probes.segment import detail_unit_spans

    try:
        spans = detail_unit_spans(caption, nlp=nlp)
    except CapscoreError:
        return
    last = 0
    for a, b in spans:  # ordered, non-overlapping, inside the caption, never empty
        assert last <= a < b <= len(caption)
        assert not caption[last:a].strip() or last == 0  # between units: only white space
        last = b


def test_seeded_rng_sanity():
    """The perturbation property above relies on seeds being honoured (random.Random is per call)."""
    assert random.Random("1|x").random() == random.Random("1|x").random()


# ------------------------------------------------------------------------------------ sharded and video readers
# Each reader is driven with random bytes and with valid files cut at a random point: it yields
# Records/BadItems or raises capscore's InputError, within a time bound (wall clock per example) and a
# memory bound (tracemalloc peak of Python-side allocations, which include the bytes read and PIL frames).
import io as _io  # noqa: E402
import tarfile as _tarfile  # noqa: E402
import time as _time  # noqa: E402
import tracemalloc as _tracemalloc  # noqa: E402

READER_SETTINGS = settings(max_examples=40, deadline=None,
                           suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
TIME_BOUND_S = 30.0  # generous: the machine is shared; a hang or a gigabyte loop takes far longer
MEMORY_BOUND = 64 * 2**20


def _bounded(fn):
    """Run ``fn``; it must finish within the bounds and raise nothing but a CapscoreError."""
    _tracemalloc.start()
    t0 = _time.perf_counter()
    try:
        return fn()
    except CapscoreError as e:
        assert "\n" not in str(e)
        return None
    finally:
        peak = _tracemalloc.get_traced_memory()[1]
        _tracemalloc.stop()
        assert _time.perf_counter() - t0 < TIME_BOUND_S
        assert peak < MEMORY_BOUND, peak


def _png_bytes(colour=(1, 2, 3)) -> bytes:
    from PIL import Image

    buf = _io.BytesIO()
    Image.new("RGB", (6, 6), colour).save(buf, format="PNG")
    return buf.getvalue()


def _valid_tar() -> bytes:
    buf = _io.BytesIO()
    with _tarfile.open(fileobj=buf, mode="w", format=_tarfile.USTAR_FORMAT) as tf:
        for k in range(3):
            for name, data in ((f"{k:04d}.png", _png_bytes((k, 0, 0))), (f"{k:04d}.txt", f"caption {k}".encode()),
                               (f"{k:04d}.json", json.dumps({"refs": ["r"]}).encode())):
                ti = _tarfile.TarInfo(name)
                ti.size = len(data)
                tf.addfile(ti, _io.BytesIO(data))
    return buf.getvalue()


VALID_TAR = _valid_tar()


def _drain_shard(kind: str, path: Path, **opts) -> list:
    from capscore.data.captions import BadItem
    from capscore.data.records import Record
    from capscore.data.shards import Shard, SourceOptions, read_shard

    items = list(read_shard(Shard(kind, str(path), path.stem), SourceOptions(**opts)))
    for it in items:
        assert isinstance(it, (Record, BadItem))
        if isinstance(it, BadItem):
            assert str(path) in it.error and "\n" not in it.error
    return items


@READER_SETTINGS
@given(content=st.binary(max_size=3000), gz=st.booleans(), refs=st.booleans())
@example(content=b"\0" * 1024, gz=False, refs=False)
def test_webdataset_reader_on_random_bytes(world, content, gz, refs):
    import gzip

    data = gzip.compress(content) if gz else content
    path = _file(world, ".tar.gz" if gz else ".tar", data)
    _bounded(lambda: _drain_shard("webdataset", path, refs_key="refs" if refs else None))


@READER_SETTINGS
@given(cut=st.integers(min_value=0, max_value=len(VALID_TAR)), flip=st.integers(min_value=0, max_value=len(VALID_TAR)),
       byte=st.integers(0, 255))
def test_webdataset_reader_on_truncated_and_flipped_tars(world, cut, flip, byte):
    data = bytearray(VALID_TAR[:cut])
    if flip < len(data):
        data[flip] = byte
    path = _file(world, ".tar", bytes(data))
    items = _bounded(lambda: _drain_shard("webdataset", path, refs_key="refs"))
    if cut == len(VALID_TAR) and flip >= len(data):
        from capscore.data.records import Record

        assert [it.caption for it in items if isinstance(it, Record)] == [f"caption {k}" for k in range(3)]


def _valid_parquet() -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = pa.BufferOutputStream()
    pq.write_table(pa.table({"image": [_png_bytes((k, 1, 1)) for k in range(4)], "caption": [f"c{k}" for k in range(4)],
                             "refs": [["r"]] * 4}), buf, row_group_size=2)
    return buf.getvalue().to_pybytes()


@READER_SETTINGS
@given(content=st.binary(max_size=2000))
@example(content=b"PAR1")
@example(content=b"PAR1\0\0\0\0PAR1")
def test_parquet_reader_on_random_bytes(world, content):
    path = _file(world, ".parquet", content)
    _bounded(lambda: _drain_shard("parquet", path))


@READER_SETTINGS
@given(data=st.data())
def test_parquet_reader_on_truncated_and_flipped_files(world, data):
    valid = _valid_parquet()
    cut = data.draw(st.integers(0, len(valid)))
    content = bytearray(valid[:cut]) if data.draw(st.booleans()) else bytearray(valid)
    for _ in range(data.draw(st.integers(0, 4))):
        if content:
            content[data.draw(st.integers(0, len(content) - 1))] = data.draw(st.integers(0, 255))
    path = _file(world, ".parquet", bytes(content))
    _bounded(lambda: _drain_shard("parquet", path, refs_key="refs"))


def _valid_arrow_stream() -> bytes:
    import pyarrow as pa

    table = pa.table({"image": [{"bytes": _png_bytes(), "path": None}] * 3, "text": ["a", "b", "c"]})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        for b in table.to_batches(max_chunksize=1):
            w.write_batch(b)
    return sink.getvalue().to_pybytes()


@READER_SETTINGS
@given(data=st.data())
def test_arrow_reader_on_random_truncated_and_flipped_bytes(world, data):
    valid = _valid_arrow_stream()
    mode = data.draw(st.sampled_from(["random", "cut", "flip"]))
    if mode == "random":
        content = data.draw(st.binary(max_size=2000))
    else:
        content = bytearray(valid[:data.draw(st.integers(0, len(valid)))] if mode == "cut" else valid)
        if mode == "flip" and content:
            for _ in range(data.draw(st.integers(1, 4))):
                content[data.draw(st.integers(0, len(content) - 1))] = data.draw(st.integers(0, 255))
        content = bytes(content)
    path = _file(world, ".arrow", content)
    _bounded(lambda: _drain_shard("hf", path))


@READER_SETTINGS
@given(state=st.one_of(st.binary(max_size=300), json_values.map(lambda v: json.dumps(v).encode()),
                       st.lists(st.fixed_dictionaries({"filename": st.one_of(st.text(max_size=20), json_values)}),
                                max_size=3).map(lambda f: json.dumps({"_data_files": f}).encode())))
@example(state=json.dumps({"_data_files": [{"filename": "/etc/passwd"}]}).encode())
def test_hf_state_json_of_arbitrary_content(world, state):
    """state.json is checked before datasets reads it: anything hostile is an InputError, never a read
    outside the folder."""
    from capscore.data.hf_dataset import check_saved_folder

    folder = world / f"hf{_n[0]}"
    _n[0] += 1
    folder.mkdir()
    (folder / "state.json").write_bytes(state)
    try:
        check_saved_folder(folder)
    except CapscoreError:
        return
    # accepted: then every data file is a regular file directly inside the folder
    import os

    for f in json.loads(state)["_data_files"]:
        assert os.path.dirname(os.path.realpath(folder / f["filename"])) == os.path.realpath(folder)


@READER_SETTINGS
@given(pattern=st.text(alphabet="{},.\\ab19-", max_size=14))
def test_brace_count_matches_braceexpand(pattern):
    from braceexpand import UnbalancedBracesError, braceexpand

    from capscore.data.webdataset import count_brace_names

    try:
        expected = len(list(braceexpand(pattern)))
    except UnbalancedBracesError:
        with pytest.raises(UnbalancedBracesError):
            count_brace_names(pattern)
        return
    assert count_brace_names(pattern) == expected


def _valid_gif() -> bytes:
    from PIL import Image

    frames = [Image.new("P", (12, 10), i % 4) for i in range(6)]
    buf = _io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=50)
    return buf.getvalue()


@READER_SETTINGS
@given(data=st.data(), suffix=st.sampled_from([".gif", ".mp4", ".webm", ".png"]),
       sampling=st.sampled_from(["uniform:3", "all", "every:2", "fps:5"]))
def test_video_reader_on_random_truncated_and_flipped_bytes(world, data, suffix, sampling):
    from capscore.data.video import Sampling, VideoRef

    valid = _valid_gif()
    mode = data.draw(st.sampled_from(["random", "cut", "flip"]))
    if mode == "random" or suffix != ".gif":
        content = data.draw(st.binary(max_size=1500))
    else:
        content = bytearray(valid[:data.draw(st.integers(0, len(valid)))] if mode == "cut" else valid)
        if mode == "flip" and content:
            for _ in range(data.draw(st.integers(1, 3))):
                content[data.draw(st.integers(0, len(content) - 1))] = data.draw(st.integers(0, 255))
        content = bytes(content)
    path = _file(world, suffix, content)
    frames = _bounded(lambda: VideoRef(path=path).load(Sampling.parse(sampling)))
    if frames is not None:
        assert frames and all(f.mode == "RGB" for f in frames)
