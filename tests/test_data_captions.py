"""Loaders for `capscore score`: clipscore/pacscore JSON shapes, JSONL/CSV rows, manifests, refs."""
import json
from pathlib import Path

import pytest

from capscore.data.captions import BadItem, index_images, load_refs, read_captions
from capscore.data.records import Record
from capscore.errors import InputError


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "imgs"
    d.mkdir()
    for name in ["COCO_1.jpg", "COCO_2.png", "notes.txt", "b.JPEG"]:
        (d / name).write_bytes(b"x")  # content is irrelevant to indexing
    return d


def test_folder_ids_are_file_stems_of_image_files(folder):
    idx = index_images(folder)
    assert dict(idx.by_id) == {"COCO_1": folder / "COCO_1.jpg", "COCO_2": folder / "COCO_2.png",
                               "b": folder / "b.JPEG"}


def test_two_images_with_one_stem_is_an_error(folder):
    (folder / "COCO_1.png").write_bytes(b"x")
    with pytest.raises(InputError, match="COCO_1.jpg and COCO_1.png"):
        index_images(folder)


def test_json_captions_and_refs_like_clipscore(folder, tmp_path):
    caps = tmp_path / "model_x.json"
    caps.write_text(json.dumps({"COCO_2": "two dogs", "COCO_1": "a cat", "missing": "ghost"}))
    refs = tmp_path / "refs.json"
    refs.write_text(json.dumps({"COCO_1": ["a cat on a mat", "cat"], "COCO_2": "dogs"}))
    items = list(read_captions(caps, images=index_images(folder), refs=load_refs(refs)))
    a, b, c = items
    assert isinstance(a, Record) and a.id == "COCO_2" and a.caption == "two dogs" and a.refs == ("dogs",)
    assert a.image.path == folder / "COCO_2.png" and a.system == "model_x"
    assert b.refs == ("a cat on a mat", "cat")
    assert isinstance(c, BadItem) and "caption without image" in c.error and "'missing'" in c.error
    assert str(caps) in c.error


def test_json_duplicate_keys_are_not_silently_dropped(folder, tmp_path):
    caps = tmp_path / "c.json"
    caps.write_text('{"COCO_1": "first",\n "COCO_1": "second"}')
    a, b = read_captions(caps, images=index_images(folder))
    assert a.caption == "first" and isinstance(b, BadItem) and "duplicate id" in b.error


def test_malformed_json_names_the_line(folder, tmp_path):
    caps = tmp_path / "c.json"
    caps.write_text('{"COCO_1": "a",\n\n "COCO_2": oops}')
    with pytest.raises(InputError, match=r"c\.json:3: malformed JSON"):
        read_captions(caps, images=index_images(folder))


def test_jsonl_rows_lazy_errors_with_line_numbers(folder, tmp_path):
    caps = tmp_path / "run.jsonl"
    lines = [
        {"image": "COCO_1.jpg", "caption": "a cat", "refs": ["r1", "r2"], "system": "s1"},
        {"image": "COCO_2.png", "caption": "dogs", "id": "x"},
        "{not json",
        {"image": "COCO_2.png", "caption": "again", "id": "x"},  # duplicate id
        {"caption": "no image field"},
        "",
        {"image": str(folder / "b.JPEG"), "caption": "absolute path"},
    ]
    caps.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    items = list(read_captions(caps, images=index_images(folder)))
    assert [type(x).__name__ for x in items] == ["Record", "Record", "BadItem", "BadItem", "BadItem", "Record"]
    r1, r2, bad_json, dup, no_img, r7 = items
    assert (r1.id, r1.system, r1.refs) == ("1", "s1", ("r1", "r2"))  # id defaults to the row number
    assert (r2.id, r2.system, r2.source) == ("x", "run", f"{caps}:2")
    assert bad_json.error.startswith(f"{caps}:3: malformed JSON line")
    assert dup.error == f"{caps}:4: duplicate id 'x'"
    assert no_img.error.startswith(f"{caps}:5: missing field 'image'")
    assert r7.image.path == folder / "b.JPEG" and r7.source == f"{caps}:7"


def test_csv_rows_refs_cell_and_missing_column(folder, tmp_path):
    caps = tmp_path / "c.csv"
    caps.write_text('image,caption,refs\nCOCO_1.jpg,"a cat, small","[""r1"", ""r2""]"\n'
                    'COCO_2.png,"two\nlines",one ref\nCOCO_2.png,x\n')
    r1, r2, bad = read_captions(caps, images=index_images(folder))
    assert r1.caption == "a cat, small" and r1.refs == ("r1", "r2") and r1.source == f"{caps}:2"
    assert r2.caption == "two\nlines" and r2.refs == ("one ref",) and r2.source == f"{caps}:3"
    assert isinstance(bad, BadItem) and bad.error.startswith(f"{caps}:5: malformed CSV row")
    nocap = tmp_path / "n.csv"
    nocap.write_text("image,text\nCOCO_1.jpg,a\n")
    with pytest.raises(InputError, match=r"n\.csv:1: missing column 'caption'"):
        read_captions(nocap, images=index_images(folder))


def test_manifest_ids_and_relative_paths(tmp_path):
    (tmp_path / "sub").mkdir()
    man = tmp_path / "sub" / "manifest.jsonl"
    man.write_text(json.dumps({"id": "a", "path": "pics/a.png"}) + "\n" + json.dumps({"id": 7, "path": "/abs/b.jpg"}))
    idx = index_images(man)
    assert dict(idx.by_id) == {"a": tmp_path / "sub" / "pics" / "a.png", "7": Path("/abs/b.jpg")}
    caps = tmp_path / "c.jsonl"
    caps.write_text(json.dumps({"image": "a", "caption": "x"}) + "\n" + json.dumps({"image": "other.png", "caption": "y"}))
    a, b = read_captions(caps, images=idx)
    assert a.image.path == tmp_path / "sub" / "pics" / "a.png"
    assert b.image.path == tmp_path / "sub" / "other.png"  # not an id: relative to the manifest's folder
    dup = tmp_path / "m.csv"
    dup.write_text("id,path\na,1.png\na,2.png\n")
    with pytest.raises(InputError, match=r"m\.csv:3: duplicate image id 'a'"):
        index_images(dup)


def test_undecodable_bytes_stop_the_file_instead_of_dropping_its_rest(folder, tmp_path):
    caps = tmp_path / "c.jsonl"
    caps.write_bytes(b'{"image": "COCO_1.jpg", "caption": "ok"}\n{"image": "COCO_2.png", "caption": "\xff\xfe"}\n')
    items = read_captions(caps, images=index_images(folder))
    with pytest.raises(InputError, match=r"c\.jsonl:2: not UTF-8 text"):
        list(items)


def test_jsonl_refs_row_without_refs_is_one_error_naming_the_line(tmp_path):
    # found by tests/test_properties.py (hypothesis drew b'{}'): it was a KeyError, i.e. a traceback
    refs = tmp_path / "refs.jsonl"
    refs.write_text('{"image": "a", "refs": ["x"]}\n{}\n')
    with pytest.raises(InputError) as e:
        load_refs(refs)
    assert f"{refs}:2" in str(e.value) and "'refs'" in str(e.value)
