"""Loaders on small fixture files written in the published shapes (checked against the reference access code)."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from capscore.errors import CapscoreError, InputError
from capscore.meta.datasets import (
    load_composite, load_dataset, load_flickr8k, load_foil, load_generic, load_hf, load_pascal50s,
)

REFS = ["A dog runs on  grass .", "A brown dog is running .", "A dog plays outside .",
        "The dog is in a field .", "A  dog ."]


def _flickr_json(tmp_path, name="flickr8k.json", judgements=None):
    data = {
        "1000268201_693b08cb0e": {
            "image_id": "1000268201_693b08cb0e",
            "image_path": "Flicker8k_Dataset/1000268201_693b08cb0e.jpg",
            "ground_truth": REFS,
            "human_judgement": judgements or [
                {"image_id": "1000268201_693b08cb0e", "image_path": "Flicker8k_Dataset/1000268201_693b08cb0e.jpg",
                 "caption": "A cat  sits on a mat .", "rating": 1.0},
                {"image_id": "1000268201_693b08cb0e", "image_path": "Flicker8k_Dataset/1000268201_693b08cb0e.jpg",
                 "caption": "A dog runs on grass .", "rating": 4.0},  # = REFS[0] after whitespace normalisation
                {"image_id": "1000268201_693b08cb0e", "image_path": "Flicker8k_Dataset/1000268201_693b08cb0e.jpg",
                 "caption": "A dog is outside .", "rating": float("nan")},
                {"image_id": "1000268201_693b08cb0e", "image_path": "Flicker8k_Dataset/1000268201_693b08cb0e.jpg",
                 "caption": "A dog is outside .", "rating": 3.0},
            ],
        }
    }
    p = tmp_path / name
    p.write_text(json.dumps(data))  # json writes NaN as the bare token NaN, like the published files
    return p


def test_flickr8k_expert_skips_candidates_that_are_references(tmp_path):
    p = _flickr_json(tmp_path)
    (tmp_path / "Flickr8k_Dataset").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "Flickr8k_Dataset" / "1000268201_693b08cb0e.jpg")
    ds = load_flickr8k(p, tmp_path, variant="expert")
    assert [it.record.caption for it in ds.items] == ["A cat sits on a mat .", "A dog is outside ."]
    assert [it.human for it in ds.items] == [1.0, 3.0]
    assert dict(ds.skipped) == {"candidate is one of its references": 1, "NaN rating": 1}
    assert ds.items[0].record.refs[0] == "A dog runs on grass ."  # normalised, all 5 kept
    assert len(ds.items[0].record.refs) == 5
    # the "Flicker8k" typo of the published image_path is resolved to the real folder
    assert ds.items[0].record.image.path == tmp_path / "Flickr8k_Dataset" / "1000268201_693b08cb0e.jpg"
    assert ds.items[0].group == "1000268201_693b08cb0e"


def test_flickr8k_crowdflower_removes_the_candidate_from_its_references(tmp_path):
    p = _flickr_json(tmp_path, "crowdflower_flickr8k.json")
    data = json.loads(p.read_text())
    for hj in data["1000268201_693b08cb0e"]["human_judgement"]:  # CrowdFlower: the share of "yes", in [0, 1]
        hj["rating"] = (hj["rating"] - 1) / 3
    p.write_text(json.dumps(data))
    ds = load_flickr8k(p, tmp_path, variant="crowdflower")
    assert len(ds.items) == 3 and dict(ds.skipped) == {"NaN rating": 1}
    kept_ref_cand = ds.items[1]
    assert kept_ref_cand.record.caption == "A dog runs on grass ."
    assert kept_ref_cand.record.refs == tuple(" ".join(r.split()) for r in REFS[1:])
    assert len(ds.items[0].record.refs) == 5  # a non-reference candidate keeps all of them


def test_flickr8k_bad_rating_names_the_entry(tmp_path):
    p = _flickr_json(tmp_path, judgements=[{"caption": "x", "rating": "high", "image_path": "a.jpg"}])
    with pytest.raises(InputError, match=r"flickr8k.json: key '1000268201_693b08cb0e', judgement 0: 'rating' must be a number"):
        load_flickr8k(p, tmp_path)


def test_composite_csv_removes_rated_caption_from_refs(tmp_path):
    p = tmp_path / "composite.csv"
    p.write_text(
        "imgid,mt,refs,score\n"
        "\"coco/COCO_val2014_000000000042.jpg\",a man  rides a horse,\"['a man rides a horse', 'a person on a horse']\",4\n"
        "img2.jpg,a cat,\"[\"\"a cat on a sofa\"\"]\",nan\n"
        "img3.jpg,a bird,\"['a bird flies']\",2.5\n")
    ds = load_composite(p, tmp_path)
    assert [it.human for it in ds.items] == [4.0, 2.5]
    assert ds.items[0].record.refs == ("a person on a horse",)
    assert ds.items[0].record.caption == "a man rides a horse"
    assert dict(ds.skipped) == {"NaN score": 1}
    assert ds.items[1].record.source.endswith("composite.csv:4")
    bad = tmp_path / "bad.csv"
    bad.write_text("imgid,cand,score\nx.jpg,a cat,3\n")
    with pytest.raises(InputError, match=r"bad.csv:2: missing column 'refs'"):
        load_composite(bad, tmp_path)


# ------------------------------------------------------------------------------------ Pascal-50S
def _write_pascal_mat(folder, pairs, votes):
    """pair_pascal.mat / consensus_pascal.mat with the structure of the CIDEr release: new_input is a
    1xN struct array of (image, caption A, caption B) strings, category a 1xN double, triplets a
    1x(48N) struct array whose fields are 1x1 cells (reference, candidate 1, candidate 2) and a
    double winner (1 = candidate 1)."""
    from scipy.io import savemat

    n = len(pairs)
    new_input = np.zeros((1, n), dtype=[("image", object), ("a", object), ("b", object)])
    for i, (img, a, b, _) in enumerate(pairs):
        new_input[0, i] = (img, a, b)
    category = np.array([[c for *_, c in pairs]], dtype=float)
    trip = np.zeros((1, 48 * n), dtype=[("ref", object), ("c1", object), ("c2", object), ("win", object)])
    for i, (img, a, b, _) in enumerate(pairs):
        va, _ = votes[i]
        for j in range(48):
            cell = lambda s: np.array([[s]], dtype=object)  # noqa: E731
            # half the triplets list the pair as (b, a), as the consensus file does
            first, second = (a, b) if j % 2 == 0 else (b, a)
            prefers_a = j < va
            win = 1.0 if (first == a) == prefers_a else -1.0
            trip[0, 48 * i + j] = (cell(f"reference {j} of {img}"), cell(first), cell(second), np.array([[win]]))
    savemat(folder / "pair_pascal.mat", {"new_input": new_input, "category": category,
                                          "new_data": np.zeros((n, 2))})
    savemat(folder / "consensus_pascal.mat", {"triplets": trip})


PAIRS = [("2008_000001.jpg", "a plane on the ground", "a plane  in the sky ", 1),
         ("2008_000002.jpg", "two dogs", "a dog on a sofa", 2),
         ("2008_000003.jpg", "a red car", "a car", 3),
         ("2008_000004.jpg", "a boat", "a ship on water", 4),
         ("2008_000005.jpg", "a horse", "a pony", 4)]
VOTES = [(30, 18), (10, 38), (24, 24), (40, 8), (24, 24)]


def test_pascal_fixture_has_the_reference_structure(tmp_path):
    from scipy.io import loadmat

    _write_pascal_mat(tmp_path, PAIRS, VOTES)
    # the access pattern of the clipscore Pascal-50S loader works on the fixture
    data = loadmat(tmp_path / "pair_pascal.mat")["new_input"][0]
    vid, a, b = [x[0] for x in data[0]]
    assert (vid, a) == ("2008_000001.jpg", "a plane on the ground")
    trip = loadmat(tmp_path / "consensus_pascal.mat")["triplets"][0]
    ref, c1, c2, win = [x[0][0] for x in trip[1]]
    assert ref[0] == "reference 1 of 2008_000001.jpg" and c1[0] == "a plane  in the sky " and win in (1, -1)


def test_pascal_majority_and_seeded_tie_break(tmp_path):
    _write_pascal_mat(tmp_path, PAIRS, VOTES)
    ds = load_pascal50s(tmp_path, tmp_path, seed=7)
    assert [p.category for p in ds.items] == ["HC", "HI", "HM", "MM", "MM"]
    assert [p.votes for p in ds.items] == VOTES
    # ties (pairs 2 and 4) are broken by successive draws of default_rng(seed), A if < 0.5
    rng = np.random.default_rng(7)
    tie_labels = [0 if rng.random() < 0.5 else 1 for _ in range(2)]
    assert [p.label for p in ds.items] == [0, 1, tie_labels[0], 0, tie_labels[1]]
    assert len(ds.items[0].refs) == 48 and ds.items[0].b == "a plane in the sky"
    labels_by_seed = {s: tuple(p.label for p in load_pascal50s(tmp_path, tmp_path, seed=s).items) for s in range(8)}
    assert len(set(labels_by_seed.values())) > 1  # the seed matters, and only for the ties
    assert all(v[0] == 0 and v[1] == 1 and v[3] == 0 for v in labels_by_seed.values())
    # pyCIDErConsensus/ sub-folder and JPEGImages/ image layout
    sub = tmp_path / "release" / "pyCIDErConsensus"
    sub.mkdir(parents=True)
    _write_pascal_mat(sub, PAIRS[:1], VOTES[:1])
    (tmp_path / "VOC2010").mkdir()
    ds2 = load_pascal50s(tmp_path / "release", tmp_path / "VOC2010")
    assert ds2.items[0].image.path == tmp_path / "VOC2010" / "JPEGImages" / "2008_000001.jpg"


def test_pascal_equivalent_jsonl_and_errors(tmp_path):
    p = tmp_path / "pascal.jsonl"
    rows = [{"image": "x.jpg", "a": "one", "b": "two", "category": "HC", "refs": ["r1", "r2"], "label": "b"},
            {"image": "y.jpg", "a": "one", "b": "two", "category": 3, "refs": ["r"], "votes_a": 5, "votes_b": 1}]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ds = load_pascal50s(p, tmp_path)
    assert [(q.category, q.label) for q in ds.items] == [("HC", 1), ("HM", 0)]
    p.write_text(json.dumps({"image": "x.jpg", "a": "one", "b": "two", "category": "XX", "label": 0}) + "\n")
    with pytest.raises(InputError, match=r"pascal.jsonl:1: category must be"):
        load_pascal50s(p, tmp_path)


# ------------------------------------------------------------------------------------ FOIL
def test_foil_pairs_and_reference_settings(tmp_path):
    foil = {"info": {}, "images": [{"id": 42, "file_name": "COCO_val2014_000000000042.jpg"}],
            "annotations": [
                {"id": 7, "image_id": 42, "caption": "A man riding a horse.", "foil": False,
                 "target_word": "ORIG", "foil_word": "ORIG"},
                {"id": 7, "image_id": 42, "caption": "A man riding a cow.", "foil": True,
                 "target_word": "horse", "foil_word": "cow"},
                {"id": 7, "image_id": 42, "caption": "A man riding a sheep.", "foil": True,
                 "target_word": "horse", "foil_word": "sheep"},
                {"id": 8, "image_id": 99, "caption": "no refs for me", "foil": False},
            ]}
    coco = {"images": [], "annotations": [
        {"image_id": 42, "id": 1, "caption": "A man  riding a horse."},
        {"image_id": 42, "id": 2, "caption": "A rider on a brown horse."},
        {"image_id": 42, "id": 3, "caption": "Someone on horseback."},
        {"image_id": 42, "id": 4, "caption": "A horse with a man."},
        {"image_id": 42, "id": 5, "caption": "A person rides."}]}
    (tmp_path / "foilv1.0_test_2017.json").write_text(json.dumps(foil))
    (tmp_path / "captions_val2014.json").write_text(json.dumps(coco))
    ds = load_foil(tmp_path / "foilv1.0_test_2017.json", tmp_path)
    assert [(p.a, p.b, p.label) for p in ds.items] == [
        ("A man riding a horse.", "A man riding a cow.", 0), ("A man riding a horse.", "A man riding a sheep.", 0)]
    assert ds.items[0].refs == ("A rider on a brown horse.", "Someone on horseback.", "A horse with a man.",
                                "A person rides.")
    assert dict(ds.skipped) == {"image without COCO references": 1}
    assert ds.items[0].image.path == tmp_path / "COCO_val2014_000000000042.jpg"


# ------------------------------------------------------------------------------------ HF parquet
def _png_bytes(color):
    buf = io.BytesIO()
    Image.new("RGB", (6, 6), color).save(buf, format="PNG")
    return buf.getvalue()


def _image_struct(values):
    import pyarrow as pa

    return pa.array(values, type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))


def test_polaris_parquet_with_embedded_images(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    red, blue = _png_bytes("red"), _png_bytes("blue")
    table = pa.table({
        "refs": pa.array([["a red square", "red"], ["blue"], ["blue!"]], type=pa.list_(pa.string())),
        "cand": ["a red thing", "a blue thing", "a  blue box"],
        "img": _image_struct([{"bytes": red, "path": "r.png"}, {"bytes": blue, "path": "b.png"},
                              {"bytes": blue, "path": "b.png"}]),
        "human_score": pa.array([1.0, 0.5, float("nan")], type=pa.float32()),
    })
    (tmp_path / "data").mkdir()
    pq.write_table(table, tmp_path / "data" / "test-00000-of-00001.parquet")
    ds = load_hf(tmp_path, None, name="polaris", split="test", extract_to=tmp_path / "x")
    assert [it.human for it in ds.items] == [1.0, 0.5] and dict(ds.skipped) == {"NaN score": 1}
    assert ds.items[0].record.refs == ("a red square", "red")
    img = ds.items[1].record.image.path
    assert img.parent == tmp_path / "x" and img.read_bytes() == blue
    with pytest.raises(InputError, match="no parquet/arrow files for split 'val'"):
        load_hf(tmp_path, None, name="polaris", split="val")


def test_nebula_and_longcap_arena_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"file_name": ["a.jpg", "b.jpg"], "image": _image_struct([{"bytes": _png_bytes("red"), "path": "a.jpg"},
                                                                                     {"bytes": None, "path": "b.jpg"}]),
                             "refs": [["r"], ["s"]], "mt": ["cap a", "cap b"], "human_score": [0.2, 0.9]}),
                   tmp_path / "nebula.parquet")
    Image.new("RGB", (4, 4)).save(tmp_path / "b.jpg")
    ds = load_hf(tmp_path / "nebula.parquet", tmp_path, name="nebula", extract_to=tmp_path / "x")
    assert [it.record.caption for it in ds.items] == ["cap a", "cap b"]
    assert ds.items[1].record.image.path == tmp_path / "b.jpg"  # file name only: looked up in --images
    pq.write_table(pa.table({"file_name": ["a.jpg"], "image": _image_struct([{"bytes": _png_bytes("red"), "path": "a.jpg"}]),
                             "refs": [["r"]], "cand": ["long caption"], "score": [0.625]}),
                   tmp_path / "test.desc-00000-of-00001.parquet")
    ds = load_hf(tmp_path, None, name="longcap-arena", split="test.desc", extract_to=tmp_path / "x")
    assert [it.human for it in ds.items] == [0.625]
    with pytest.raises(InputError, match=r"nebula.parquet: no caption column; expected cand"):
        load_hf(tmp_path / "nebula.parquet", None, name="longcap-arena", extract_to=tmp_path / "x")


# ------------------------------------------------------------------------------------ JSONL
def test_generic_decapbench_and_mcapeval(tmp_path):
    p = tmp_path / "judgments.jsonl"
    p.write_text('{"image": "a.jpg", "caption": "x", "score": 3}\n\n'
                 '{"image": "a.jpg", "caption": "y", "human": 1, "refs": ["r"], "system": "s1", "lang": "de"}\n'
                 '{"image": "b.jpg", "caption": "z", "rating": NaN}\n')
    ds = load_generic(p, tmp_path)
    assert [it.human for it in ds.items] == [3.0, 1.0] and dict(ds.skipped) == {"NaN rating": 1}
    assert ds.items[1].record.system == "s1" and ds.items[1].lang == "de" and ds.items[1].group == "a.jpg"
    assert ds.items[1].record.source.endswith("judgments.jsonl:3")
    assert load_dataset("decapbench", p, tmp_path).name == "decapbench"
    with pytest.raises(InputError, match=r"judgments.jsonl:1: missing 'lang'"):
        load_dataset("m-capeval1k", p, tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"image": "a.jpg", "caption": "x"}\n')
    with pytest.raises(InputError, match=r"bad.jsonl:1: no human score"):
        load_generic(bad, tmp_path)


def test_registry_errors(tmp_path):
    with pytest.raises(CapscoreError, match="did you mean 'pascal50s'"):
        load_dataset("pascal50", tmp_path)
    with pytest.raises(CapscoreError, match="--path is required"):
        load_dataset("composite")
