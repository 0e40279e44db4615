"""What the live tests share: a `composer dev` of their own (its embedded
PostgreSQL and Redis) in a temporary directory that is removed afterwards,
and small helpers. The binary is `COMPOSER_BIN` (default
`target/debug/composer`, from the repository's root)."""

import http.server
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Callable, Optional

from composer_client._http import Transport
from composer_client.worker import Worker

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(HERE)
"""clients/python: on `PYTHONPATH`, `composer_client` imports from the checkout."""
REPO_ROOT = os.path.dirname(os.path.dirname(PACKAGE_ROOT))


class DevServer:
    """A `composer dev` on a free port, in a fresh directory made mode 0755
    (run as root, the embedded PostgreSQL runs as the postgres user, which
    must reach it). `stop()` ends it and removes the directory."""

    def __init__(self, **env: str) -> None:
        self.binary = os.path.abspath(
            os.environ.get("COMPOSER_BIN", os.path.join(REPO_ROOT, "target", "debug", "composer"))
        )
        if not os.access(self.binary, os.X_OK):
            raise RuntimeError(f"no composer binary at {self.binary}: set COMPOSER_BIN")
        self.extra_env = env
        self.work = ""
        self.url = ""
        self.process: Optional[subprocess.Popen[bytes]] = None

    def start(self) -> "DevServer":
        self.work = tempfile.mkdtemp(prefix="composer-client-test-")
        os.chmod(self.work, 0o755)
        addr = os.path.join(self.work, "addr")
        env = dict(os.environ, COMPOSER_LISTEN="127.0.0.1:0", COMPOSER_ADDR_FILE=addr, COMPOSER_LOG="error")
        for name in ("COMPOSER_API_TOKEN", "COMPOSER_WORKER_TOKEN", "COMPOSER_DATABASE_URL", "COMPOSER_REDIS_URL"):
            env.pop(name, None)
        env.update(self.extra_env)
        try:
            with open(os.path.join(self.work, "dev.log"), "wb") as log:
                self.process = subprocess.Popen(
                    [self.binary, "dev"], cwd=self.work, env=env, stdout=subprocess.DEVNULL, stderr=log
                )
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if os.path.exists(addr) and os.path.getsize(addr) > 0:
                    with open(addr) as f:
                        self.url = f.read().strip()
                    return self
                if self.process.poll() is not None:
                    break
                time.sleep(0.1)
            with open(os.path.join(self.work, "dev.log")) as f:
                raise RuntimeError("composer dev did not start: " + f.read())
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(30)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
            self.process = None
        if self.work:
            shutil.rmtree(self.work, ignore_errors=True)
            self.work = ""


def unique(prefix: str) -> str:
    """A workflow name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def node(id: str, type: str, queue: Optional[str] = None, **config: Any) -> dict[str, Any]:
    """A node with a quick retry policy."""
    spec: dict[str, Any] = {"id": id, "type": type, "config": config}
    if queue is not None:
        spec["queue"] = queue
        spec["retry"] = {"max_attempts": 3, "initial_backoff": "50ms"}
    return spec


def definition(
    name: str, nodes: list[dict[str, Any]], edges: Optional[list[Mapping[str, str]]] = None
) -> dict[str, Any]:
    """A workflow definition."""
    return {"name": name, "nodes": nodes, "edges": list(edges or [])}


def api(url: str, method: str, path: str, body: Any = None) -> Any:
    """A request the client has no method for (a schedule's), its answer
    decoded; an error answer raises as the client's do."""
    transport = Transport(url, None, 30.0, "composer-client-tests")
    if body is None:
        return transport.request(method, path)[1]
    return transport.request(method, path, body)[1]


class InBackground:
    """A worker running on a thread for the length of a `with`."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.thread = threading.Thread(target=worker.run, daemon=True)

    def __enter__(self) -> Worker:
        self.thread.start()
        return self.worker

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.worker.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the worker did not stop"


class Request:
    """A request the stub server got."""

    def __init__(self, method: str, path: str, headers: dict[str, str], body: Any) -> None:
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body

    @property
    def route(self) -> str:
        return self.path.split("?", 1)[0]

    def __repr__(self) -> str:
        return f"Request({self.method} {self.path})"


Answer = tuple[int, dict[str, str], bytes]
"""Status, headers and body of a stub's answer."""


def answer(status: int, body: Any = None, headers: Optional[dict[str, str]] = None) -> Answer:
    """A JSON answer."""
    return (
        status,
        {"Content-Type": "application/json", "composer-version": "0.0.0-stub", **(headers or {})},
        json.dumps(body).encode(),
    )


class StubServer:
    """An HTTP server on a free port answering what `respond(request)`
    says, recording every request: a coordinator that does what a test needs
    (errors, slowness, Retry-After) without one. Use it in a `with`."""

    def __init__(self, respond: Callable[[Request], Answer]) -> None:
        self.respond = respond
        self.requests: list[Request] = []
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                request = Request(self.command, self.path, dict(self.headers.items()), json.loads(raw) if raw else None)
                stub.requests.append(request)
                status, headers, body = stub.respond(request)
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (a timeout test)

            do_GET = _serve
            do_POST = _serve
            do_PUT = _serve
            do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> "StubServer":
        self.thread.start()
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@dataclass
class Order:
    """A run's input in the workflows-in-code tests."""

    id: str
    amount: int


@dataclass
class Charge:
    """What their charging step gives."""

    id: str
    amount: int
