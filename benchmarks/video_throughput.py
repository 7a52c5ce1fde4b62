"""Video scoring throughput (clips/s, captions/s) on scenes clips, against per-caption decoding measured in the same run.

Writes N scenes clips (``capscore.scenes.video.write_scenes_videos``: real .mp4 files, lossless
H.264, ``--frames`` frames each at 4 fps, ``--size`` px) with their 5 graded captions each, then
scores every caption with a video metric (default pac-s) through ``capscore.pipeline.score_all`` — the
path ``capscore score --videos`` takes — and prints:

* capscore cold (empty in-memory cache): clips/s, captions/s, and the share of wall time spent
  decoding (+ frame preprocessing, worker threads), encoding frames (image tower), and the rest
  (text tokens, formulas);
* no sharing: the same captions, each decoding and encoding its clip's frames itself (a fresh
  cache per caption), as a per-caption scorer without a video cache would — ratio against cold;
* warm: the same run again on a persistent cache that already holds every clip's frames;
* warm, another metric (``--warm-metric``, default emscore): a re-run on that persistent cache
  (frames and per-token caption features both stored there) with a different metric, against
  the cold run (target ≥ 20x faster); its scores are checked against the same metric computed
  cold on an empty in-memory cache (max |delta|, expected 0).

    python benchmarks/video_throughput.py                     # 24 clips x 5 captions, scenes-tiny
    python benchmarks/video_throughput.py --clips 48 --model ViT-B-32 --size 224 --frames 16
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clips", type=int, default=24)
    ap.add_argument("--frames", type=int, default=16, help="frames per clip (default 16)")
    ap.add_argument("--sampling", default="uniform:8", help="frame sampling (default uniform:8)")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--model", default="scenes-tiny")
    ap.add_argument("--metric", default="pac-s")
    ap.add_argument("--warm-metric", default="emscore", help="metric of the warm re-run (default emscore)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    import torch

    from capscore.backbones import load_backbone
    from capscore.data.captions import read_captions
    from capscore.data.video import index_videos
    from capscore.embed import EmbeddingCache, Encoder, MemoryCache
    from capscore.scenes.video import write_scenes_videos
    from capscore.pipeline import score_all

    print(f"torch threads {torch.get_num_threads()}, device {args.device}, model {args.model}, metric {args.metric}, "
          f"{args.clips} clips x {args.frames} frames of {args.size}px, sampling {args.sampling}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bb = load_backbone(args.model, device=args.device, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        write_scenes_videos(tmp, args.clips, frames=args.frames, size=args.size)
        print(f"wrote {args.clips} .mp4 clips in {time.perf_counter() - t:.2f}s")
        recs = list(read_captions(Path(tmp) / "captions.jsonl", images=index_videos(Path(tmp) / "videos")))
        n = len(recs)

        def run(encoder, records):
            t0 = time.perf_counter()
            rows = list(score_all(records, encoder, args.metric, medium="video", options={"sampling": args.sampling}))
            return time.perf_counter() - t0, rows

        bb_warm = Encoder(bb, cache=MemoryCache())  # one untimed pass to load kernels / tokenizer
        run(bb_warm, recs[:5])

        cold = Encoder(bb, cache=MemoryCache())
        wall, rows = run(cold, recs)
        st = cold.stats
        other = wall - st.decode_seconds - st.encode_seconds
        print(f"capscore cold : {wall:7.2f}s  {args.clips / wall:7.2f} clips/s  {n / wall:7.2f} captions/s  "
              f"decode {100 * st.decode_seconds / wall:4.1f}%  encode frames {100 * st.encode_seconds / wall:4.1f}%  "
              f"other {100 * other / wall:4.1f}%  ({st.videos_encoded} clips, {st.frames_encoded} frames encoded)")

        t0 = time.perf_counter()
        dec = enc = 0.0
        frames = 0
        for rec in recs:  # each caption decodes and encodes its own clip
            e = Encoder(bb, cache=MemoryCache())
            run(e, [rec])
            dec, enc, frames = dec + e.stats.decode_seconds, enc + e.stats.encode_seconds, frames + e.stats.frames_encoded
        alone = time.perf_counter() - t0
        print(f"no sharing    : {alone:7.2f}s  {args.clips / alone:7.2f} clips/s  {n / alone:7.2f} captions/s  "
              f"decode {100 * dec / alone:4.1f}%  encode frames {100 * enc / alone:4.1f}%  ({frames} frames encoded)")
        print(f"ratio cold / no sharing: {alone / wall:.2f}x faster")

        cache_dir = Path(tmp) / "cache"
        c0 = time.process_time()
        pcold, _ = run(Encoder(bb, cache=EmbeddingCache(cache_dir)), recs)
        pcold_cpu = time.process_time() - c0
        print(f"cold, persistent cache: {pcold:7.2f}s wall {pcold_cpu:7.2f}s cpu")
        warm = Encoder(bb, cache=EmbeddingCache(cache_dir))
        wwall, wrows = run(warm, recs)
        same = max(abs(a["score"] - b["score"]) for a, b in zip(rows, wrows))
        print(f"warm cache    : {wwall:7.2f}s  {args.clips / wwall:7.2f} clips/s  {n / wwall:7.2f} captions/s  "
              f"({warm.stats.videos_cached} clips from the cache, {warm.stats.frames_encoded} frames encoded; "
              f"max |delta score| vs cold {same:.1e})")
        print(f"ratio warm / cold: {wall / wwall:.2f}x faster")

        def run_metric(encoder, metric):
            t0 = time.perf_counter()
            out = list(score_all(recs, encoder, metric, medium="video", options={"sampling": args.sampling}))
            return time.perf_counter() - t0, out

        _, ref_rows = run_metric(Encoder(bb, cache=MemoryCache()), args.warm_metric)  # cold, in memory
        other = Encoder(bb, cache=EmbeddingCache(cache_dir))
        c0 = time.process_time()
        owall, orows = run_metric(other, args.warm_metric)
        ocpu = time.process_time() - c0
        same = max(abs(a["score"] - b["score"]) for a, b in zip(ref_rows, orows))
        print(f"warm, {args.warm_metric:9s}: {owall:7.3f}s wall {ocpu:7.3f}s cpu  ({other.stats.videos_cached} clips "
              f"from the cache, {other.stats.frames_encoded} frames encoded; "
              f"max |delta score| vs {args.warm_metric} cold {same:.1e})")
        print(f"ratio cold {args.metric} (persistent cache) / warm {args.warm_metric}: {pcold / owall:.1f}x wall, "
              f"{pcold_cpu / ocpu:.1f}x cpu faster (target >= 20x); load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
