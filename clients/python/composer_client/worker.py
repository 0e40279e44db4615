"""A Composer worker in Python: runs steps of custom node types with only the
coordinator's URL and the worker token (no database, no Redis).

    from composer_client.worker import Worker, TaskError

    def resize(task):
        if task.input["size"] > 4096:
            raise TaskError("too large", retryable=False)
        return {"resized": task.input["size"]}

    Worker("http://127.0.0.1:8080", token).handle("resize-image", resize).run()

The worker long-polls ``POST /v1/tasks/poll`` for the queues it serves,
by default (no ``queues``) those its handlers' types go to: a custom node
with no ``queue`` goes to the queue named as its type in lower case
(``Resize`` to ``resize``), as the coordinator decides it. With ``queues``
given, it warns at start for each handler whose type's queue is not among
them. It runs each task on a thread of its own while a heartbeat keeps the lease,
and completes or fails it. A handler's return value is the step's output
(any JSON value); an exception fails the attempt (retried under the node's
retry policy unless it is a ``TaskError`` with ``retryable=False``). When
the lease is lost (the worker stalled past the lease and another worker took
the task, or the run was cancelled), ``task.cancelled`` is set and the result
is dropped.

Each completion or failure also asks for a task it makes ready on the
worker's queues (eager dispatch, ``next``): the coordinator leases it in the
same commit and answers with it, and the worker runs it on the thread (and
slot) the finished task frees, without a poll. ``eager=False`` turns it off;
a coordinator older than it refuses the ask once, and then the worker only
polls.

``namespace="team-a"`` makes it work that namespace's tasks only: every
call of the task API names it (the ``composer-namespace`` header); without
one it works ``default``'s.

``run()`` stops on SIGINT/SIGTERM (or ``stop()``): no new polls, running
tasks finish and report, then it returns. Secret references in an input
(``${ .secrets.NAME }``) are resolved from ``COMPOSER_SECRET_NAME`` in the
worker's environment, as the Rust worker does, and scrubbed from outputs and
error messages.

``task.log(line)`` adds a line to the step's log (kept with the attempt,
shown in the UI), as do the records a handler logs with :mod:`logging` on
its task's thread; both are scrubbed of secrets and sent before the result.

It logs to ``composer_client.worker``: INFO when it starts and stops,
DEBUG when each task starts and ends, WARNING for a handler whose type's
queue it does not poll (at start; also a ``UserWarning``, shown without any
logging set up), a lost lease, a report being retried and
a failed poll, ERROR for a result no coordinator took.
No record carries a task's input or a secret's value.
"""

import base64
import json
import logging
import os
import random
import re
import signal
import socket
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Callable, Optional

from ._http import Transport
from ._version import __version__
from .errors import ComposerError, Conflict, InvalidRequest, NotFound, Unavailable

__all__ = ["MAX_PENDING_LOG_LINES", "Handler", "LeaseLost", "Task", "TaskError", "Worker"]

JSON = Any
Handler = Callable[["Task"], JSON]
"""A task handler: takes the task, returns its output (any JSON value)."""

log = logging.getLogger("composer_client.worker")

_RUN_NOT_FOUND = "run_not_found"
_MAX_POLL = 100
"""The most tasks one poll may lease."""

_URGENT = 2
"""The least urgent priority an urgent slot takes: 1 and 2, those served before the default, 3."""

_MAX_SLOTS = 10_000
"""The most slots of each kind (the Rust worker's limit too)."""


_MAX_QUEUES = 32
"""The most queues one poll may name (the task API's limit)."""

_QUEUE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
"""What a queue name may be (nor ``.`` or ``..``): what the task API's poll takes."""

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _default_queue(node_type: str) -> str:
    """The queue a node of ``node_type`` that names no ``queue`` goes to:
    its type in lower case (ASCII letters only, as the coordinator does)."""
    return node_type.translate(_ASCII_LOWER)


def _is_queue_name(name: str) -> bool:
    return bool(_QUEUE_NAME.fullmatch(name)) and name not in (".", "..")


_ERROR_CODE = re.compile(r"[a-z0-9_.-]{1,64}")
"""What an error code may be: what the task API's ``/fail`` takes."""

MAX_PENDING_LOG_LINES = 1000
"""Most log lines a task holds before they are sent."""
_MAX_LOG_LINE_BYTES = 4096
"""The longest line the coordinator keeps."""
_LOG_TIMEOUT = 2.0
"""How long one call with log lines may take: they go from the heartbeat's thread."""
_LOG_LINES_PER_CALL = 100
"""Most lines one ``POST /v1/tasks/{id}/logs`` takes."""
_LOG_EVERY = 1.0
"""How often a running task's lines are sent, in seconds."""

_current = threading.local()
"""The task the current thread runs, for :class:`_Capture`."""


class _Capture(logging.Handler):
    """Puts the records a handler logs on its task's thread in the task's log
    (the worker's own records stay out: they are about the worker)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        task: Optional[Task] = getattr(_current, "task", None)
        if task is None or record.name.startswith("composer_client"):
            return
        try:
            task.log(self.format(record))
        except Exception:  # noqa: BLE001 - logging must never fail a handler
            self.handleError(record)


class TaskError(Exception):
    """Fails the attempt; ``retryable=False`` fails the step for good.

    ``code`` names what went wrong for failure edges to test
    (``.nodes.X.error.code``; 1 to 64 of ``a-z 0-9 _ . -``, ``task_failed``
    without one), and ``status`` is the HTTP status a target answered with,
    when the failure is one (100 to 599). ``retry_after_ms`` is a 429's
    ``Retry-After`` in milliseconds: the node's next attempt waits at least
    that long, and with ``retry.on_429: respect`` (the default for a node
    with limits) its limit keys are held as long; it is sent only with
    ``status=429``, the one status it means something with. Each is checked
    here, so a bad one is the handler's ``ValueError``, not a refused report.
    """

    def __init__(
        self,
        message: str,
        retryable: bool = True,
        *,
        code: Optional[str] = None,
        status: Optional[int] = None,
        retry_after_ms: Optional[int] = None,
    ) -> None:
        if code is not None and not _ERROR_CODE.fullmatch(code):
            raise ValueError(f"TaskError code must be 1 to 64 of a-z 0-9 _ . -, got {code!r}")
        if status is not None and (isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599):
            raise ValueError(f"TaskError status must be an HTTP status (100 to 599), got {status!r}")
        if retry_after_ms is not None and (
            isinstance(retry_after_ms, bool) or not isinstance(retry_after_ms, int) or not 0 <= retry_after_ms < 2**63
        ):
            raise ValueError(f"TaskError retry_after_ms must be whole milliseconds, 0 or more, got {retry_after_ms!r}")
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.code = code
        self.status = status
        self.retry_after_ms = retry_after_ms


class LeaseLost(Exception):
    """The worker no longer holds the task's lease: drop the result. A
    handler may raise it (after seeing ``task.cancelled``) to stop early."""


@dataclass
class Task:
    """A leased task. ``input`` is the node's evaluated config, its secret
    references resolved. ``traceparent`` is the W3C trace context of this
    attempt's span (``00-<trace id>-<span id>-<flags>``; ``None`` from a
    coordinator that sends none): pass it on in what the handler calls, so
    that their traces are the run's. ``cancelled`` is set when the lease is
    lost: the result will be dropped, so a long handler may stop early."""

    id: str
    run_id: str
    attempt: int
    node_id: str
    node_type: str
    queue: str
    input: JSON = field(repr=False)
    lease_ttl_ms: int
    traceparent: Optional[str] = None
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    priority: int = 3
    """Its run's priority (1 served first, 5 last): sent back with the
    result, so the coordinator applies an urgent run's results first."""
    stages: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    """When the attempt passed each stage on its way here (microseconds
    since the epoch): sent back with the result, with when the handler
    started and ended, for the attempt's span in the run's trace."""
    _secrets: list[str] = field(default_factory=list, repr=False, compare=False)
    _pattern: Optional["re.Pattern[str]"] = field(default=None, repr=False, compare=False)
    _pending: list[str] = field(default_factory=list, repr=False, compare=False)
    _dropped: int = field(default=0, repr=False, compare=False)
    _log_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def log(self, message: str) -> None:
        """Adds a line to the step's log (``GET /v1/runs/{id}/tasks/{node}/logs``
        and the run page in the UI), scrubbed of the input's secrets. Lines are
        sent about once a second and before the result; at most
        ``MAX_PENDING_LOG_LINES`` wait unsent (the log says how many were
        dropped past that). Records a handler logs with :mod:`logging` on its
        task's thread land here too, at their logger's level."""
        # A NUL cannot be stored: the coordinator would refuse the batch.
        if self._pattern is None and self._secrets:
            self._pattern = _scrubber(self._secrets)
        line = str(message)
        if self._pattern is not None:
            line = self._pattern.sub("[secret]", line)
        # What the coordinator can store: valid UTF-8 without NUL, at most
        # 4,096 bytes (cut here, so that no batch is too large to send).
        data = line.replace("\x00", "\ufffd").encode("utf-8", "replace")
        line = data[:_MAX_LOG_LINE_BYTES].decode("utf-8", "ignore")
        with self._log_lock:
            if len(self._pending) < MAX_PENDING_LOG_LINES:
                self._pending.append(line)
            else:
                self._dropped += 1

    def _take_logs(self) -> list[str]:
        with self._log_lock:
            lines, self._pending = self._pending, []
            if self._dropped:
                lines.append(
                    f"[worker: {self._dropped} lines dropped: more than {MAX_PENDING_LOG_LINES} waited to be sent]"
                )
                self._dropped = 0
        return lines

    @classmethod
    def _of(cls, leased: dict[str, Any]) -> "Task":
        """A task from the poll's answer (fields it does not know are left)."""
        return cls(
            id=str(leased["id"]),
            run_id=str(leased["run_id"]),
            attempt=int(leased["attempt"]),
            node_id=str(leased["node_id"]),
            node_type=str(leased["node_type"]),
            queue=str(leased["queue"]),
            input=leased.get("input"),
            lease_ttl_ms=int(leased["lease_ttl_ms"]),
            traceparent=leased.get("traceparent"),
            priority=_priority_of(leased.get("priority")),
            stages=_stages_of(leased.get("stages")),
        )


_STAGES = ("dispatched_at_us", "published_at_us", "read_at_us", "leased_at_us", "started_at_us", "finished_at_us")
"""The stages a result may send back: those the task API knows (it refuses others)."""


def _priority_of(value: Any) -> int:
    """A leased task's priority, 3 (the default) when missing or not one."""
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 5:
        return value
    return 3


def _stages_of(value: Any) -> dict[str, int]:
    """The known stages of a leased task's ``stages``, whole microseconds only."""
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if k in _STAGES and isinstance(v, int) and not isinstance(v, bool)}


def _now_us() -> int:
    return time.time_ns() // 1000


_PRIORITY_HEADER = "composer-priority"

_SECRET = re.compile(r"\$\$\{|\$\{\s*\.secrets\.([A-Za-z_][A-Za-z0-9_]*)\s*\}")


def _resolve(value: JSON, used: list[str]) -> JSON:
    """Replaces secret references in strings; ``$${`` is the text ``${``."""
    if isinstance(value, str):
        if "${" not in value:
            return value

        def sub(m: "re.Match[str]") -> str:
            if m.group(0) == "$${":
                return "${"
            name = m.group(1)
            secret = os.environ.get("COMPOSER_SECRET_" + name)
            if secret is None:
                raise TaskError(
                    f"unknown secret {name}: set COMPOSER_SECRET_{name} in the worker's environment",
                    retryable=False,
                )
            if secret not in used:
                used.append(secret)
            return secret

        return _SECRET.sub(sub, value)
    if isinstance(value, list):
        return [_resolve(v, used) for v in value]
    if isinstance(value, dict):
        return {k.replace("$${", "${"): _resolve(v, used) for k, v in value.items()}
    return value


_MIN_ENCODED_CHARS = 4
"""Secrets shorter than this are found only as they are (every encoding of
a three-letter value would match ordinary text)."""


def _char(c: str) -> str:
    """What one character of a secret may appear as: itself, URL-encoded
    (``%E2%82%AC``, ``+`` for a space) or JSON-escaped (``\\u20ac``, ``\\"``)."""
    forms = [re.escape(c), "".join(f"%{b:02x}" for b in c.encode())]
    if c == " ":
        forms.append(r"\+")
    units = c.encode("utf-16-be")
    forms.append(
        re.escape("".join(f"\\u{int.from_bytes(units[i : i + 2], 'big'):04x}" for i in range(0, len(units), 2)))
    )
    if c in '"\\/':
        forms.append(re.escape("\\" + c))
    return "(?:" + "|".join(forms) + ")"


def _base64_forms(secret: str) -> set[str]:
    """The secret in base64, standard and URL-safe, in any letter case of
    the secret, at each of the three alignments it can have inside a longer
    encoded text (as in ``Basic base64(user:password)``): the characters
    that carry only its bits."""
    found: set[str] = set()
    for case in {secret, secret.upper(), secret.lower()}:
        data = case.encode()
        for offset in range(3):
            encoded = base64.b64encode(b"\0" * offset + data + b"\0" * 2).decode()
            first, last = -(-8 * offset // 6), 8 * (offset + len(data)) // 6
            text = encoded[first:last]
            for form in (text, text.replace("+", "-").replace("/", "_")):
                if len(form) >= _MIN_ENCODED_CHARS:
                    found.add(form)
    return found


def _scrubber(secrets: list[str]) -> Optional["re.Pattern[str]"]:
    """One pattern that finds every secret: in any letter case, URL-encoded
    or JSON-escaped in whole or in part, or in base64; one shorter than
    ``_MIN_ENCODED_CHARS`` only as it is."""
    parts: list[str] = []
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        if len(secret) < _MIN_ENCODED_CHARS:
            parts.append(re.escape(secret))
            continue
        parts.append("(?i:" + "".join(_char(c) for c in secret) + ")")
        parts += [re.escape(f) for f in sorted(_base64_forms(secret), key=len, reverse=True)]
    return re.compile("|".join(parts)) if parts else None


def _scrub(value: JSON, secrets: list[str]) -> JSON:
    """Replaces the secret values used anywhere in ``value``, in the forms
    ``_scrubber`` finds."""
    pattern = _scrubber(secrets)
    return value if pattern is None else _scrub_with(value, pattern)


def _scrub_with(value: JSON, pattern: "re.Pattern[str]") -> JSON:
    if isinstance(value, str):
        return pattern.sub("[secret]", value)
    if isinstance(value, list):
        return [_scrub_with(v, pattern) for v in value]
    if isinstance(value, dict):
        return {_scrub_with(k, pattern): _scrub_with(v, pattern) for k, v in value.items()}
    return value


@dataclass
class _Outcome:
    """A handler's result: an output to complete with, or an error to fail with."""

    output: JSON = None
    error: Optional[str] = None
    retryable: bool = True
    code: Optional[str] = None
    status: Optional[int] = None
    retry_after_ms: Optional[int] = None
    kind_of_error: str = "TaskError"
    """What to log instead of ``error``, whose text may hold input."""
    frames: Optional[str] = field(default=None, repr=False)
    """Where a handler's exception was raised: files, lines and code, no values."""

    @property
    def kind(self) -> str:
        return "complete" if self.error is None else "fail"


class Worker:
    """Serves node types on queues of one Composer coordinator (or several
    behind one URL).

    Without ``queues`` (``None`` or empty) it polls, from ``run()``, the
    queue each registered handler's type goes to when its node names no
    ``queue``: the type in lower case, each once. With ``queues``, it polls
    those, and ``run()`` logs a warning for each handler whose type's
    queue is not among them (its nodes' steps would wait unless they name
    a queue it polls).

    With ``namespace``, it works that namespace's tasks only: every call
    of the task API names it in its ``composer-namespace`` header (none,
    or empty: ``default``'s). A name that is not 1 to 63 lowercase
    letters, digits and ``-``, starting with a letter, raises
    ``ValueError`` here."""

    def __init__(
        self,
        url: str,
        token: Optional[str] = None,
        *,
        worker_id: Optional[str] = None,
        queues: Optional[list[str]] = None,
        concurrency: int = 4,
        poll_wait: float = 20.0,
        request_timeout: float = 10.0,
        eager: bool = True,
        urgent_slots: int = 0,
        namespace: Optional[str] = None,
    ) -> None:
        if not 1 <= concurrency <= _MAX_SLOTS:
            raise ValueError(f"concurrency must be from 1 to {_MAX_SLOTS}")
        if not 0 <= urgent_slots <= _MAX_SLOTS:
            raise ValueError(f"urgent_slots must be from 0 to {_MAX_SLOTS}")
        self._http = Transport(
            url, token, request_timeout, f"composer-client-python/{__version__} (worker)", namespace=namespace
        )
        self.url = self._http.url
        self.namespace = self._http.namespace
        """The namespace whose tasks it works, or ``None`` (``default``)."""
        self.worker_id = worker_id or f"py-{socket.gethostname()}-{os.getpid()}"[:128]
        self._queues: Optional[list[str]] = list(queues) if queues else None
        """The queues given, or None: those of the handlers' types."""
        self._polled: list[str] = []
        """The queues polled, fixed when ``run()`` starts."""
        self.concurrency = concurrency
        self.urgent_slots = urgent_slots
        """Slots besides ``concurrency`` that run only steps of priority 1 or 2, polled for on their own."""
        self.poll_wait = max(0.0, min(poll_wait, 60.0))
        self.request_timeout = request_timeout
        self._handlers: dict[str, Handler] = {}
        self._routes: dict[str, str] = {}
        """The queue of each handler's type given to ``handle``."""
        self._stop = threading.Event()
        self._slots = threading.Semaphore(concurrency)
        self._urgent = threading.Semaphore(urgent_slots)
        self._threads: list[threading.Thread] = []
        self._running = 0
        self._lock = threading.Lock()
        self._eager = eager
        """Whether reports ask for the next task: off by option, or for good once the coordinator refused it."""

    def __repr__(self) -> str:
        namespace = "" if self.namespace is None else f", namespace={self.namespace!r}"
        return f"Worker({self.url!r}, worker_id={self.worker_id!r}, queues={self.queues!r}{namespace})"

    @property
    def queues(self) -> list[str]:
        """The queues it polls: those given, else the queue each handler's
        type goes to by default (its name in lower case), each once. Set it
        before ``run()``; ``None`` or empty is the default."""
        if self._queues is not None:
            return list(self._queues)
        return sorted({self._queue_of(t) for t in self._handlers})

    @queues.setter
    def queues(self, queues: Optional[list[str]]) -> None:
        self._queues = list(queues) if queues else None

    def _queue_of(self, node_type: str) -> str:
        """The queue the steps of ``node_type`` go to: the one ``handle``
        was told, else the type's default."""
        return self._routes.get(node_type) or _default_queue(node_type)

    def handle(self, node_type: str, fn: Handler, *, queue: Optional[str] = None) -> "Worker":
        """Runs ``fn(task)`` for tasks of ``node_type``; returns self. A
        worker given no ``queues`` polls the type's queue: ``queue`` (the
        one its nodes name), else the type's name in lower case."""
        self._handlers[node_type] = fn
        if queue is None:
            self._routes.pop(node_type, None)
        else:
            self._routes[node_type] = queue
        return self

    def stop(self) -> None:
        """Stops polling; ``run()`` returns once running tasks reported."""
        self._stop.set()

    # -- HTTP ---------------------------------------------------------------

    def _post(
        self, path: str, body: JSON, timeout: Optional[float] = None, headers: Optional[dict[str, str]] = None
    ) -> JSON:
        return self._http.request("POST", path, body, timeout=timeout, headers=headers)[1]

    def _sending(self, task: Task, kind: str, body: dict[str, JSON], give_up_at: float) -> JSON:
        """POSTs a report as ``_retrying`` does; a 400 to one that asked for
        ``next`` sends it again without the ask, once (a 400 applies nothing)."""
        try:
            return self._retrying(task, kind, body, give_up_at)
        except InvalidRequest as e:
            if e.status != 400 or "next" not in body:
                raise
            self._stop_asking_for_next(e)
            return self._retrying(task, kind, {k: v for k, v in body.items() if k != "next"}, give_up_at)

    def _retrying(self, task: Task, kind: str, body: JSON, give_up_at: float) -> JSON:
        """POSTs a report until it lands: no answer and 5xx are retried with
        backoff until ``give_up_at``; any other refusal is final."""
        delay = 0.1
        tries = 1
        while True:
            try:
                # The run's priority: the coordinator applies urgent runs' results first.
                return self._post(f"/v1/tasks/{task.id}/{kind}", body, headers={_PRIORITY_HEADER: str(task.priority)})
            except Unavailable as e:
                if time.monotonic() >= give_up_at:
                    raise
                pause = delay * (0.5 + random.random())
                log.warning(
                    "task %s: reporting %s failed (try %d: %s); retrying in %.1fs", task.id, kind, tries, e, pause
                )
                time.sleep(pause)
                delay = min(delay * 2, 2.0)
                tries += 1

    # -- the loop -----------------------------------------------------------

    def run(self) -> None:
        """Polls and runs tasks until ``stop()``, SIGINT or SIGTERM."""
        if not self._handlers:
            raise ValueError("no handlers: call handle(node_type, fn) first")
        self._polled = self._queues_to_poll()
        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, self._on_signal)
        log.info(
            "worker %s started: serving %s on queues %s of %s (namespace %s), %d at once (and %d urgent)",
            self.worker_id, ", ".join(sorted(self._handlers)), ", ".join(self._polled), self.url,
            self.namespace or "default", self.concurrency, self.urgent_slots,
        )  # fmt: skip
        capture = _Capture()
        logging.getLogger().addHandler(capture)
        try:
            self._loop()
        finally:
            logging.getLogger().removeHandler(capture)
            for sig, handler in previous.items():
                if handler is not None:  # None: not set from Python, nothing to put back
                    signal.signal(sig, handler)
        log.info("worker %s stopped", self.worker_id)

    def _queues_to_poll(self) -> list[str]:
        """The queues ``run()`` polls, checked as the task API takes them
        (it would refuse every poll otherwise); with queues given, a warning
        for each handler whose type's default queue is not among them."""
        queues = self.queues
        given = self._queues is not None
        if not given:
            for node_type in sorted(self._handlers):
                if not _is_queue_name(self._queue_of(node_type)):
                    raise ValueError(
                        f"handler for type {node_type!r}: not a node type's name (1 to 128 of A-Z a-z 0-9 _ . -, "
                        "not . or ..), so it has no default queue to poll: pass queues"
                    )
        if len(queues) > _MAX_QUEUES:
            raise ValueError(
                f"{len(queues)} queues{'' if given else ' (one per handler type)'}: "
                f"a worker may poll at most {_MAX_QUEUES}"
            )
        for q in queues:
            if not _is_queue_name(q):
                raise ValueError(f"queues: {q!r} is not a queue name (1 to 128 of A-Z a-z 0-9 _ . -, not . or ..)")
        if given:
            for node_type in sorted(self._handlers):
                queue = self._queue_of(node_type)
                if queue not in queues:
                    where = "its nodes' queue" if node_type in self._routes else "a node of this type without a `queue`"
                    message = (
                        f"worker {self.worker_id}: handler for type {node_type!r}: {where} goes to queue {queue!r}, "
                        f"which this worker does not poll "
                        f"(it polls {', '.join(queues)})"
                    )
                    log.warning("%s", message)
                    # Also a Python warning: the package's logger shows
                    # nothing until the application configures logging,
                    # and a step that waits forever should not go unsaid.
                    warnings.warn(message, UserWarning, stacklevel=3)
        return queues

    def _on_signal(self, signum: int, _frame: Optional[FrameType]) -> None:
        log.info(
            "worker %s: %s received; stopping once its %d running tasks reported",
            self.worker_id, signal.Signals(signum).name, self._running,
        )  # fmt: skip
        self.stop()

    def _loop(self) -> None:
        urgent = None
        if self.urgent_slots:
            urgent = threading.Thread(target=self._poll_urgent, name="poll-urgent", daemon=True)
            urgent.start()
        try:
            self._poll(self._slots, self.concurrency, None)
        finally:
            # However the ordinary polls ended, the urgent ones end with them.
            self._stop.set()
            if urgent is not None:
                urgent.join()
        if self._threads:
            log.info("worker %s stopping: waiting for %d running tasks to report", self.worker_id, self._running)
        self._join_tasks()

    def _poll_urgent(self) -> None:
        """The urgent slots' polls; one that fails for good stops the worker
        (it is logged), rather than leave it running without them."""
        try:
            self._poll(self._urgent, self.urgent_slots, _URGENT)
        except BaseException:
            log.exception("worker %s: the urgent slots' polling failed; stopping", self.worker_id)
            self._stop.set()
            raise

    def _poll(self, slots: threading.Semaphore, size: int, priority_at_most: Optional[int]) -> None:
        """Polls for as many tasks as ``slots`` has free, until ``stop()``;
        with ``priority_at_most``, only tasks of runs that urgent."""
        backoff = 0.1
        while not self._stop.is_set():
            slots.acquire()
            free = 1
            while free < min(size, _MAX_POLL) and slots.acquire(blocking=False):
                free += 1
            if self._stop.is_set():
                for _ in range(free):
                    slots.release()
                break
            try:
                # Short waits while stopping is possible, so a stop is seen soon.
                wait = f"{int(min(self.poll_wait, 5.0) * 1000)}ms"
                body: dict[str, JSON] = {"worker_id": self.worker_id, "queues": self._polled, "max": free, "wait": wait}
                if priority_at_most is not None:
                    body["priority_at_most"] = priority_at_most
                batch = self._post("/v1/tasks/poll", body, timeout=self.request_timeout + 5.0)
                backoff = 0.1
            except ComposerError as e:
                log.warning("worker %s: poll failed (%s); retrying", self.worker_id, e)
                for _ in range(free):
                    slots.release()
                self._stop.wait(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, 5.0)
                continue
            tasks = [Task._of(t) for t in (batch or {}).get("tasks", [])]
            for _ in range(free - len(tasks)):
                slots.release()
            for task in tasks:
                self._spawn(task, slots)

    def _spawn(self, task: Task, slot: Optional[threading.Semaphore]) -> None:
        """Runs ``task`` on a thread of its own; with ``slot``, it holds one
        of those slots, given back when the thread ends."""
        t = threading.Thread(target=self._occupy, args=(task, slot), name=f"task-{task.id}", daemon=True)
        # Started under the lock: another thread's pruning must not drop it before it is alive.
        with self._lock:
            self._threads = [alive for alive in self._threads if alive.is_alive()]
            t.start()
            self._threads.append(t)

    def _join_tasks(self) -> None:
        """Waits for every task thread, those that task threads start included."""
        while True:
            with self._lock:
                self._threads = [t for t in self._threads if t.is_alive()]
                alive = list(self._threads)
            if not alive:
                return
            for t in alive:
                t.join()

    def _occupy(self, task: Task, slot: Optional[threading.Semaphore]) -> None:
        """Runs ``task``, then on the same thread (and slot) each task its
        report took with the answer (eager dispatch), until one brings none."""
        try:
            current: Optional[Task] = task
            while current is not None:
                threading.current_thread().name = f"task-{current.id}"
                taken = self._execute(current, urgent=slot is self._urgent)
                current = taken[0] if taken else None
                # More than the one asked for (a coordinator that does not keep
                # to ``max``): leased to this worker all the same, so each runs
                # now on a thread of its own rather than let its lease lapse.
                for extra in taken[1:]:
                    self._spawn(extra, None)
        finally:
            if slot is not None:
                slot.release()

    def _execute(self, task: Task, urgent: bool = False) -> list[Task]:
        """Runs a leased task and reports it; returns the tasks the report took with it."""
        with self._lock:
            self._running += 1
        try:
            log.debug(
                "task %s started: %s (node %s, attempt %d) of run %s",
                task.id, task.node_type, task.node_id, task.attempt, task.run_id,
            )  # fmt: skip
            began = time.monotonic()
            started_us = _now_us()
            done = threading.Event()
            beat = threading.Thread(target=self._heartbeat, args=(task, done), name=f"heartbeat-{task.id}", daemon=True)
            beat.start()
            try:
                outcome = self._call(task)
            finally:
                done.set()
                beat.join()
            took = time.monotonic() - began
            # Echoed when the lease had some (every coordinator that knows stages sends them).
            stages = {**task.stages, "started_at_us": started_us, "finished_at_us": _now_us()} if task.stages else None
            if outcome.error is None:
                log.debug("task %s completed in %.3fs", task.id, took)
            else:
                # The error's text goes to the run (scrubbed), not here: it may quote the input.
                log.debug(
                    "task %s failed in %.3fs (%s, retryable: %s)%s",
                    task.id, took, outcome.kind_of_error, outcome.retryable,
                    "\n" + outcome.frames if outcome.frames else "",
                )  # fmt: skip
            if task.cancelled.is_set():
                log.warning("task %s: the lease was lost while it ran; its result is dropped", task.id)
                return []
            self._send_logs(task)  # the log is whole when the step ends
            return self._report(task, outcome, stages, urgent)
        finally:
            with self._lock:
                self._running -= 1

    def _call(self, task: Task) -> _Outcome:
        handler = self._handlers.get(task.node_type)
        if handler is None:
            return _Outcome(
                error=f"no handler for type {task.node_type} on queue {task.queue} (worker {self.worker_id})",
                retryable=False,
                kind_of_error="no handler",
            )
        used: list[str] = []
        try:
            task.input = _resolve(task.input, used)
            task._secrets = used
            _current.task = task
            try:
                output = handler(task)
            finally:
                _current.task = None
            json.dumps(output, allow_nan=False)  # fails here, not at the report, if not JSON
            return _Outcome(output=_scrub(output, used))
        except TaskError as e:
            return _Outcome(
                error=_scrub(e.message, used),
                retryable=e.retryable,
                code=e.code,
                status=e.status,
                retry_after_ms=e.retry_after_ms,
            )
        except LeaseLost:
            task.cancelled.set()
            return _Outcome(error="lease lost", retryable=True, kind_of_error="LeaseLost")
        except Exception as e:  # noqa: BLE001 - any error of a handler fails its attempt
            frames = "Traceback (most recent call last):\n" + "".join(traceback.format_tb(e.__traceback__))
            return _Outcome(
                error=_scrub(f"{type(e).__name__}: {e}", used),
                retryable=True,
                kind_of_error=type(e).__name__,
                frames=_scrub(frames, used),
            )

    def _lease(self, task: Task) -> dict[str, JSON]:
        return {"worker_id": self.worker_id, "run_id": task.run_id, "attempt": task.attempt}

    def _send_logs(self, task: Task) -> None:
        """Sends the task's pending log lines; logs are worth a try, not a wait."""
        lines = task._take_logs()
        for i in range(0, len(lines), _LOG_LINES_PER_CALL):
            body = dict(self._lease(task), lines=lines[i : i + _LOG_LINES_PER_CALL])
            try:
                self._post(f"/v1/tasks/{task.id}/logs", body, timeout=_LOG_TIMEOUT)
            except Conflict:
                return  # the lease is lost: the heartbeat says so
            except ComposerError as e:
                log.warning("task %s: %d log lines not sent (%s); dropped", task.id, len(lines) - i, e)
                return

    def _heartbeat(self, task: Task, done: threading.Event) -> None:
        """Renews the lease every third of its length, sending the task's log
        lines in between; a 409 (or no renewal for a whole lease) means it is
        lost."""
        ttl = task.lease_ttl_ms / 1000.0
        last_ok = last_beat = time.monotonic()
        while not done.wait(min(_LOG_EVERY, ttl / 3)):
            # Lines go out about once a second, after the heartbeat when one
            # is due: a slow coordinator must not cost the lease.
            if time.monotonic() - last_beat < ttl / 3:
                self._send_logs(task)
                continue
            last_beat = time.monotonic()
            try:
                self._post(f"/v1/tasks/{task.id}/heartbeat", self._lease(task))
                last_ok = time.monotonic()
            except Conflict as e:
                log.warning("task %s: lease lost (%s); its result will be dropped", task.id, e.message)
                task.cancelled.set()
                return
            except ComposerError as e:
                log.warning("task %s: heartbeat failed (%s)", task.id, e)
            if time.monotonic() - last_ok >= ttl:
                log.warning("task %s: lease lost (no renewal for %.1fs); its result will be dropped", task.id, ttl)
                task.cancelled.set()
                return

    def _take_next(self, task: Optional[Task] = None, urgent: bool = False) -> Optional[dict[str, JSON]]:
        """What a report asks to take with its answer: one task, for the slot
        the reported task frees (the poll in flight did not count that slot,
        so no more than ``concurrency`` run). None while stopping: a stopping
        worker takes no new work; and none on an urgent slot for a task that
        is not urgent (its run was lowered after its step was sent)."""
        if not self._eager or self._stop.is_set():
            return None
        if urgent and task is not None and task.priority > _URGENT:
            return None
        return {"queues": list(self._polled), "max": 1}

    def _stop_asking_for_next(self, refusal: ComposerError) -> None:
        """A coordinator older than eager dispatch refuses ``next`` as an
        unknown field: no report asks it again."""
        with self._lock:
            was, self._eager = self._eager, False
        if was:
            log.warning(
                "worker %s: the coordinator refused next (%s); reporting without it from now on, "
                "every task comes by a poll",
                self.worker_id, refusal,
            )  # fmt: skip

    def _report(
        self, task: Task, outcome: _Outcome, stages: Optional[dict[str, int]] = None, urgent: bool = False
    ) -> list[Task]:
        """Completes or fails the task (with its ``stages``); returns the
        tasks leased to this worker with the answer."""
        body = self._lease(task)
        if stages:
            body["stages"] = stages
        if outcome.error is None:
            body["output"] = outcome.output
        else:
            body["error"], body["retryable"] = outcome.error, outcome.retryable
            if outcome.code is not None:
                body["code"] = outcome.code
            if outcome.status is not None:
                body["status"] = outcome.status
                if outcome.status == 429 and outcome.retry_after_ms is not None:
                    body["retry_after_ms"] = outcome.retry_after_ms
        take = self._take_next(task, urgent)
        if take is not None:
            body["next"] = take
        # Retried for a lease's length: past it the task belongs to another worker.
        give_up_at = time.monotonic() + task.lease_ttl_ms / 1000.0
        try:
            ack = self._sending(task, outcome.kind, body, give_up_at)
        except Conflict as e:
            log.warning("task %s: lease lost before the result landed (%s); dropped", task.id, e.message)
        except NotFound as e:
            if e.code == _RUN_NOT_FOUND:
                log.warning("task %s: its run is gone; result dropped", task.id)
            else:
                log.error("task %s: the coordinator refused the result: %s", task.id, e)
        except Unavailable as e:
            # The lease expires and the task goes to another worker.
            log.error("task %s: no coordinator took the result: %s", task.id, e)
        except ComposerError as e:
            log.error("task %s: the coordinator refused the result: %s", task.id, e)
        else:
            if isinstance(ack, dict):
                if ack.get("applied") is False:
                    log.debug("task %s: the result was ignored: %s", task.id, ack.get("ignored"))
                return [Task._of(t) for t in ack.get("next") or []]
        return []
