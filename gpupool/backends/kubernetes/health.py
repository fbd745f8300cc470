"""Whether the API server answers, as the threads that talk to it last found it (shown in ``gpupool status``)."""

from __future__ import annotations

import threading
import time
from typing import Any


class Health:
    """The last success and the current failure of each kind of call (watches, starts, stops)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._errors: dict[str, tuple[str, float]] = {}  # source -> (message, failing since)
        self.last_ok = 0.0

    def ok(self, source: str) -> None:
        with self._lock:
            self._errors.pop(source, None)
            self.last_ok = time.time()

    def failed(self, source: str, error: BaseException | str) -> None:
        with self._lock:
            since = self._errors.get(source, ("", time.time()))[1]
            self._errors[source] = (describe(error), since)

    def snapshot(self) -> dict[str, Any]:
        """``{"ok", "errors": [{"source", "error", "since"}], "last_ok"}``: ``ok`` False while any call fails."""
        with self._lock:
            errors = [{"source": s, "error": m, "since": t} for s, (m, t) in sorted(self._errors.items())]
        return {"ok": not errors, "errors": errors, "last_ok": self.last_ok or None}


def describe(error: BaseException | str) -> str:
    """One line for humans: an ApiException's status and reason, else the exception's own text."""
    if isinstance(error, str):
        return error
    status = getattr(error, "status", None)
    reason = getattr(error, "reason", None)
    if isinstance(status, int) and status:
        return f"HTTP {status} {reason or ''}".strip()
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[-1] if text else ''}"[:300]
