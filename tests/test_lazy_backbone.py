"""A warm run builds no model: load_backbone(lazy=True) answers from remembered facts until a forward needs it."""
from __future__ import annotations

import json
import os
import warnings

import pytest
import torch

from capscore.backbones import load_backbone
from capscore.backbones import lazy as lz
from capscore.backbones.base import Backbone
from capscore.backbones.lazy import LazyBackbone
from capscore.embed import Encoder
from capscore.errors import CapscoreError


def test_second_load_is_a_stand_in_with_the_real_facts(tiny_weights_file):
    spec = f"capscore-test-tiny/{tiny_weights_file}"
    real = load_backbone(spec, lazy=True)
    assert not isinstance(real, LazyBackbone)  # nothing remembered yet: a real load, whose facts are kept
    lazy = load_backbone(spec, lazy=True)
    assert isinstance(lazy, LazyBackbone) and not lazy.built
    assert isinstance(lazy, Backbone)  # API code that checks for a backbone accepts the stand-in
    for name in lz.FACTS:
        assert getattr(lazy, name) == getattr(real, name), name
    assert not lazy.built  # reading the facts built nothing
    # anything else builds the real backbone once, with the remembered identity
    ids = lazy.tokenize(["a red cube"])
    assert lazy.built and ids == real.tokenize(["a red cube"])
    assert lazy.identity == real.identity
    assert lazy.materialize() is lazy.materialize()


def test_warm_cache_run_builds_nothing_and_gives_the_same_vectors(tiny_weights_file, tmp_path):
    spec = f"capscore-test-tiny/{tiny_weights_file}"
    cache = tmp_path / "emb"
    cold = Encoder(load_backbone(spec, lazy=True), cache=cache)
    want = cold.encode_texts(["a red cube", "two blue balls"])
    warm_bb = load_backbone(spec, lazy=True)
    warm = Encoder(warm_bb, cache=cache)
    got = warm.encode_texts(["two blue balls", "a red cube"])
    assert not warm_bb.built and warm.stats.texts_cached == 2
    assert torch.equal(got, want[[1, 0]])
    # a text not in the cache needs the text tower: built now, the same vector as the real model's
    new = warm.encode_texts(["a green cone"])
    assert warm_bb.built
    assert torch.allclose(new, cold.encode_texts(["a green cone"]), atol=1e-6)


def test_changed_weights_file_or_recipe_is_a_real_load(tiny_weights_file):
    spec = f"capscore-test-tiny/{tiny_weights_file}"
    load_backbone(spec, lazy=True)
    assert isinstance(load_backbone(spec, lazy=True), LazyBackbone)
    assert not isinstance(load_backbone(spec, lazy=True, dtype="bf16"), LazyBackbone)  # another recipe
    assert not isinstance(load_backbone(spec, lazy=True, context_length=16), LazyBackbone)
    st = tiny_weights_file.stat()
    os.utime(tiny_weights_file, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # touched: another key
    assert not isinstance(load_backbone(spec, lazy=True), LazyBackbone)
    assert isinstance(load_backbone(spec, lazy=True), LazyBackbone)


def test_random_weights_and_lazy_false_always_build():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):  # random init: the identity needs the parameters
            assert not isinstance(load_backbone("capscore-test-tiny", lazy=True), LazyBackbone)
    load_backbone("scenes-tiny", lazy=True)
    assert isinstance(load_backbone("scenes-tiny", lazy=True), LazyBackbone)
    assert not isinstance(load_backbone("scenes-tiny"), LazyBackbone)


def test_a_stale_entry_is_refused_and_forgotten(tiny_weights_file):
    spec = f"capscore-test-tiny/{tiny_weights_file}"
    load_backbone(spec, lazy=True)
    table = json.loads(lz.facts_file().read_text())
    (key, raw), = table.items()
    facts = json.loads(raw)
    facts["identity"] = facts["identity"].replace("|w=", "|w=0")  # as if the code had changed under the key
    lz.facts_file().write_text(json.dumps({key: json.dumps(facts)}))
    stale = load_backbone(spec, lazy=True)
    assert isinstance(stale, LazyBackbone)
    with pytest.raises(CapscoreError, match="not the one remembered"):
        stale.forward_texts  # noqa: B018  (first use of the model)
    assert key not in json.loads(lz.facts_file().read_text())
    assert not isinstance(load_backbone(spec, lazy=True), LazyBackbone)  # the next run loads for real


def test_a_damaged_facts_file_is_only_a_miss(tiny_weights_file):
    spec = f"capscore-test-tiny/{tiny_weights_file}"
    lz.facts_file().parent.mkdir(parents=True, exist_ok=True)
    lz.facts_file().write_text("{not json")
    assert not isinstance(load_backbone(spec, lazy=True), LazyBackbone)
    assert isinstance(load_backbone(spec, lazy=True), LazyBackbone)


@pytest.mark.filterwarnings("ignore:metric pac-s uses")
def test_pipeline_warm_rerun_scores_without_a_model(tmp_path):
    from PIL import Image

    from capscore.data.images import ImageRef
    from capscore.data.records import Record
    from capscore.data.sources import InMemory
    from capscore.pipeline import Encoding, ScoreJob, iter_rows, load_encoders

    paths = []
    for i, color in enumerate([(200, 30, 30), (30, 30, 200)]):
        paths.append(tmp_path / f"{i}.png")
        Image.new("RGB", (40, 40), color).save(paths[-1])
    recs = tuple(Record(id=str(i), image=ImageRef.of(p), caption=c)
                 for i, (p, c) in enumerate(zip(paths, ["a red square", "a blue square"])))
    job = ScoreJob(source=InMemory(recs), models=("scenes-tiny",), metrics=("clip-s", "pac-s"), progress=False,
                   encoding=Encoding(cache_dir=str(tmp_path / "emb")))
    cold = list(iter_rows(job))
    encoders = load_encoders(job)
    warm = list(iter_rows(job, encoders=encoders))
    assert not encoders["scenes-tiny"].backbone.built  # every vector came from the cache
    assert [r["score"] for r in warm] == [r["score"] for r in cold]
    off = ScoreJob(source=InMemory(recs), models=("scenes-tiny",), metrics=("clip-s",), progress=False,
                   encoding=Encoding(cache=False))
    assert not isinstance(load_encoders(off)["scenes-tiny"].backbone, LazyBackbone)  # no persistent cache
