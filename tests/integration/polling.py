"""Wait for what the operator does asynchronously, without a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def eventually(check: Callable[[], Any], timeout: float = 15) -> Any:
    """Retry ``check`` until it stops raising AssertionError; its last failure otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
