"""Reports: per-item result writers (with resume), the bounded readers of every capscore output, the HTML page."""
from capscore.report.writers import COLUMNS, open_writer, read_rows

__all__ = ["COLUMNS", "open_writer", "read_rows"]
