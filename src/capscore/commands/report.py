"""``capscore report RUN_DIR... --out report.html``: one self-contained HTML page of plots and tables.

A thin shell over :func:`capscore.report.html.write_report` (see docs/report.md).
"""
from __future__ import annotations

from capscore.commands._args import positive_int


def configure(p) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN_DIR",
                   help="output folders (searched recursively) or files of score, probe, correlate, train "
                        "and explain runs")
    p.add_argument("--out", required=True, metavar="FILE.html", help="the page to write (replaced if it exists)")
    p.add_argument("--title", default="capscore report", help="page title (default 'capscore report')")
    p.add_argument("--max-rows", type=positive_int, default=None, metavar="N",
                   help="score rows read in all (default 20,000,000; 8 bytes of memory each)")


def run(args) -> int:
    from capscore.errors import CapscoreError
    from capscore.report.html import NO_PLOTS, SECTIONS, plots_available, write_report
    from capscore.report.rows import DEFAULT_LIMITS, Limits

    limits = DEFAULT_LIMITS if args.max_rows is None else Limits(max_rows=args.max_rows)
    if not str(args.out).lower().endswith((".html", ".htm")):
        raise CapscoreError(f"--out must be an .html file; got {str(args.out)!r}")
    out, runs = write_report(args.runs, args.out, title=args.title, limits=limits)
    shown = [head for _, head, _, has in SECTIONS if has(runs)]
    print(f"wrote {out}: {len(runs)} run(s); sections: {', '.join(shown)}"
          + ("" if plots_available() else f" ({NO_PLOTS})"))
    return 0
