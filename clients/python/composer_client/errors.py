"""The exceptions of the client and the worker.

Every answer the server refuses becomes a :class:`ComposerError` carrying the
HTTP status and the server's ``{"error": {"code", "message"}}``; the subclass
says whose move it is::

    try:
        client.cancel(run_id)
    except Conflict as e:      # 409: the run already ended
        print(e.code, e.message)
    except NotFound:           # 404: no such run
        ...
"""

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from .types import Run

__all__ = [
    "ComposerError",
    "Conflict",
    "InvalidRequest",
    "NotFound",
    "Unauthorized",
    "Unavailable",
    "WaitTimeout",
    "error_for_status",
]


class ComposerError(Exception):
    """An error answer of the server, or no answer at all.

    ``status`` is the HTTP status (``None`` when no answer came), ``code`` the
    server's stable ``error.code`` (``not_found``, ``invalid_request``,
    ``conflict``, ``lease_lost`` …; ``http_error`` for an answer that was not
    the API's JSON, ``unreachable`` or ``timeout`` when none came) and
    ``message`` its ``error.message``, meant for people.
    """

    def __init__(self, status: Optional[int], code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}" if status is not None else f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class InvalidRequest(ComposerError):
    """400, 422 (an idempotency key reused with another input) and the other
    refusals of the request itself (405, 413, 414, 415): sending it again
    will not help."""


class Unauthorized(ComposerError):
    """401 (a missing or wrong bearer token) or 403 (refused)."""


class NotFound(ComposerError):
    """404: the run, workflow or version does not exist."""


class Conflict(ComposerError):
    """409: not possible in the current state (cancelling a finished run,
    pausing a paused one; ``lease_lost`` for a worker's task)."""


class Unavailable(ComposerError):
    """5xx, 429, or no answer (connection refused, reset, timed out): the
    server or what it depends on is down or busy; a retry later may succeed.
    ``retry_after`` is the server's ``Retry-After`` in seconds, when it
    sent one."""

    def __init__(self, status: Optional[int], code: str, message: str, retry_after: Optional[float] = None) -> None:
        super().__init__(status, code, message)
        self.retry_after = retry_after


class WaitTimeout(TimeoutError):
    """:meth:`Client.wait` ran out of time before the run ended; ``run`` is
    the run as last seen (still open)."""

    def __init__(self, run_id: str, timeout: float, run: "Run") -> None:
        super().__init__(f"run {run_id} did not end within {timeout:g}s")
        self.run_id = run_id
        self.timeout = timeout
        self.run = run


def error_for_status(status: int, code: str, message: str, retry_after: Optional[float] = None) -> ComposerError:
    """The exception of an error answer with this status."""
    if status >= 500 or status == 429:
        return Unavailable(status, code, message, retry_after)
    if status == 404:
        return NotFound(status, code, message)
    if status == 409:
        return Conflict(status, code, message)
    if status in (401, 403):
        return Unauthorized(status, code, message)
    if status in (400, 405, 413, 414, 415, 422):
        return InvalidRequest(status, code, message)
    return ComposerError(status, code, message)
