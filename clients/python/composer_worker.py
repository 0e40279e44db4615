"""A Composer worker in Python: runs steps of custom node types with only the
coordinator's URL and the worker token (no database, no Redis).

    from composer_worker import Worker, TaskError

    def resize(task):
        if task.input["size"] > 4096:
            raise TaskError("too large", retryable=False)
        return {"resized": task.input["size"]}

    Worker("http://127.0.0.1:8080", token).handle("resize-image", resize).run()

The worker long-polls ``POST /v1/tasks/poll`` for the queues it serves,
runs each task on a thread of its own while a heartbeat keeps the lease,
and completes or fails it. A handler's return value is the step's output
(any JSON value); an exception fails the attempt (retried under the node's
retry policy unless it is a ``TaskError`` with ``retryable=False``). When
the lease is lost (the worker stalled past the lease and another worker took
the task), ``task.cancelled`` is set and the result is dropped.

``run()`` stops on SIGINT/SIGTERM (or ``stop()``): no new polls, running
tasks finish and report, then it returns. Secret references in an input
(``${ .secrets.NAME }``) are resolved from ``COMPOSER_SECRET_NAME`` in the
worker's environment, as the Rust worker does, and scrubbed from outputs.

Standard library only; Python 3.9 or later.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

__all__ = ["Worker", "Task", "TaskError", "LeaseLost"]

JSON = Any
Handler = Callable[["Task"], JSON]

log = logging.getLogger("composer_worker")


class TaskError(Exception):
    """Fails the attempt; ``retryable=False`` fails the step for good."""

    def __init__(self, message: str, retryable: bool = True) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable


class LeaseLost(Exception):
    """The worker no longer holds the task's lease: drop the result."""


@dataclass
class Task:
    """A leased task. ``cancelled`` is set when the lease is lost."""

    id: str
    run_id: str
    attempt: int
    node_id: str
    node_type: str
    queue: str
    input: JSON
    lease_ttl_ms: int
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False)


class _HttpError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code


_SECRET = re.compile(r"\$\$\{|\$\{\s*\.secrets\.([A-Za-z_][A-Za-z0-9_]*)\s*\}")


def _resolve(value: JSON, used: List[str]) -> JSON:
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
                raise TaskError(f"unknown secret {name}: set COMPOSER_SECRET_{name} in the worker's environment",
                                retryable=False)
            if secret not in used:
                used.append(secret)
            return secret

        return _SECRET.sub(sub, value)
    if isinstance(value, list):
        return [_resolve(v, used) for v in value]
    if isinstance(value, dict):
        return {k.replace("$${", "${"): _resolve(v, used) for k, v in value.items()}
    return value


def _scrub(value: JSON, secrets: List[str]) -> JSON:
    """Replaces the secret values used anywhere in ``value``."""
    secrets = [s for s in secrets if len(s) >= 3]
    if not secrets:
        return value
    if isinstance(value, str):
        for s in secrets:
            value = value.replace(s, "[secret]")
        return value
    if isinstance(value, list):
        return [_scrub(v, secrets) for v in value]
    if isinstance(value, dict):
        return {_scrub(k, secrets): _scrub(v, secrets) for k, v in value.items()}
    return value


class Worker:
    """Serves node types on queues of one Composer coordinator (or several
    behind one URL)."""

    def __init__(
        self,
        url: str,
        token: Optional[str] = None,
        *,
        worker_id: Optional[str] = None,
        queues: Optional[List[str]] = None,
        concurrency: int = 4,
        poll_wait: float = 20.0,
        request_timeout: float = 10.0,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.url = url.rstrip("/")
        self.token = token
        self.worker_id = worker_id or f"py-{socket.gethostname()}-{os.getpid()}"[:128]
        self.queues = list(queues or ["default"])
        self.concurrency = concurrency
        self.poll_wait = min(poll_wait, 60.0)
        self.request_timeout = request_timeout
        self._handlers: Dict[str, Handler] = {}
        self._stop = threading.Event()
        self._slots = threading.Semaphore(concurrency)
        self._threads: List[threading.Thread] = []

    def handle(self, node_type: str, fn: Handler) -> "Worker":
        """Runs ``fn(task)`` for tasks of ``node_type``; returns self."""
        self._handlers[node_type] = fn
        return self

    def stop(self) -> None:
        """Stops polling; ``run()`` returns once running tasks reported."""
        self._stop.set()

    # -- HTTP ---------------------------------------------------------------

    def _post(self, path: str, body: JSON, timeout: Optional[float] = None) -> JSON:
        data = json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="POST")
        req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", "Bearer " + self.token)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.request_timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            try:
                err = json.loads(e.read())["error"]
                code, message = err.get("code", ""), err.get("message", "")
            except Exception:
                code, message = "", e.reason
            raise _HttpError(e.code, code, message) from None

    def _retrying(self, path: str, body: JSON, give_up_at: float) -> JSON:
        """POSTs until it lands: connection errors and 5xx are retried with
        backoff until ``give_up_at``; a 4xx is final."""
        delay = 0.1
        while True:
            try:
                return self._post(path, body)
            except _HttpError as e:
                if e.status < 500 or time.monotonic() >= give_up_at:
                    raise
            except (urllib.error.URLError, OSError):
                if time.monotonic() >= give_up_at:
                    raise
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 2.0)

    # -- the loop -----------------------------------------------------------

    def run(self) -> None:
        """Polls and runs tasks until ``stop()``, SIGINT or SIGTERM."""
        if not self._handlers:
            raise ValueError("no handlers: call handle(node_type, fn) first")
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: self.stop())
        backoff = 0.1
        while not self._stop.is_set():
            self._slots.acquire()
            free = 1
            while free < self.concurrency and self._slots.acquire(blocking=False):
                free += 1
            try:
                # Short waits while stopping is possible, so a stop is seen soon.
                wait = f"{int(min(self.poll_wait, 5.0) * 1000)}ms"
                batch = self._post(
                    "/v1/tasks/poll",
                    {"worker_id": self.worker_id, "queues": self.queues, "max": free, "wait": wait},
                    timeout=self.request_timeout + 5.0,
                )
                backoff = 0.1
            except (_HttpError, urllib.error.URLError, OSError) as e:
                log.warning("poll failed (%s); retrying", e)
                for _ in range(free):
                    self._slots.release()
                self._stop.wait(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, 5.0)
                continue
            tasks = [Task(**t) for t in batch.get("tasks", [])]
            for _ in range(free - len(tasks)):
                self._slots.release()
            for task in tasks:
                t = threading.Thread(target=self._execute, args=(task,), name=f"task-{task.id}", daemon=True)
                self._threads.append(t)
                t.start()
            self._threads = [t for t in self._threads if t.is_alive()]
        for t in self._threads:
            t.join()

    def _execute(self, task: Task) -> None:
        try:
            done = threading.Event()
            beat = threading.Thread(target=self._heartbeat, args=(task, done), daemon=True)
            beat.start()
            try:
                outcome = self._call(task)
            finally:
                done.set()
                beat.join()
            if task.cancelled.is_set():
                return  # the lease is lost: the result is dropped
            self._report(task, outcome)
        finally:
            self._slots.release()

    def _call(self, task: Task) -> Tuple[str, JSON]:
        handler = self._handlers.get(task.node_type)
        if handler is None:
            return "fail", (f"no handler for type {task.node_type} on queue {task.queue} "
                            f"(worker {self.worker_id})", False)
        used: List[str] = []
        try:
            task.input = _resolve(task.input, used)
            output = handler(task)
            json.dumps(output)  # fails here, not at the report, if not JSON
            return "complete", _scrub(output, used)
        except TaskError as e:
            return "fail", (_scrub(e.message, used), e.retryable)
        except Exception as e:  # noqa: BLE001 - any error of a handler fails its attempt
            return "fail", (_scrub(f"{type(e).__name__}: {e}", used), True)

    def _lease(self, task: Task) -> Dict[str, JSON]:
        return {"worker_id": self.worker_id, "run_id": task.run_id, "attempt": task.attempt}

    def _heartbeat(self, task: Task, done: threading.Event) -> None:
        """Renews the lease every third of its length; a 409 (or no renewal
        for a whole lease) means it is lost."""
        ttl = task.lease_ttl_ms / 1000.0
        last_ok = time.monotonic()
        while not done.wait(ttl / 3):
            try:
                self._post(f"/v1/tasks/{task.id}/heartbeat", self._lease(task))
                last_ok = time.monotonic()
            except _HttpError as e:
                if e.status == 409:
                    task.cancelled.set()
                    return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() - last_ok >= ttl:
                task.cancelled.set()
                return

    def _report(self, task: Task, outcome: Tuple[str, JSON]) -> None:
        kind, value = outcome
        body = self._lease(task)
        if kind == "complete":
            body["output"] = value
        else:
            body["error"], body["retryable"] = value
        # Retried for a lease's length: past it the task belongs to another worker.
        give_up_at = time.monotonic() + task.lease_ttl_ms / 1000.0
        try:
            self._retrying(f"/v1/tasks/{task.id}/{kind}", body, give_up_at)
        except _HttpError as e:
            if e.status == 409:
                log.warning("task %s: lease lost before the result landed; dropped", task.id)
            else:
                log.error("task %s: the coordinator refused the result: %s", task.id, e)
        except (urllib.error.URLError, OSError) as e:
            # The lease expires and the task goes to another worker.
            log.error("task %s: no coordinator took the result: %s", task.id, e)
