"""The one table printer of the CLI lives at the bottom layer (:mod:`capscore._table`), so that backbones and
scenes can print tables; this name stays for the report and the commands."""
from capscore._table import format_table

__all__ = ["format_table"]
