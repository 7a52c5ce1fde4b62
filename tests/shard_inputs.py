"""Writers of sharded test inputs with the libraries that make them in the wild (not capscore's readers).

WebDataset shards are written with ``webdataset.TarWriter`` (what img2dataset uses), Parquet with pyarrow,
the Hugging Face dataset with ``datasets`` (``Image`` feature, ``save_to_disk``).
"""
from __future__ import annotations

import io

import numpy as np
from PIL import Image

WORDS = ["red", "green", "blue", "noisy", "striped", "dark", "bright", "small"]


def samples(n_shards: int, per_shard: int, *, seed: int = 0, size: int = 24):
    """[(shard index, key, png bytes, caption, refs)], keys as img2dataset writes them (shard + index)."""
    rng = np.random.default_rng(seed)
    out = []
    for s in range(n_shards):
        for k in range(per_shard):
            buf = io.BytesIO()
            Image.fromarray((rng.random((size, size, 3)) * 255).astype("uint8")).save(buf, format="PNG")
            key = f"{s:05d}{k:04d}"
            cap = f"a {WORDS[(s + k) % len(WORDS)]} square number {k}"
            out.append((s, key, buf.getvalue(), cap, [f"reference {k}", "a colourful pattern"]))
    return out


def write_webdataset(folder, items) -> list:
    import webdataset as wds

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in sorted({it[0] for it in items}):
        p = folder / f"{s:05d}.tar"
        with wds.TarWriter(str(p)) as w:
            for _, key, png, cap, refs in (it for it in items if it[0] == s):
                w.write({"__key__": key, "png": png, "txt": cap, "json": {"refs": refs, "key": key}})
        paths.append(p)
    return paths


def write_parquet(folder, items, *, image_column="jpg", caption_column="caption") -> list:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in sorted({it[0] for it in items}):
        part = [it for it in items if it[0] == s]
        p = folder / f"part-{s:03d}.parquet"
        pq.write_table(pa.table({"key": [it[1] for it in part], image_column: [it[2] for it in part],
                                 caption_column: [it[3] for it in part], "refs": [it[4] for it in part]}), p)
        paths.append(p)
    return paths


def write_hf(folder, items, *, num_shards=2):
    import datasets

    ds = datasets.Dataset.from_dict({
        "image": [{"bytes": it[2], "path": None} for it in items],
        "text": [it[3] for it in items],
        "key": [it[1] for it in items],
    }).cast_column("image", datasets.Image())
    datasets.DatasetDict({"validation": ds}).save_to_disk(str(folder), num_shards={"validation": num_shards})
    return folder
