"""Running workflows built in code: registering them, serving their typed
steps from this process, and simulating them offline with their own
functions answering each step (``composer workflow simulate --ask``)."""

import json
import os
import shutil
import subprocess
import tempfile
import traceback
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Optional, TypedDict, Union

from ..client import Client
from ..types import Registered
from ..worker import Handler, Task, TaskError, Worker, _default_queue
from ._builder import Workflow

__all__ = [
    "Ask",
    "AttemptTimeout",
    "SimulatedNode",
    "Simulation",
    "SimulationError",
    "composer_bin",
    "handlers_of",
    "queues_of",
    "register",
    "run_worker",
    "simulate",
    "worker_for",
]

JSON = Any
_DEFAULT_URL = "http://127.0.0.1:8080"


def register(client: Client, *workflows: Workflow[Any], version: Optional[int] = None) -> list[Registered]:
    """Registers each workflow (idempotent by content: one already
    registered answers its version, ``created`` false)."""
    return [wf.register(client, version=version) for wf in workflows]


def handlers_of(*workflows: Workflow[Any]) -> dict[str, Handler]:
    """The handlers of every typed step of ``workflows``, by node type."""
    out: dict[str, Handler] = {}
    for wf in workflows:
        out.update(wf.handlers())
    return out


def queues_of(*workflows: Workflow[Any]) -> list[str]:
    """The queues the typed steps of ``workflows`` go to (their ``queue``,
    else their type in lower case), each once, sorted."""
    return sorted({s.queue or _default_queue(s.type) for wf in workflows for s in wf.steps()})


def worker_for(
    *workflows: Workflow[Any],
    url: Optional[str] = None,
    worker_token: Optional[str] = None,
    handlers: Optional[Mapping[str, Handler]] = None,
    namespace: Optional[str] = None,
    **worker_options: Any,
) -> Worker:
    """A worker serving the typed steps of ``workflows`` (and ``handlers``,
    by type), on their queues unless ``queues`` is given; not yet running.
    ``url`` defaults to ``COMPOSER_URL`` (else ``http://127.0.0.1:8080``),
    ``worker_token`` to ``COMPOSER_WORKER_TOKEN``, ``namespace`` to
    ``COMPOSER_NAMESPACE`` (else ``default``); ``worker_options`` go to
    ``Worker`` (``concurrency``, ``queues`` …)."""
    url = url or os.environ.get("COMPOSER_URL") or _DEFAULT_URL
    worker_token = worker_token if worker_token is not None else os.environ.get("COMPOSER_WORKER_TOKEN")
    namespace = namespace if namespace is not None else os.environ.get("COMPOSER_NAMESPACE")
    worker = Worker(url, worker_token, namespace=namespace, **worker_options)
    routes = {s.type: s.queue for wf in workflows for s in wf.steps()}
    for node_type, handler in handlers_of(*workflows).items():
        worker.handle(node_type, handler, queue=routes.get(node_type))
    for node_type, handler in (handlers or {}).items():
        worker.handle(node_type, handler)
    return worker


def run_worker(
    *workflows: Workflow[Any],
    url: Optional[str] = None,
    api_token: Optional[str] = None,
    worker_token: Optional[str] = None,
    handlers: Optional[Mapping[str, Handler]] = None,
    register_first: bool = True,
    namespace: Optional[str] = None,
    **worker_options: Any,
) -> None:
    """Registers ``workflows`` (unless ``register_first`` is false: they are
    registered once, by content) and runs ``worker_for(...)`` until SIGINT or
    SIGTERM, both in ``namespace``. ``url`` defaults to ``COMPOSER_URL``
    (else ``http://127.0.0.1:8080``), ``api_token`` to
    ``COMPOSER_API_TOKEN``, ``worker_token`` to ``COMPOSER_WORKER_TOKEN``,
    ``namespace`` to ``COMPOSER_NAMESPACE`` (else ``default``)."""
    url = url or os.environ.get("COMPOSER_URL") or _DEFAULT_URL
    api_token = api_token if api_token is not None else os.environ.get("COMPOSER_API_TOKEN")
    namespace = namespace if namespace is not None else os.environ.get("COMPOSER_NAMESPACE")
    if register_first:
        register(Client(url, api_token, namespace=namespace), *workflows)
    worker_for(
        *workflows, url=url, worker_token=worker_token, handlers=handlers, namespace=namespace, **worker_options
    ).run()


# -- simulate ------------------------------------------------------------------


class AttemptTimeout(Exception):
    """Raised by a handler or a mock in ``simulate``: the attempt timed out
    (answered ``{"timeout": true}``), as the node's ``timeout`` would."""


class SimulationError(Exception):
    """``composer workflow simulate`` refused the definition or an argument
    (its exit status 2), started no run because the input does not match
    the definition's ``input_schema`` (exit status 1, no report; the
    message carries the simulator's ``no run: workflow "x": the input does
    not match input_schema at /path: ...``, naming the JSON Pointer), or
    could not be run. The message ends with the simulator's stderr, which
    ``stderr`` holds whole."""

    def __init__(self, message: str, stderr: str = "") -> None:
        super().__init__(message)
        self.stderr = stderr


class SimulatedNode(TypedDict, total=False):
    """A node of a simulation's report."""

    id: str
    type: str
    state: str
    attempts: int
    input: JSON
    output: JSON
    error: JSON


@dataclass
class Ask:
    """One attempt the simulation asked for, and what it was answered."""

    node: str
    key: str
    type: str
    input: JSON
    attempt: int
    answer: dict[str, JSON]


@dataclass
class Simulation:
    """What ``simulate`` reports: the run's ``status`` (``SUCCEEDED``,
    ``FAILED`` …), ``output``, ``error``, its ``nodes`` by id, the
    ``edges`` taken, each ``asks`` answered, and the ``report`` as printed."""

    status: str
    output: JSON
    error: JSON
    nodes: dict[str, SimulatedNode]
    edges: JSON
    asks: list[Ask] = field(default_factory=list)
    report: dict[str, JSON] = field(default_factory=dict, repr=False)

    @property
    def succeeded(self) -> bool:
        return self.status == "SUCCEEDED"


Mock = Union[Callable[[JSON], JSON], JSON]
"""A node's mock: a function of the attempt's input returning its output
(or raising, like a handler), or the output itself (JSON)."""


def composer_bin() -> str:
    """The ``composer`` executable: ``$COMPOSER_BIN``, else ``composer`` on PATH."""
    found = os.environ.get("COMPOSER_BIN") or shutil.which("composer")
    if not found:
        raise SimulationError("no composer executable: set COMPOSER_BIN or put composer on PATH")
    return found


def _answer_of(call: Callable[[], JSON]) -> dict[str, JSON]:
    try:
        output = call()
        json.dumps(output, allow_nan=False)
        return {"output": output}
    except AttemptTimeout:
        return {"timeout": True}
    except TaskError as e:
        return {"error": e.message, "retryable": e.retryable}
    except Exception as e:  # noqa: BLE001 - a step's failure is the attempt's, as on a worker
        return {"error": f"{type(e).__name__}: {e}", "retryable": True, "_trace": traceback.format_exc()}


def simulate(
    workflow: Union[Workflow[Any], Mapping[str, JSON]],
    input: JSON = None,
    *,
    handlers: Optional[Mapping[str, Handler]] = None,
    mocks: Optional[Mapping[str, Mock]] = None,
    failures: Union[Iterable[str], Mapping[str, str], None] = None,
    event: Optional[Mapping[str, JSON]] = None,
    composer: Optional[str] = None,
    timeout: float = 120.0,
) -> Simulation:
    """Runs ``workflow`` offline through ``composer workflow simulate --ask``:
    every attempt a worker would run (custom steps, HTTP nodes, MAP items,
    LOOP iterations' steps) is answered here, by

    1. ``mocks[node]``: a function of the attempt's input, or the output
       itself (a JSON value, passed as ``--mock``),
    2. else ``handlers[type]`` (worker handlers, given a ``Task``), by
       default the workflow's own typed steps (``wf.handlers()``): the
       step's function itself runs,
    3. else the simulator's default mock, ``{}``.

    A handler's exception fails the attempt as on a worker (retried under
    the node's policy unless a ``TaskError(retryable=False)``;
    ``AttemptTimeout`` times it out). ``failures`` are nodes whose every
    attempt fails (``--fail``; a mapping gives each a message). Events of
    WAIT_FOR_EVENT nodes are ``mocks`` values too. ``event`` starts the run
    from a trigger instead of ``input``.

    An attempt of a node named in ``failures``, or whose mock is a value
    (not a function), is answered ``{"mock": true}`` on purpose: the
    simulator then applies its own ``--fail`` or ``--mock`` for that node,
    exactly as ``composer workflow simulate`` without ``--ask`` would, and
    neither the node's handler nor its step function runs.

    Raises ``SimulationError`` when the definition or an argument is
    refused, or when ``input`` does not match the definition's
    ``input_schema`` (no run starts; the message names the JSON Pointer at
    fault, e.g. ``the input does not match input_schema at /amount: ...``)."""
    definition = dict(workflow.definition() if isinstance(workflow, Workflow) else workflow)
    answering: dict[str, Handler] = {}
    if isinstance(workflow, Workflow):
        answering.update(workflow.handlers())
    answering.update(handlers or {})
    mocks = dict(mocks or {})
    binary = composer or composer_bin()
    with tempfile.TemporaryDirectory(prefix="composer-simulate-") as tmp:
        path = os.path.join(tmp, "workflow.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(definition, f)
        args = [binary, "workflow", "simulate", "--file", path, "--ask", "--output", "json"]
        if event is not None:
            args += ["--event", json.dumps(event)]
        else:
            args += ["--input", json.dumps({} if input is None else input)]
        for node, mock in mocks.items():
            if not callable(mock):
                args += ["--mock", f"{node}={json.dumps(mock)}"]
        failing: list[str] = []
        if isinstance(failures, Mapping):
            failing = list(failures)
            args += [a for node, why in failures.items() for a in ("--fail", f"{node}={why}")]
        elif failures is not None:
            failing = list(failures)
            args += [a for node in failing for a in ("--fail", node)]
        with (
            tempfile.TemporaryFile(mode="w+", encoding="utf-8") as err,
            subprocess.Popen(
                args,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                encoding="utf-8",
                env={**os.environ, "COMPOSER_LOG": os.environ.get("COMPOSER_LOG", "error")},
            ) as proc,
        ):
            assert proc.stdin is not None and proc.stdout is not None
            asks: list[Ask] = []
            report: Optional[dict[str, JSON]] = None
            rest: list[str] = []
            for line in proc.stdout:
                message = _parse(line)
                if message is None:
                    rest.append(line)
                elif "ask" in message:
                    asks.append(_ask(message["ask"], answering, mocks, failing, proc.stdin))
                elif "report" in message:
                    report = message["report"]
                else:
                    rest.append(line)
            proc.stdin.close()
            code = proc.wait(timeout=timeout)
            err.seek(0)
            stderr = err.read()
        if report is None and rest:
            # A simulator that prints the report whole (`--output json`), not as {"report": …}.
            whole = _parse("".join(rest))
            if isinstance(whole, dict) and "status" in whole:
                report = whole
        if code == 2 or report is None:
            raise SimulationError(f"composer workflow simulate exited {code}: {stderr.strip()}", stderr)
    nodes = {n["id"]: n for n in report.get("nodes", [])}
    return Simulation(
        status=report.get("status", ""),
        output=report.get("output"),
        error=report.get("error"),
        nodes=nodes,
        edges=report.get("edges"),
        asks=asks,
        report=report,
    )


def _parse(line: str) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None


def _ask(
    ask: Mapping[str, JSON],
    handlers: Mapping[str, Handler],
    mocks: Mapping[str, Mock],
    failing: Collection[str],
    out: IO[str],
) -> Ask:
    node = str(ask.get("node", ""))
    node_type = str(ask.get("type", ""))
    given = ask.get("input")
    attempt = int(ask.get("attempt", 1))
    mock = mocks.get(node)
    answer: dict[str, JSON]
    if callable(mock):
        answer = _answer_of(lambda: mock(given))
    elif node in mocks or node in failing:
        answer = {"mock": True}  # the simulator's: its --mock value, or its --fail
    elif node_type in handlers:
        task = Task(
            id=f"simulated-{ask.get('key', node)}-{attempt}",
            run_id="simulated",
            attempt=attempt,
            node_id=node,
            node_type=node_type,
            queue=_default_queue(node_type),
            input=given,
            lease_ttl_ms=60_000,
        )
        handler = handlers[node_type]
        answer = _answer_of(lambda: handler(task))
    else:
        answer = {"mock": True}
    sent = {k: v for k, v in answer.items() if not k.startswith("_")}
    out.write(json.dumps(sent) + "\n")
    out.flush()
    return Ask(node, str(ask.get("key", node)), node_type, given, attempt, answer)
