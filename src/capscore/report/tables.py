"""The one table printer of the CLI (pandas ``to_string``): aligned columns, floats at fixed precision.

Every command that prints a table (score's per-system means, probe summaries,
correlate's metric × backbone table, the demo) goes through :func:`format_table`,
so alignment and number formatting are the same everywhere.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence


def format_table(rows: Sequence[Mapping], columns: Sequence[str] | None = None, *, digits: int = 4,
                 indent: str = "  ") -> str:
    """Rows (dicts) -> an aligned text table; missing cells are blank, floats get ``digits`` decimals."""
    import pandas as pd

    if not rows:
        return indent + "(no rows)"
    cols = list(columns) if columns is not None else list(dict.fromkeys(k for r in rows for k in r))
    frame = pd.DataFrame([{c: r.get(c) for c in cols} for r in rows], columns=cols)

    def cell(v):
        if v is None or (isinstance(v, float) and v != v):
            return ""
        if isinstance(v, float):
            return f"{v:.{digits}f}"
        return str(v)

    numeric = {c for c in cols if all(isinstance(r.get(c), (int, float)) or r.get(c) is None for r in rows)
               and any(isinstance(r.get(c), (int, float)) for r in rows)}
    frame = frame.astype(object).map(cell)
    for c in cols:  # text left-aligned, numbers right-aligned (pandas right-aligns every cell)
        if c not in numeric:
            width = max([len(str(c))] + [len(v) for v in frame[c]])
            frame[c] = [v.ljust(width) for v in frame[c]]
    frame.columns = [str(c).ljust(len(frame[c].iloc[0])) if c not in numeric else str(c) for c in cols]
    text = frame.to_string(index=False, justify="right")
    return "\n".join(indent + line.rstrip() for line in text.splitlines())
