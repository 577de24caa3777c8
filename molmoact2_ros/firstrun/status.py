"""The words every first-contact line and report step ends in, and how an error is shown."""

from __future__ import annotations

PASS, FAIL, SKIP, NOT_RUN = "PASS", "FAIL", "SKIP", "not run"


def error(exc: BaseException) -> str:
    """``Type: message``, as a report step records an exception."""
    return f"{type(exc).__name__}: {exc}"
