"""The one table printer of the CLI: aligned columns, floats at fixed precision, integers as integers.

Every command that prints a table (score's per-system means, probe summaries,
correlate's metric × backbone table, the demo, ``capscore models``) goes through
:func:`format_table`, so alignment and number formatting are the same everywhere.
The layout is pandas' ``to_string(index=False)`` (one space between columns), written
out here so that the core install does not need pandas; each cell is formatted from its
own column's values, so a count stays ``62`` in a column where another row has no value
(an integer among floats is printed as a float, to keep the decimals aligned).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


#: From this magnitude on a float is printed in exponent notation: fixed decimals would print hundreds of digits.
EXPONENT_FROM = 1e12


def format_number(v: float, digits: int = 4) -> str:
    """A float at ``digits`` decimals, or in exponent notation from :data:`EXPONENT_FROM` on (``1.0000e+300``)."""
    return f"{v:.{digits}e}" if math.isfinite(v) and abs(v) >= EXPONENT_FROM else f"{v:.{digits}f}"


def format_table(rows: Sequence[Mapping], columns: Sequence[str] | None = None, *, digits: int = 4,
                 indent: str = "  ") -> str:
    """Rows (dicts) -> an aligned text table; missing cells are blank, floats get ``digits`` decimals.

    Numeric columns (every value a number or missing) are right-aligned, text columns left-aligned.
    """
    if not rows:
        return indent + "(no rows)"
    cols = list(columns) if columns is not None else list(dict.fromkeys(k for r in rows for k in r))

    def cell(v, floats: bool) -> str:
        if v is None or (isinstance(v, float) and v != v):
            return ""
        if isinstance(v, float) or (floats and isinstance(v, int) and not isinstance(v, bool)):
            return format_number(v, digits)
        return str(v)

    def is_number(v) -> bool:
        return isinstance(v, (int, float))

    lines = []
    columns_text = []
    for c in cols:
        values = [r.get(c) for r in rows]
        numeric = all(is_number(v) or v is None for v in values) and any(is_number(v) for v in values)
        floats = numeric and any(isinstance(v, float) and v == v for v in values)  # ints among floats: floats
        cells = [cell(v, floats) for v in values]
        width = max([len(str(c))] + [len(x) for x in cells])
        align = str.rjust if numeric else str.ljust
        columns_text.append([str(c).rjust(width) if numeric else str(c).ljust(width)]
                            + [align(x, width) for x in cells])
    for line in zip(*columns_text):
        lines.append(indent + " ".join(line).rstrip())
    return "\n".join(lines)


def format_p(p: float | None, resamples: int | None = None) -> str:
    """A p-value as text, never claiming more resolution than its test has.

    A resampling test with R resamples resolves p only to 1/R: a p below that is printed
    ``< 1/R`` (``< 0.001`` for 1000 resamples; a bootstrap p of 0 and the randomisation test's
    smallest p, 1/(R + 1), both read so), and other p-values get the decimals 1/R has (at least 3).
    Without ``resamples`` (an analytic p, e.g. Williams' t test) p < 0.001 is printed ``< 0.001``.
    ``None`` or a non-finite p is ``n/a``.
    """
    if p is None or not math.isfinite(p):
        return "n/a"
    if resamples:
        floor = 1 / resamples
        if p < floor * (1 - 1e-9):
            return f"< {floor:.2g}"
        return f"{p:.{max(3, math.ceil(math.log10(resamples) - 1e-9))}f}"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"
