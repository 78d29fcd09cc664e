"""The argument checks of a client call: run before anything is registered or sent."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["check_method", "checked_timeout"]


def checked_timeout(timeout: Any, what: str = "timeout") -> float:
    """``timeout`` as a float: a positive number of seconds, ``inf`` for none.

    TypeError for anything that is not a real number (``"5"``, ``None``,
    ``True``); ValueError for 0, negative numbers and NaN. A call with such a
    timeout sends nothing.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(timeout).__name__}")
    value = float(timeout)
    if math.isnan(value) or value <= 0:
        raise ValueError(f"{what} must be > 0 seconds (math.inf for no timeout), got {timeout!r}")
    return value


def check_method(method: Any) -> None:
    """TypeError unless ``method`` is a str; ValueError when it is empty."""
    if not isinstance(method, str):
        raise TypeError(f"method must be a str, not {type(method).__name__}")
    if not method:
        raise ValueError("method must be a non-empty str")
