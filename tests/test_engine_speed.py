"""The engine's speed paths give the same numbers as the plain ones: one image forward for global
vectors and patch tokens, token-budget text batches, per-token features in the persistent cache
(bounded in bytes), the concept pool as one cached matrix, spaCy parses cached by text."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from capscore.embed import EmbeddingCache, Encoder
from capscore.scores.abe_phrases import phrase_features

TEXTS = ["a red cube", "cube", "green vintage car", "a man riding a horse on the beach near the blue water",
         "dog", "a small red ball and a large blue box"] + [f"red thing {i}" for i in range(30)]


def _one_by_one(bb, texts):
    """Reference: each text alone through the tower (no padding at all), normalised."""
    out = []
    with torch.inference_mode():
        for t in texts:
            ids = bb.tokenize([t])[0]
            g, tok = bb.forward_texts(torch.tensor([ids]), torch.tensor([len(ids)]), tokens=True)
            out.append((torch.nn.functional.normalize(g[0].float(), dim=-1),
                        torch.nn.functional.normalize(tok[0].float(), dim=-1)))
    return out


@pytest.mark.parametrize("budget", [1, 40, 64 * 77, 10**9])
def test_token_budget_batches_equal_unpadded_encoding(tiny_backbone, budget):
    feats = Encoder(tiny_backbone, text_token_budget=budget).text_tokens(TEXTS)
    for f, (g, tok) in zip(feats, _one_by_one(tiny_backbone, TEXTS)):
        assert f.vectors.shape == tok.shape
        assert (f.vectors - tok).abs().max() <= 1e-6 and (f.global_ - g).abs().max() <= 1e-6


def test_token_budget_groups_short_texts(tiny_backbone):
    enc = Encoder(tiny_backbone, batch_size=4, text_token_budget=60)
    ids = [[1] * n for n in (3, 3, 3, 3, 3, 3, 10, 10, 30)]
    sizes = [len(pos) for pos, x, _ in enc._batches(ids, 4, budget=60)]
    # 3-token rows: 20 fit in 60 tokens, so all six share a batch (a fixed count of 4 would split them);
    # then the two 10-token rows (adding the 30-token row would pad three rows to 30: 90 > 60), then it alone
    assert sizes == [6, 2, 1] and sum(sizes) == len(ids)
    assert [len(pos) for pos, _, _ in enc._batches(ids, 4)] == [4, 4, 1]


def test_token_features_persist_and_are_exact(tiny_backbone, tmp_path, monkeypatch):
    cold = Encoder(tiny_backbone, cache=tmp_path / "c").text_tokens(TEXTS)
    calls = []
    real = tiny_backbone.forward_texts
    monkeypatch.setattr(tiny_backbone, "forward_texts", lambda *a, **k: calls.append(1) or real(*a, **k))
    warm = Encoder(tiny_backbone, cache=tmp_path / "c").text_tokens(TEXTS)
    assert calls == []
    for a, b in zip(cold, warm):
        assert a.ids == b.ids and a.tokens == b.tokens
        assert torch.equal(a.vectors, b.vectors) and torch.equal(a.global_, b.global_)


def test_feature_table_is_bounded_least_recently_used_first(tmp_path):
    c = EmbeddingCache(tmp_path / "c", max_feature_bytes=10_000)
    row = np.zeros(500, dtype=np.float32)  # 2,000 bytes each
    c.put_features([(b"a", row), (b"b", row), (b"c", row), (b"d", row)])  # 8,000 bytes: under the bound
    assert c.feature_bytes() == 8000
    assert set(c.get_features([b"a"])) == {b"a"}  # a is now the most recently used
    c.put_features([(b"e", row), (b"f", row)])  # 12,000 > 10,000: evict down to <= 9,000 (oldest first)
    assert c.feature_bytes() <= 9000
    left = set(c.get_features([b"a", b"b", b"c", b"d", b"e", b"f"]))
    assert left == {b"a", b"d", b"e", b"f"}  # b and c were the least recently used
    c.close()
    again = EmbeddingCache(tmp_path / "c", max_feature_bytes=10_000)
    assert again.feature_bytes() == 8000  # the running total is re-read from the file


def test_zero_feature_budget_stores_nothing(tmp_path):
    c = EmbeddingCache(tmp_path / "c", max_feature_bytes=0)
    c.put_features([(b"a", np.ones(4, dtype=np.float32))])
    assert c.get_features([b"a"]) == {} and c.feature_bytes() == 0


def test_feature_budget_from_environment(tmp_path, monkeypatch):
    from capscore.errors import CapscoreError

    monkeypatch.setenv("CAPSCORE_FEATURE_CACHE_MB", "1.5")
    assert EmbeddingCache(tmp_path / "a").max_feature_bytes == int(1.5 * 2**20)
    monkeypatch.setenv("CAPSCORE_FEATURE_CACHE_MB", "lots")
    with pytest.raises(CapscoreError, match="CAPSCORE_FEATURE_CACHE_MB"):
        EmbeddingCache(tmp_path / "b")


def test_one_image_forward_serves_global_and_patches(tiny_backbone, make_images, tmp_path, monkeypatch):
    paths = make_images(3) + make_images(1)  # the last is a copy (same bytes) of the first
    plain = Encoder(tiny_backbone).encode_images(paths)
    calls = []
    real = tiny_backbone.forward_images
    monkeypatch.setattr(tiny_backbone, "forward_images", lambda px, **k: calls.append(len(px)) or real(px, **k))
    enc = Encoder(tiny_backbone, cache=tmp_path / "c")
    g = enc.encode_images(paths, patches=True)
    g2, p = enc.image_patches(paths)
    assert calls == [3]  # one forward, three distinct images, nothing for image_patches
    assert (g - plain).abs().max() <= 1e-6 and torch.equal(g, g2) and p.shape[:2] == (4, 16)
    # the global vectors went to the persistent cache: a new encoder encodes nothing
    again = Encoder(tiny_backbone, cache=tmp_path / "c")
    assert torch.equal(again.encode_images(paths), g) and calls == [3]


def test_patches_of_bad_images_become_errors(tiny_backbone, make_images, tmp_path):
    good = make_images(1)[0]
    errors = {}
    out = Encoder(tiny_backbone).encode_images([good, tmp_path / "missing.png"], errors=errors, patches=True)
    assert set(errors) == {1} and "not found" in errors[1] and torch.isnan(out[1]).all()


def test_concept_pool_matrix_is_cached_and_equal(tiny_backbone, tmp_path, monkeypatch):
    from capscore.scores.concepts import load_concept_pool, pool_vectors

    pool = load_concept_pool(None)
    direct = Encoder(tiny_backbone).encode_texts(list(pool.words))
    first = pool_vectors(Encoder(tiny_backbone, cache=tmp_path / "c"), pool)
    assert torch.equal(first, direct)
    enc = Encoder(tiny_backbone, cache=tmp_path / "c")
    monkeypatch.setattr(enc, "encode_texts", lambda *a, **k: pytest.fail("the pool was encoded again"))
    assert torch.equal(pool_vectors(enc, pool), direct)


def test_spacy_parses_cached_by_text(monkeypatch):
    import capscore.nlp as nlp
    from capscore.scores.abe import extract_pairs

    texts = ["a red cube and a blue sphere", "a green vintage car"]
    first = extract_pairs(texts)
    parsed = []
    real = nlp.load_spacy

    def counting(*a, **k):
        model = real(*a, **k)

        class Spy:
            def pipe(self, xs):
                xs = list(xs)
                parsed.extend(xs)
                return model.pipe(xs)

        return Spy()

    monkeypatch.setattr(nlp, "load_spacy", counting)
    again = extract_pairs(texts + ["a yellow bus"])
    assert parsed == ["a yellow bus"] and again[:2] == first
    assert [(p.object.text, [a.text for a in p.attributes]) for p in again[2]] == [("bus", ["yellow"])]


# ---------------------------------------------------------------- ABE's phrase features (packed)
WORDS = [("", "ball"), ("", "box"), ("red", "ball"), ("red", "box"), ("green vintage", "car"), ("red", "sphere"),
         ("small red and blue", "cube"), ("café", "table"), ("r&amp;b", "song"), ("a very long prefix " * 3, "dog"),
         ("red", "ball")]  # repeated on purpose


def _word_by_hand(bb, prefix, word):
    """Reference: the whole phrase alone through the tower; mean of the word's normalised tokens before <eot>."""
    n = len(bb.tokenize([word])[0]) - 2
    phrase = f"{prefix} {word}" if prefix else word
    _, tok = _one_by_one(bb, [phrase])[0]
    return tok[len(tok) - 1 - n : len(tok) - 1].mean(0)


@pytest.mark.parametrize("row_tokens", [4, 12, 64])
def test_packed_words_equal_each_phrase_encoded_alone(tiny_backbone, monkeypatch, row_tokens):
    enc = Encoder(tiny_backbone)
    rows = []
    real = tiny_backbone.forward_packed_texts
    monkeypatch.setattr(tiny_backbone, "forward_packed_texts", lambda ids, *a: rows.append(ids) or real(ids, *a))
    got = phrase_features(enc, WORDS, row_tokens=row_tokens)  # 4 and 12 split prefixes over rows
    assert len(got) == len(WORDS)
    for (prefix, word), v in zip(WORDS, got):
        assert (v - _word_by_hand(tiny_backbone, prefix, word)).abs().max() <= 1e-6, (prefix, word)
    packed_tokens = sum(int((r != tiny_backbone.pad_id).sum()) for r in rows)
    whole_tokens = sum(len(tiny_backbone.tokenize([f"{p} {w}" if p else w])[0]) for p, w in dict.fromkeys(WORDS))
    assert 0 < packed_tokens < whole_tokens  # the point: fewer tokens through the tower


def test_packed_prefixes_share_their_leading_tokens(tiny_backbone, monkeypatch):
    """ABE's A⁻ prefixes ("red small", "red large wooden") start like A⁺ ones ("red"): one row holds
    each leading token once, and every phrase still gets its own features."""
    items = [("red", "ball"), ("red small", "ball"), ("red small", "cube"), ("red large wooden", "cube"),
             ("blue", "cube"), ("", "ball")]
    rows = []
    real = tiny_backbone.forward_packed_texts
    monkeypatch.setattr(tiny_backbone, "forward_packed_texts", lambda ids, *a: rows.append(ids) or real(ids, *a))
    got = phrase_features(Encoder(tiny_backbone), items)
    for (prefix, word), v in zip(items, got):
        assert (v - _word_by_hand(tiny_backbone, prefix, word)).abs().max() <= 1e-6, (prefix, word)
    inner = lambda s: tiny_backbone.tokenize([s])[0][1:-1]  # noqa: E731
    trie = {tuple(inner(p)[:k]) for p, _ in items for k in range(1, len(inner(p)) + 1)}
    assert len(rows) == 1 and int((rows[0] != tiny_backbone.pad_id).sum()) == 1 + len(trie) + sum(
        len(inner(w)) for _, w in items)  # start token + trie nodes + every word's tokens


def test_phrase_features_without_packing_encode_whole_phrases(tiny_backbone, monkeypatch):
    monkeypatch.setattr(tiny_backbone, "supports_packed_text", False)
    monkeypatch.setattr(tiny_backbone, "forward_packed_texts", lambda *a: pytest.fail("packed without support"))
    got = phrase_features(Encoder(tiny_backbone), WORDS)
    for (prefix, word), v in zip(WORDS, got):
        assert (v - _word_by_hand(tiny_backbone, prefix, word)).abs().max() <= 1e-6


def test_phrase_features_persist(tiny_backbone, tmp_path, monkeypatch):
    cold = phrase_features(Encoder(tiny_backbone, cache=tmp_path / "c"), WORDS)
    monkeypatch.setattr(tiny_backbone, "forward_packed_texts", lambda *a: pytest.fail("re-encoded"))
    monkeypatch.setattr(tiny_backbone, "forward_texts", lambda *a, **k: pytest.fail("re-encoded"))
    warm = phrase_features(Encoder(tiny_backbone, cache=tmp_path / "c"), WORDS)
    assert all(torch.equal(a, b) for a, b in zip(cold, warm))
