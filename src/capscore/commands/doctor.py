"""``capscore doctor``: what is present and what is missing for the papers' protocols — offline, touches
nothing (:mod:`capscore.meta.doctor`)."""
from __future__ import annotations


def configure(p) -> None:
    p.add_argument("--data-root", metavar="DIR", help="default $CAPSCORE_DATA or ~/.cache/capscore/data")
    p.add_argument("--weights-root", metavar="DIR", help="default $CAPSCORE_WEIGHTS or ~/.cache/capscore/weights")
    p.add_argument("--metric-weights", metavar="DIR",
                   help="the released files of polos, deneb, fleur, reffleur, expert (default "
                        "$CAPSCORE_METRIC_WEIGHTS or ~/.cache/capscore/metric-weights)")


def run(args) -> int:
    from capscore.meta.doctor import checks, format_checks
    from capscore.meta.reproduce import default_root

    from capscore.scores.learned import weights_dir

    data_root, weights_root = default_root("data", args.data_root), default_root("weights", args.weights_root)
    metric_weights = weights_dir(args.metric_weights)
    print(f"data root {data_root}; weights root {weights_root}; metric weights {metric_weights}")
    print(format_checks(checks(data_root, weights_root, metric_weights)))
    return 0
