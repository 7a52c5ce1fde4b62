"""Sharded inputs on the single-process engine: WebDataset tars, Parquet, a saved HF dataset.

Expected scores are recomputed with open_clip alone on the very PNG bytes written into the shards (see
test_cli_score.ref_cos); inputs are written with webdataset/pyarrow/datasets, not with capscore.
"""
import io
import json

import numpy as np
import pandas as pd
import pytest

from shard_inputs import samples, write_hf, write_parquet, write_webdataset
from test_cli_score import PREFIX, hmean, one_line_error, ref_cos, ref_model, ref_text_sim, rows, score  # noqa: F401


def expected_clip_s(ref_model, items):
    cos = ref_cos(ref_model, [io.BytesIO(it[2]) for it in items], [PREFIX + it[3] for it in items])
    return 2.5 * np.clip(cos, 0, None)


def test_webdataset_brace_pattern_scores_every_sample_with_its_key_as_id(tmp_path, ref_model):
    items = samples(2, 3)
    write_webdataset(tmp_path / "shards", items)
    out = tmp_path / "o.jsonl"
    assert score(tmp_path, "--webdataset", str(tmp_path / "shards" / "{00000..00001}.tar"), "--out", out) == 0
    got = rows(out)
    assert [r["id"] for r in got] == [it[1] for it in items]
    assert got[0]["image"] == f"{tmp_path / 'shards' / '00000.tar'}:000000000"
    np.testing.assert_allclose([r["score"] for r in got], expected_clip_s(ref_model, items), atol=1e-5)


def test_webdataset_refs_from_the_json_member(tmp_path, ref_model):
    items = samples(1, 3)
    write_webdataset(tmp_path / "shards", items)
    out = tmp_path / "o.jsonl"
    assert score(tmp_path, "--webdataset", tmp_path / "shards", "--metric", "refclip-s", "--refs-column", "refs",
                 "--prefix", "", "--out", out) == 0
    c = 2.5 * np.clip(ref_cos(ref_model, [io.BytesIO(it[2]) for it in items], [it[3] for it in items]), 0, None)
    expected = hmean(c, ref_text_sim(ref_model, [it[3] for it in items], [it[4] for it in items]))
    np.testing.assert_allclose([r["score"] for r in rows(out)], expected, atol=1e-5)


def corrupt_shard(tmp_path):
    """Shard 0: sample 1 has garbage image bytes, sample 2 has no caption; shard 1 is intact."""
    import webdataset as wds

    items = samples(2, 4)
    paths = write_webdataset(tmp_path / "shards", items)
    with wds.TarWriter(str(paths[0])) as w:
        for _, key, png, cap, _ in (it for it in items if it[0] == 0):
            sample = {"__key__": key, "png": png, "txt": cap}
            if key.endswith("1"):
                sample["png"] = b"\x89PNG not really"
            if key.endswith("2"):
                del sample["txt"]
            w.write(sample)
    return items, paths


def test_corrupt_samples_become_error_rows_naming_shard_and_key(tmp_path, ref_model, capsys):
    items, paths = corrupt_shard(tmp_path)
    out = tmp_path / "o.jsonl"
    assert score(tmp_path, "--webdataset", tmp_path / "shards", "--skip-bad", "--out", out) == 0
    got = rows(out)
    assert [r["id"] for r in got] == [it[1] for it in items]  # nothing lost, shard 1 included
    bad = {r["id"]: r["error"] for r in got if r["error"]}
    assert set(bad) == {"000000001", "000000002"}
    assert bad["000000001"].startswith(f"{paths[0]}:000000001: ") and "image" in bad["000000001"]
    assert bad["000000002"].startswith(f"{paths[0]}:000000002: ") and ".txt caption" in bad["000000002"]
    good = [it for it in items if it[1] not in bad]
    np.testing.assert_allclose([r["score"] for r in got if not r["error"]], expected_clip_s(ref_model, good),
                               atol=1e-5)
    capsys.readouterr()
    assert score(tmp_path, "--webdataset", tmp_path / "shards", "--out", tmp_path / "o2.jsonl") == 2
    one_line_error(capsys, f"{paths[0]}:000000001")


@pytest.mark.parametrize("cut", ["member", "header"])
def test_truncated_tar_keeps_earlier_samples_and_names_the_shard(tmp_path, capsys, cut):
    items = samples(2, 4)
    paths = write_webdataset(tmp_path / "shards", items)
    data = paths[0].read_bytes()
    import tarfile

    with tarfile.open(paths[0]) as tf:  # three members (json, png, txt) per sample
        offsets = [m.offset for m in tf.getmembers()]
    end = offsets[6] + (700 if cut == "member" else 0) + (100 if cut == "header" else 0)  # inside sample 2
    paths[0].write_bytes(data[:end])
    out = tmp_path / "o.jsonl"
    assert score(tmp_path, "--webdataset", tmp_path / "shards", "--skip-bad", "--out", out) == 0
    got = rows(out)
    ok = [r["id"] for r in got if r["error"] is None]
    assert ok == [it[1] for it in items if it[0] == 0][:2] + [it[1] for it in items if it[0] == 1]
    errors = [r["error"] for r in got if r["error"]]
    assert errors and all(e.startswith(str(paths[0])) for e in errors)
    assert "truncated" in errors[-1]
    capsys.readouterr()
    assert score(tmp_path, "--webdataset", tmp_path / "shards", "--out", tmp_path / "o2.jsonl") == 2
    line = one_line_error(capsys, str(paths[0]))
    assert "truncated" in line


def test_parquet_folder_with_configured_columns_and_refs(tmp_path, ref_model):
    items = samples(2, 3)
    write_parquet(tmp_path / "pq", items, image_column="jpg", caption_column="alt")
    out = tmp_path / "o.csv"
    assert score(tmp_path, "--parquet", tmp_path / "pq", "--image-column", "jpg", "--caption-column", "alt",
                 "--refs-column", "refs", "--metric", "refclip-s", "--out", out) == 0
    df = pd.read_csv(out, dtype={"id": str}, keep_default_na=False)
    assert df["id"].tolist() == [it[1] for it in items]
    cands = [PREFIX + it[3] for it in items]
    c = 2.5 * np.clip(ref_cos(ref_model, [io.BytesIO(it[2]) for it in items], cands), 0, None)
    expected = hmean(c, ref_text_sim(ref_model, cands, [[PREFIX + r for r in it[4]] for it in items]))
    np.testing.assert_allclose(df["score"].to_numpy(float), expected, atol=1e-5)


def test_parquet_path_column_and_missing_column_error(tmp_path, ref_model, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    items = samples(1, 2)
    (tmp_path / "img").mkdir()
    for it in items:
        (tmp_path / "img" / f"{it[1]}.png").write_bytes(it[2])
    pq.write_table(pa.table({"id": [it[1] for it in items], "image": [f"img/{it[1]}.png" for it in items],
                             "caption": [it[3] for it in items]}), tmp_path / "t.parquet")
    out = tmp_path / "o.jsonl"
    assert score(tmp_path, "--parquet", tmp_path / "t.parquet", "--out", out) == 0
    np.testing.assert_allclose([r["score"] for r in rows(out)], expected_clip_s(ref_model, items), atol=1e-5)
    capsys.readouterr()
    assert score(tmp_path, "--parquet", tmp_path / "t.parquet", "--caption-column", "alt",
                 "--out", tmp_path / "o2.jsonl") == 2
    one_line_error(capsys, str(tmp_path / "t.parquet"), "no column 'alt'", "'caption'")


def test_hf_dataset_split_text_column_and_unknown_split(tmp_path, ref_model, capsys):
    items = samples(1, 5)
    write_hf(tmp_path / "hf", items, num_shards=2)
    out = tmp_path / "o.jsonl"
    assert score(tmp_path, "--hf-dataset", tmp_path / "hf", "--out", out) == 0  # the only split; 'text' column
    got = rows(out)
    assert [r["id"] for r in got] == [it[1] for it in items]
    np.testing.assert_allclose([r["score"] for r in got], expected_clip_s(ref_model, items), atol=1e-5)
    summary = json.loads((tmp_path / "o.jsonl.summary.json").read_text())
    assert len(summary["shards"]) == 2  # two Arrow files, read in order
    capsys.readouterr()
    assert score(tmp_path, "--hf-dataset", tmp_path / "hf", "--split", "train", "--out", tmp_path / "x.jsonl") == 2
    one_line_error(capsys, "no split 'train'", "validation")
