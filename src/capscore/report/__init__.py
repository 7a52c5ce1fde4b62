"""Reports: per-item result writers (with resume) and, later, tables and plots."""
from capscore.report.writers import COLUMNS, open_writer, read_rows

__all__ = ["COLUMNS", "open_writer", "read_rows"]
