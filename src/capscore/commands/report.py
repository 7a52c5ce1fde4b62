"""``capscore report RUN_DIR... --out report.html``: one self-contained HTML page of plots and tables.

A thin shell over :func:`capscore.report.html.write_report` (see docs/report.md).
"""
from __future__ import annotations


def configure(p) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN_DIR",
                   help="output folders (searched recursively) or files of score, probe, correlate, train "
                        "and explain runs")
    p.add_argument("--out", required=True, metavar="FILE.html", help="the page to write (replaced if it exists)")
    p.add_argument("--title", default="capscore report", help="page title (default 'capscore report')")


def run(args) -> int:
    from capscore.report.html import SECTIONS, write_report

    out, runs = write_report(args.runs, args.out, title=args.title)
    shown = [head for _, head, _, has in SECTIONS if has(runs)]
    print(f"wrote {out}: {len(runs)} run(s); sections: {', '.join(shown)}")
    return 0
