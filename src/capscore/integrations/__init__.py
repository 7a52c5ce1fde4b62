"""Adapters for other libraries, each a thin shell over capscore's functions (imported on use)."""
