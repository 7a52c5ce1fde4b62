"""Retrieval ranked by a pair scorer (ABE-CLIP Table 2): cosine first stage, re-ranking of the top k, exact mode.

Expected ranks are worked out by hand on small tables, or by brute force over every (image, text) pair
scored with ABE's public ``abe_scores`` and ranked with plain loops in this file.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from capscore.probes.retrieval import recall_at, reranked_ranks, retrieval_ranks

# cosine S[image, text]; captions 0,1 belong to image 0, 2,3 to image 1, 4,5 to image 2 (as the cosine tests)
S = np.array([[0.9, 0.1, 0.8, 0.2, 0.3, 0.0],
              [0.5, 0.4, 0.3, 0.6, 0.7, 0.1],
              [0.2, 0.9, 0.8, 0.95, 0.1, 0.5]])
OWNER = [0, 0, 1, 1, 2, 2]
# second-stage pair scores P[image, text]
P = np.array([[0.1, 0.9, 0.2, 0.3, 0.0, 0.0],
              [0.0, 0.0, 0.9, 0.1, 0.5, 0.0],
              [0.0, 0.0, 0.0, 0.0, 0.2, 0.8]])


def _emb():
    return torch.eye(3, dtype=torch.float64), torch.tensor(S.T)


def _table_scores(calls):
    def score(ii, tt):
        calls.append(len(ii))
        return P[ii, tt]

    return score


def test_rerank_top2_by_hand():
    img, txt = _emb()
    calls = []
    i2t, t2i, n = reranked_ranks(img, txt, OWNER, _table_scores(calls), rerank_k=2)
    # image 0: cosine top 2 = texts 0 (own, P .1), 2 (P .2 >= .1) -> 2
    # image 1: top 2 = texts 4 (P .5), 3 (own, P .1) -> 2
    # image 2: top 2 = texts 3, 1, neither its own -> keeps its cosine rank 4
    assert i2t.tolist() == [2, 2, 4]
    # text 0: top images 0 (own, .1), 1 (.0) -> 1;   text 1: top 2, 1, own image 0 not there -> cosine rank 3
    # text 2: top 0, 2 (0.8 each), own image 1 not there -> cosine rank 3 (0.3: every image >= it)
    # text 3: top 2, 1 (own, .1 > .0) -> 1 (cosine rank 2);  text 4: top 1, 0 -> cosine rank 3;  text 5: top 2, 1 -> 1
    assert t2i.tolist() == [1, 3, 3, 1, 3, 1]
    assert len(calls) == 1 and calls[0] == n  # one call, each distinct pair once


def test_rerank_exact_mode_by_hand_and_recall_at_k_equals_the_cosine():
    img, txt = _emb()
    i2t, t2i, n = reranked_ranks(img, txt, OWNER, _table_scores([]), rerank_k=None)
    # every pair is a candidate: image i's best own P beats every other text's P in its row
    assert i2t.tolist() == [1, 1, 1]
    # text 3: own image 1 has .1, image 0 has .3 -> 2; text 4: own image 2 .2, image 1 .5 -> 2
    assert t2i.tolist() == [1, 1, 1, 2, 2, 1]
    assert n == 18
    # with k candidates, R@k is the cosine's: the same k items, reordered
    cos_i2t, cos_t2i = retrieval_ranks(img, txt, OWNER)
    for k in (1, 2, 3):
        r_i2t, r_t2i, _ = reranked_ranks(img, txt, OWNER, _table_scores([]), rerank_k=k)
        assert np.mean(r_i2t <= k) == np.mean(cos_i2t <= k) and np.mean(r_t2i <= k) == np.mean(cos_t2i <= k)


def test_rerank_k_must_be_positive():
    img, txt = _emb()
    with pytest.raises(Exception, match="rerank_k must be a positive integer or None"):
        reranked_ranks(img, txt, OWNER, _table_scores([]), rerank_k=0)


# ------------------------------------------------------------------ ABE on scenes with the bundled model
@pytest.fixture(scope="module")
def scenes_abe():
    pytest.importorskip("capscore.scenes.tiny", reason="bundled scenes-tiny model not available")
    from capscore.backbones import load_backbone
    from capscore.embed.engine import Encoder
    from capscore.probes.scenes import retrieval_set
    from capscore.scenes import generate_scenes, render_size
    from capscore.scores.abe import abe_scores

    enc = Encoder(load_backbone("scenes-tiny"), batch_size=64)
    data = retrieval_set(generate_scenes(5, seed=3, split="heldout", size=render_size(enc)))
    n_img, n_txt = len(data.images), len(data.texts)
    # brute force: ABE for every (image, text) pair, through ABE's own public function
    ii, tt = np.meshgrid(np.arange(n_img), np.arange(n_txt), indexing="ij")
    flat = abe_scores(enc, [data.images[i] for i in ii.ravel()], [data.texts[t] for t in tt.ravel()])
    A = flat.double().numpy().reshape(n_img, n_txt)
    return enc, data, A


def _brute_ranks(A, owner):
    owner = np.asarray(owner)
    i2t = []
    for i in range(A.shape[0]):
        best = A[i, owner == i].max()
        i2t.append(1 + int(sum(A[i, t] >= best for t in range(A.shape[1]) if owner[t] != i)))
    t2i = [1 + int(sum(A[j, t] >= A[owner[t], t] for j in range(A.shape[0]) if j != owner[t]))
           for t in range(A.shape[1])]
    return i2t, t2i


def test_abe_retrieval_exact_mode_equals_brute_force(scenes_abe):
    from capscore.probes.retrieval import run_retrieval
    from capscore.scores.pairs import get_pair_scorer

    enc, data, A = scenes_abe
    res = run_retrieval(enc, data, suite="scenes-retrieval", scorer=get_pair_scorer("abe"), rerank_k=None,
                        pair_chunk=7)  # several chunks
    i2t, t2i = _brute_ranks(A, data.text_image)
    got_i2t = [r["rank"] for r in res.rows if r["direction"] == "image->text"]
    got_t2i = [r["rank"] for r in res.rows if r["direction"] == "text->image"]
    assert got_i2t == i2t and got_t2i == t2i
    assert res.scorer == "abe" and res.params["rerank_k"] == "all"
    assert res.params["n_pairs_scored"] == A.size
    by = {s["direction"]: s for s in res.summary}
    assert by["text->image"]["R@1"] == pytest.approx(100 * np.mean(np.asarray(t2i) <= 1))
    assert by["image->text"]["R@5"] == recall_at(np.asarray(i2t))["R@5"]


def test_abe_retrieval_top_k_reranks_the_cosine_candidates(scenes_abe):
    from capscore.probes.retrieval import run_retrieval
    from capscore.scores.pairs import get_pair_scorer

    enc, data, A = scenes_abe
    k = 3
    res = run_retrieval(enc, data, scorer=get_pair_scorer("abe"), rerank_k=k)
    img = enc.encode_images(list(data.images)).double().numpy()
    txt = enc.encode_texts(list(data.texts)).double().numpy()
    C = img @ txt.T
    owner = np.asarray(data.text_image)
    expected = []
    for t in range(C.shape[1]):  # text -> image, the direction of ABE-CLIP Table 2
        cand = np.argsort(-C[:, t], kind="stable")[:k]
        own = owner[t]
        if own in cand:
            expected.append(1 + int(sum(A[j, t] >= A[own, t] for j in cand if j != own)))
        else:
            expected.append(1 + int(sum(C[j, t] >= C[own, t] for j in range(C.shape[0]) if j != own)))
    got = [r["rank"] for r in res.rows if r["direction"] == "text->image"]
    assert got == expected
    assert all("cosine_rank" in r for r in res.rows) and res.params["rerank_k"] == k


def test_cli_scenes_retrieval_with_abe(tmp_path, capsys):
    pytest.importorskip("capscore.scenes.tiny", reason="bundled scenes-tiny model not available")
    import json

    from capscore.cli import main

    out = tmp_path / "r"
    assert main(["-q", "probe", "--model", "scenes-tiny", "--suite", "scenes-retrieval", "--n-scenes", "4",
                 "--scorer", "abe", "--rerank-k", "3", "--out", str(out)]) == 0
    s = json.loads((out / "scenes-retrieval.summary.json").read_text())[0]
    assert s["scorer"] == "abe" and s["params"]["rerank_k"] == 3 and s["params"]["first_stage"] == "cosine"
    capsys.readouterr()
    assert main(["-q", "probe", "--model", "scenes-tiny", "--suite", "scenes-retrieval", "--n-scenes", "4",
                 "--rerank-k", "3", "--out", str(tmp_path / "x")]) == 2
    assert "--rerank-k applies to the retrieval suites with --scorer abe only" in capsys.readouterr().err
    assert main(["-q", "probe", "--model", "scenes-tiny", "--suite", "scenes-retrieval", "--scorer", "mcs",
                 "--out", str(tmp_path / "y")]) == 2
    assert "re-ranks with --scorer abe" in capsys.readouterr().err
