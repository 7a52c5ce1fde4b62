"""Data: records and one loader per public format."""
from capscore.data.records import Record

__all__ = ["Record"]
