"""Every non-2xx answer the EPP itself gives is logged once, with its reason and request
id, at most `per_second` lines per second per status.

Why: under CPU overload a request failed with nothing in any log. A flood
of refusals must not become a flood of log lines either, so after `per_second` lines of
one status in a one-second window the rest are counted, and the first line of a later
window says how many were suppressed. 5xx log at ERROR (a 500 with the traceback of its
cause), 4xx at WARNING. Client-chosen text (request id, model name in a reason) is
clipped and escaped so it cannot forge or flood log lines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from epp.errors import EppError
from epp.logsafe import MAX_FIELD_CHARS
from epp.logsafe import clip as _clip

__all__ = ["MAX_FIELD_CHARS", "RefusalLog"]


@dataclass
class _Window:
    start: float
    logged: int = 0
    suppressed: int = 0


class RefusalLog:
    def __init__(
        self,
        logger: logging.Logger,
        per_second: int = 10,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if per_second < 1:
            raise ValueError(f"per_second must be >= 1, got {per_second}")
        self.logger = logger
        self.per_second = per_second
        self.clock = clock
        self._windows: dict[int, _Window] = {}

    def record(self, request_id: str, error: EppError) -> bool:
        """Log this refusal unless its status is over the rate; True if a line was written."""
        now = self.clock()
        w = self._windows.get(error.status)
        carried = 0
        if w is None or now - w.start >= 1.0:
            carried = w.suppressed if w is not None else 0
            w = self._windows[error.status] = _Window(now)
        if w.logged >= self.per_second:
            w.suppressed += 1
            return False
        w.logged += 1
        note = (
            f" ({carried} more {error.status}s suppressed in the second before)" if carried else ""
        )
        level = logging.ERROR if error.status >= 500 else logging.WARNING
        cause = error.__cause__ if error.status >= 500 else None
        self.logger.log(
            level,
            "request %s answered %d: %s%s",
            _clip(request_id),
            error.status,
            _clip(error.message),
            note,
            exc_info=(type(cause), cause, cause.__traceback__) if cause is not None else None,
        )
        return True
