"""Polaris, Nebula and LongCap-Arena read in their published layouts: the authors' CSVs (Polos'
``polaris_{split}.csv``, DENEB's ``nebula_{split}.csv``, VELA's ``{aspect}_dci_{val,test}.csv``: ``mt``,
``refs`` as a Python list literal, ``score``, ``imgid``) and the Hugging Face parquet files; fixtures are
written here in each layout."""
from __future__ import annotations

import io
import math

import pytest
from PIL import Image

from capscore.errors import InputError
from capscore.meta.datasets import load_dataset, load_published, load_rating_csv


def _png(path, color="red"):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (6, 6), color).save(path)


def _csv(path, rows, header="mt,refs,score,imgid"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([header] + rows) + "\n")
    return path


def test_polaris_csv_as_the_polos_code_reads_it(tmp_path):
    _png(tmp_path / "images" / "a1.jpg")
    _png(tmp_path / "images" / "b2.jpg", "blue")
    _csv(tmp_path / "polaris" / "polaris_test.csv", [
        "a dog  on grass,\"['a dog runs', \"\"the dog's ball\"\"]\",0.75,a1.jpg",
        "a blue thing,\"['blue']\",nan,b2.jpg",
        "a blue box,\"['blue', 'a box']\",0.25,b2.jpg",
    ])
    ds = load_dataset("polaris", tmp_path / "polaris", tmp_path / "images")
    assert [it.human for it in ds.items] == [0.75, 0.25] and dict(ds.skipped) == {"NaN score": 1}
    first = ds.items[0].record
    assert first.caption == "a dog on grass" and first.refs == ("a dog runs", "the dog's ball")
    assert first.image.path == tmp_path / "images" / "a1.jpg" and ds.items[1].group == "b2.jpg"
    assert first.source.endswith("polaris_test.csv:2")
    assert ds.params == {"split": "test"}


def test_nebula_csv_file_and_image_ids_without_suffix(tmp_path):
    _png(tmp_path / "images" / "1234.jpg")
    path = _csv(tmp_path / "nebula_val.csv", ["a cat,\"['a cat sleeps']\",0.5,1234"])
    ds = load_published("nebula", path, tmp_path / "images")
    assert ds.items[0].record.image.path == tmp_path / "images" / "1234.jpg"  # EXPERT's "{imgid}.jpg"
    folder = load_dataset("nebula", tmp_path, tmp_path / "images", split="validation")  # HF name -> _val.csv
    assert [it.record.caption for it in folder.items] == ["a cat"]


def test_longcap_arena_csv_per_aspect_and_part(tmp_path):
    _png(tmp_path / "longcap-arena" / "images" / "sa_1.jpg")
    for aspect, score in (("desc", 0.9), ("rel", 0.1)):
        _csv(tmp_path / "longcap-arena" / "test" / f"{aspect}_dci_test.csv",
             [f"a long caption about a street,\"['a street', 'cars']\",{score},sa_1.jpg"], header="cand,refs,score,imgid")
    root = tmp_path / "longcap-arena"
    desc = load_dataset("longcap-arena", root, root / "images", split="dci_test.desc")
    rel = load_dataset("longcap-arena", root, root / "images", split="dci_test.rel")
    assert [it.human for it in desc.items] == [0.9] and [it.human for it in rel.items] == [0.1]
    with pytest.raises(InputError, match="names no aspect"):
        load_dataset("longcap-arena", root, None, split="dci_test")


def test_a_folder_without_the_csv_falls_back_to_the_parquet_release(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    Image.new("RGB", (6, 6), "green").save(buf, format="PNG")
    (tmp_path / "data").mkdir()
    img = pa.array([{"bytes": buf.getvalue(), "path": "g.png"}], type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    pq.write_table(pa.table({"refs": pa.array([["green"]], type=pa.list_(pa.string())), "cand": ["a green square"],
                             "img": img, "human_score": pa.array([0.5], type=pa.float32())}),
                   tmp_path / "data" / "test-00000-of-00001.parquet")
    (tmp_path / "extracted").mkdir()
    ds = load_dataset("polaris", tmp_path, tmp_path / "extracted")
    assert [it.record.caption for it in ds.items] == ["a green square"] and ds.items[0].human == 0.5
    assert ds.items[0].record.image.path.read_bytes() == buf.getvalue()


def test_csv_errors_name_the_file_and_line(tmp_path):
    path = _csv(tmp_path / "polaris_test.csv", ["a dog,\"['x']\",0.5"], header="mt,refs,score")
    with pytest.raises(InputError, match=r"polaris_test.csv:2: missing column; expected mt \(or cand\), refs, score, imgid"):
        load_rating_csv(path, None, name="polaris")
    path = _csv(tmp_path / "p2.csv", ["a dog,\"['x']\",high,a.jpg"])
    with pytest.raises(InputError, match=r"p2.csv:2: 'score' must be a number"):
        load_rating_csv(path, None, name="polaris")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no parquet/arrow files for split 'test'"):
        load_dataset("polaris", tmp_path / "empty")


def test_nan_free_scores_are_kept_as_floats(tmp_path):
    path = _csv(tmp_path / "nebula_test.csv", ["x,\"[]\",1,a.jpg", "y,\"['r']\",0,b.jpg"])
    ds = load_rating_csv(path, None, name="nebula")
    assert [it.human for it in ds.items] == [1.0, 0.0] and ds.items[0].record.refs == ()
    assert not any(math.isnan(it.human) for it in ds.items)


@pytest.mark.parametrize("name", ["polaris", "nebula", "longcap-arena"])
@pytest.mark.parametrize("score", ["1.5", "-0.25", "7", "4"])
def test_scores_outside_zero_one_are_one_line_naming_the_row(tmp_path, name, score):
    """The three releases hold human scores normalised to [0, 1] (0.625 on LongCap-Arena's dataset card;
    the Polos and DENEB heads end in a sigmoid): a 1-5 rating or a negative share is an error naming the
    file and line, in the CSV layout and the parquet one, never a silently accepted judgment."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = _csv(tmp_path / "j.csv", ["a dog,\"['a dog']\",0.5,a.jpg", f"a cat,\"['a cat']\",{score},b.jpg"])
    with pytest.raises(InputError, match=r"j.csv:3: 'score' is outside the dataset's scale \[0, 1\]"):
        load_rating_csv(path, None, name=name)
    cols = {"polaris": ("cand", "img", "human_score"), "nebula": ("mt", "file_name", "human_score"),
            "longcap-arena": ("cand", "file_name", "score")}[name]
    _png(tmp_path / "images" / "a.jpg")
    pq.write_table(pa.table({cols[0]: ["a dog", "a cat"], cols[1]: ["a.jpg", "a.jpg"],
                             cols[2]: [0.5, float(score)], "refs": [["a dog"], ["a cat"]]}), tmp_path / "t.parquet")
    with pytest.raises(InputError, match=rf"t.parquet: row 1: '{cols[2]}' is outside the dataset's scale \[0, 1\]"):
        load_published(name, tmp_path / "t.parquet", tmp_path / "images")
