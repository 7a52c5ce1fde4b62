"""The sharded inputs of ``capscore score`` (``--webdataset``, ``--parquet``, ``--hf-dataset``) and ``--engine``.

Kept apart from ``score.py`` so that file only gains a few dispatch lines:
:func:`add_arguments` declares the options, :func:`source_from_args` turns
them into a :class:`ShardedSource` (shards + column options) that both engines
read through :func:`capscore.data.shards.read_shard`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from capscore.commands._args import positive_float, positive_int
from capscore.errors import CapscoreError

if TYPE_CHECKING:
    from capscore.data.sources import ShardedSource

FLAGS = {"webdataset": "--webdataset", "parquet": "--parquet", "hf": "--hf-dataset"}


def add_arguments(p) -> None:
    g = p.add_argument_group("sharded inputs (instead of --images/--captions; see docs/scale.md)")
    g.add_argument("--webdataset", metavar="PATTERN",
                   help="WebDataset tar shards as img2dataset writes them (KEY.jpg|png|webp + KEY.txt + KEY.json): "
                        "a path, a folder, or a brace pattern such as 'shards/{00000..00127}.tar'")
    g.add_argument("--parquet", metavar="FILE|DIR", help="Parquet file, or a folder of them (one shard per file)")
    g.add_argument("--hf-dataset", metavar="DIR", help="a Hugging Face dataset saved with save_to_disk")
    g.add_argument("--split", metavar="NAME", help="--hf-dataset split (default: the only one)")
    g.add_argument("--caption-key", default="txt", metavar="EXT",
                   help="--webdataset: member extension holding the caption (default txt)")
    g.add_argument("--image-column", default="image", metavar="NAME",
                   help="--parquet/--hf-dataset: image bytes, {bytes,path} struct or path column (default image)")
    g.add_argument("--caption-column", metavar="NAME",
                   help="--parquet/--hf-dataset: caption column (default caption, or text when there is none)")
    g.add_argument("--id-column", metavar="NAME",
                   help="--parquet/--hf-dataset: id column (default key, then id, else FILE:ROW)")
    g.add_argument("--refs-column", metavar="NAME",
                   help="references for refclip-s/refpac-s: a list column (--parquet/--hf-dataset) or a list "
                        "field of KEY.json (--webdataset)")
    g.add_argument("--max-member-mb", type=positive_float, default=256, metavar="MB",
                   help="largest tar member / Parquet image cell read into memory (default 256 MiB)")
    add_engine_arguments(p)


def add_engine_arguments(p, *, score: bool = True) -> None:
    """--engine and its Ray options; ``score=False`` (probe, correlate) leaves out the per-shard output format."""
    g = p.add_argument_group("engine (see docs/scale.md)")
    g.add_argument("--engine", default="local", choices=("local", "ray"),
                   help="local: this process (default); ray: encode on a pool of Ray actors over a cluster")
    g.add_argument("--address", metavar="ADDR",
                   help="--engine ray: the cluster to join (e.g. auto, or HOST:6379); default: a local cluster")
    g.add_argument("--workers", type=positive_int, metavar="N",
                   help="--engine ray: encoder actors (default: 1 per GPU with --device cuda, else 1 per 2 CPUs)")
    g.add_argument("--gpus-per-worker", type=positive_float, default=1.0, metavar="G",
                   help="--engine ray with --device cuda: GPUs per encoder actor (default 1; 0.5 packs two)")
    g.add_argument("--threads-per-worker", type=positive_int, default=1, metavar="T",
                   help="--engine ray: torch threads (and CPUs reserved) per encoder actor (default 1)")
    if not score:
        return
    g.add_argument("--out-format", default="parquet", choices=("parquet", "jsonl", "csv"),
                   help="sharded input with --out DIR (either engine): format of the per-shard files (default "
                        "parquet)")


def source_given(args) -> bool:
    return any(getattr(args, a, None) for a in ("webdataset", "parquet", "hf_dataset"))


def ray_options(args):
    """The Ray engine's options (capscore.engines.ray.RayOptions) from the flags, whose types parse their
    ranges. Ray's own log lines and progress bars show with ``--debug`` only."""
    from capscore.engines.ray import RayOptions

    return RayOptions(address=args.address, workers=args.workers, gpus_per_worker=args.gpus_per_worker,
                      threads_per_worker=args.threads_per_worker, verbose=bool(getattr(args, "debug", False)))


def encoder_factory(args):
    """``make_encoder`` for ``--engine local``, its Ray variant for ``--engine ray`` (probe, correlate)."""
    if getattr(args, "engine", "local") != "ray":
        from capscore.embed.factory import make_encoder

        return make_encoder
    from capscore.engines.ray import ray_encoders

    return ray_encoders(ray_options(args))


def source_from_args(args) -> ShardedSource | None:
    """The sharded source the user named, or None for --images/--captions; errors on a mix."""
    from capscore.data.shards import SourceOptions
    from capscore.data.sources import ShardedSource

    given = {k: getattr(args, a) for k, a in (("webdataset", "webdataset"), ("parquet", "parquet"),
                                                 ("hf", "hf_dataset")) if getattr(args, a, None)}
    classic = bool(getattr(args, "captions", None) or getattr(args, "images", None))
    if len(given) > 1 or (given and classic):
        named = [FLAGS[k] for k in given] + (["--images/--captions"] if classic else [])
        raise CapscoreError(f"{' and '.join(named)} name two inputs; give one")
    if not given:
        if getattr(args, "engine", "local") == "ray":
            raise CapscoreError("--engine ray reads sharded inputs: use --webdataset, --parquet or --hf-dataset")
        return None
    if getattr(args, "split", None) and "hf" not in given:
        raise CapscoreError("--split applies to --hf-dataset only")
    kind, spec = next(iter(given.items()))
    options = SourceOptions(caption_key=args.caption_key, refs_key=args.refs_column, image_column=args.image_column,
                            caption_column=args.caption_column, id_column=args.id_column,
                            max_member_bytes=int(getattr(args, "max_member_mb", 256) * 2**20))
    return ShardedSource.list(kind, spec, options, split=getattr(args, "split", None))

