"""``capscore reproduce``: recompute the papers' headline numbers and compare (see :mod:`capscore.meta.reproduce`).

``--list`` shows every shipped table; ``TABLE`` runs each row's protocol on the local files; ``--out`` writes
``reproduce.json``."""
from __future__ import annotations

from capscore.commands._args import add_device, output_dir, positive_int, seed
from capscore.errors import CapscoreError


def configure(p) -> None:
    p.add_argument("table", nargs="?", metavar="TABLE", help="a table name (see --list) or a CSV of the same columns")
    p.add_argument("--list", action="store_true", help="show every table with its rows, then stop")
    p.add_argument("--data-root", metavar="DIR", help="datasets in their published layouts (default $CAPSCORE_DATA "
                                                      "or ~/.cache/capscore/data; see docs/meta.md)")
    p.add_argument("--weights-root", metavar="DIR", help="weights files (default $CAPSCORE_WEIGHTS or "
                                                         "~/.cache/capscore/weights; see docs/meta.md)")
    p.add_argument("--metric-weights", metavar="DIR",
                   help="released files of polos, deneb, fleur, reffleur, expert (default $CAPSCORE_METRIC_WEIGHTS "
                        "or ~/.cache/capscore/metric-weights; see docs/learned.md)")
    add_device(p)
    p.add_argument("--batch-size", type=positive_int, default=64, metavar="N", help="encoder batch size (default 64)")
    p.add_argument("--seed", type=seed, default=0, help="seed (Pascal-50S ties and reference draws; default 0)")
    p.add_argument("--out", metavar="DIR", help="write reproduce.json here")


def run(args) -> int:
    from capscore.meta.reproduce import (default_root, format_results, format_tables, read_table, run_table,
                                         write_results)

    if args.list:
        print(format_tables())
        return 0
    if not args.table:
        raise CapscoreError("give a TABLE (see `capscore reproduce --list`)")
    data_root, weights_root = default_root("data", args.data_root), default_root("weights", args.weights_root)
    results = run_table(read_table(args.table), data_root=data_root, weights_root=weights_root, device=args.device,
                        batch_size=args.batch_size, seed=args.seed, metric_weights=args.metric_weights)
    print(f"{args.table}: data {data_root}, weights {weights_root}")
    print(format_results(results))
    if args.out:
        out = write_results(output_dir(args.out) / "reproduce.json", results, table=args.table, data_root=data_root,
                            weights_root=weights_root, seed=args.seed)
        print(f"wrote {out}")
    if not any(r.ours is not None for r in results):  # nothing was reproduced: not a success
        raise CapscoreError(f"no row of {args.table} could be run ({results[0].skipped}"
                            + (f", and {len(results) - 1} more" if len(results) > 1 else "") + "); see capscore doctor")
    return 0
