"""The one table printer of the CLI (and its p-value format) lives at the bottom layer (:mod:`capscore._table`),
so that backbones and scenes can print tables; these names stay for the report and the commands."""
from capscore._table import format_number, format_p, format_table

__all__ = ["format_number", "format_p", "format_table"]
