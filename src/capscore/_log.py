"""Logging and one-time warnings shared by the package."""
from __future__ import annotations

import logging
import warnings

log = logging.getLogger("capscore")


class CapscoreWarning(UserWarning):
    """Warnings a user should see once (random weights, truncated captions...)."""


def warn(message: str) -> None:
    warnings.warn(message, CapscoreWarning, stacklevel=3)
