"""The API client: workflows, runs, events, schedules' backfills, webhooks,
limits, run control (priorities included) and namespaces.

Usage::

    from composer_client import Client

    client = Client("http://127.0.0.1:8080", token)
    client.register_workflow({"name": "hello", "nodes": [...]})
    run = client.start_run("hello", input={"name": "Ada"})
    done = client.wait(run["id"], timeout=60)
    print(done["status"], done.get("output"))
"""

import time
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from typing import Any, Optional, Union, cast

from ._http import Transport
from ._version import __version__
from .errors import Unavailable, WaitTimeout
from .types import (
    TERMINAL,
    ArchivedRun,
    BackfillOverlap,
    BackfillQueued,
    Deleted,
    EventPage,
    EventSent,
    ExportPage,
    HistoryEntry,
    HistoryPage,
    ItemPage,
    Limit,
    LimitPage,
    LogLine,
    Namespace,
    NamespaceCreated,
    NamespaceQuotas,
    RecordedEvent,
    Registered,
    Run,
    RunPage,
    RunSummary,
    RunTask,
    StepLogs,
    UpdateAnswer,
    Webhook,
    WebhookCreated,
    Workflow,
    WorkflowVersion,
)

__all__ = ["Client", "RunId"]

RunId = Union[str, uuid.UUID]
"""A run's id: its UUID, as a string or a ``uuid.UUID``."""

_LONG_POLL = 30.0
"""How long each ``GET /v1/runs/{id}?wait=`` of ``wait`` asks for (the
server answers at most 60 s later)."""


def _seg(value: Union[str, int, uuid.UUID]) -> str:
    """One path segment, quoted: a name or id can never reach another route.
    A URL resolves ``.`` and ``..`` away, so such a name is refused here (the
    server refuses to register one)."""
    text = str(value)
    if text in (".", ".."):
        raise ValueError(f"the name {text!r} cannot be used: a URL cannot carry . or .. as a path segment")
    return urllib.parse.quote(text, safe="")


def _time(value: Union[str, datetime], name: str) -> str:
    """A time the API takes: an RFC 3339 string as it is, or an aware
    ``datetime`` in UTC (a naive one says no time zone: refused)."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"{name}: a datetime with a time zone is needed (datetime.now(timezone.utc))")
        return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    return value


def _trace(traceparent: Optional[str]) -> Optional[dict[str, str]]:
    """The ``traceparent`` header of a start or an event, when there is one."""
    return None if traceparent is None else {"traceparent": traceparent}


def _wait_param(seconds: float) -> str:
    """A ``?wait=`` the server takes: ``1s`` to ``60s``, or ``1ms`` to ``999ms``."""
    if seconds >= 1:
        return f"{min(int(seconds), 60)}s"
    return f"{max(1, int(seconds * 1000))}ms"


class Client:
    """A client of one Composer API (a coordinator, or several behind one URL).

    ``token`` is the API token (``COMPOSER_API_TOKEN``), sent as a bearer
    token; ``timeout`` bounds each request in seconds (a long-poll gets its
    wait on top). ``namespace`` is the namespace every call is in, named in
    its ``composer-namespace`` header (``default`` when ``None`` or empty):
    its workflows, runs, events, schedules, webhooks and limits, and
    nothing of another; a name that is not 1 to 63 lowercase letters,
    digits and ``-``, starting with a letter, raises ``ValueError`` here.
    Every method raises a ``ComposerError`` subclass when the server
    refuses or does not answer: ``NotFound``, ``Conflict``,
    ``InvalidRequest``, ``Unauthorized``, ``Unavailable``.

    A client holds no connection and no state but its settings: one may be
    shared by threads.
    """

    def __init__(
        self, url: str, token: Optional[str] = None, *, timeout: float = 30.0, namespace: Optional[str] = None
    ) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self._http = Transport(url, token, timeout, f"composer-client-python/{__version__}", namespace=namespace)

    @property
    def url(self) -> str:
        """The server's base URL."""
        return self._http.url

    @property
    def namespace(self) -> Optional[str]:
        """The namespace every call names, or ``None`` (``default``)."""
        return self._http.namespace

    def __repr__(self) -> str:
        if self.namespace is None:
            return f"Client({self.url!r})"
        return f"Client({self.url!r}, namespace={self.namespace!r})"

    # -- workflows ---------------------------------------------------------

    def register_workflow(self, definition: Mapping[str, Any], version: Optional[int] = None) -> Registered:
        """Registers a definition (``{"name", "nodes", "edges"?, "output"?, …}``):
        the version registered with the same content when there is one
        (``created`` false), a new version otherwise (``created`` true). An
        invalid definition raises ``InvalidRequest`` (code
        ``invalid_definition``) naming the node and field.

        ``version`` (sent as ``?version=N``) is the version the caller means:
        N with the same content answers it; N registered with another
        definition, or a number other than the latest plus one, raises
        ``Conflict``."""
        query = None if version is None else {"version": str(version)}
        status, body = self._http.request("POST", "/v1/workflows", dict(definition), query=query)
        registered = cast(Registered, body)
        registered["created"] = status == 201
        return registered

    def get_workflow(self, name: str, version: Optional[int] = None) -> Workflow:
        """A workflow's latest version (or ``version``) with its definition;
        the latest also lists its newest versions."""
        path = f"/v1/workflows/{_seg(name)}"
        if version is not None:
            path += f"/versions/{_seg(version)}"
        return cast(Workflow, self._http.request("GET", path)[1])

    def list_workflows(self) -> list[WorkflowVersion]:
        """The latest version of every workflow."""
        return cast(list[WorkflowVersion], self._http.request("GET", "/v1/workflows")[1]["workflows"])

    # -- runs ----------------------------------------------------------------

    def start_run(
        self,
        workflow: str,
        input: Any = None,
        version: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        traceparent: Optional[str] = None,
        *,
        priority: Optional[int] = None,
    ) -> RunSummary:
        """Starts a run of ``workflow`` (its latest version, or ``version``)
        with ``input`` (any JSON value; ``{}`` when ``None``). With
        ``idempotency_key``, a second start with the same key returns the
        first run; the same key with another input raises
        ``InvalidRequest`` (422, ``idempotency_key_reused``). ``traceparent``
        (W3C: ``00-<trace id>-<span id>-<flags>``) is sent as that header:
        the run's trace continues the caller's (one that does not read is
        ignored by the server). ``priority`` (1 served first … 5 last) is
        the run's instead of its definition's (3 by default); one outside
        1 to 5 raises ``InvalidRequest``."""
        body: dict[str, Any] = {"workflow": workflow}
        if input is not None:
            body["input"] = input
        if version is not None:
            body["version"] = version
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        if priority is not None:
            body["priority"] = priority
        return cast(RunSummary, self._http.request("POST", "/v1/runs", body, headers=_trace(traceparent))[1])

    def get_run(self, run_id: RunId, wait: Optional[float] = None) -> Run:
        """A run with its input, output and tasks. With ``wait`` (seconds, at
        most 60), the server holds the answer until the run ends or ``wait``
        passes."""
        query = None
        timeout = None
        if wait is not None and wait > 0:
            query = {"wait": _wait_param(wait)}
            timeout = self._http.timeout + min(wait, 60.0)
        return cast(Run, self._http.request("GET", f"/v1/runs/{_seg(run_id)}", query=query, timeout=timeout)[1])

    def wait(self, run_id: RunId, timeout: Optional[float] = None) -> Run:
        """Waits for the run to end (SUCCEEDED, FAILED or CANCELLED) and
        returns it; raises ``WaitTimeout`` (a ``TimeoutError``, carrying the
        run as last seen) after ``timeout`` seconds, or never when it is
        ``None``. It long-polls ``GET /v1/runs/{id}?wait=30s``, so an end is
        seen at once, and rides out a server that is briefly unavailable
        (503, a restart) until the timeout."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        backoff = 0.25
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            step = _LONG_POLL if remaining is None else max(0.0, min(_LONG_POLL, remaining))
            asked = time.monotonic()
            try:
                run = self.get_run(run_id, wait=step)
            except Unavailable as e:
                pause = max(backoff, e.retry_after or 0.0)
                if deadline is not None and time.monotonic() + pause >= deadline:
                    raise
                time.sleep(pause)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.25
            if run["status"] in TERMINAL:
                return run
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(str(run_id), timeout or 0.0, run)
            if time.monotonic() - asked < min(step, 1.0) / 2:
                # Answered early without an end (a server stopping): not a hot loop.
                time.sleep(0.2)

    def list_runs(
        self,
        workflow: Optional[str] = None,
        status: Optional[str] = None,
        limit: Optional[int] = None,
        cursor: Optional[str] = None,
        parent_run_id: Optional[RunId] = None,
    ) -> RunPage:
        """A page of runs, newest first (summaries: no input, output or
        tasks), of ``workflow`` and in ``status`` when given; ``limit`` is 1
        to 1000 (default 50). Pass the page's ``next_cursor`` as ``cursor``
        for the next one; it is ``None`` on the last page."""
        query = {
            "workflow": workflow,
            "status": status,
            "limit": limit,
            "cursor": cursor,
            "parent_run_id": None if parent_run_id is None else str(parent_run_id),
        }
        return cast(RunPage, self._http.request("GET", "/v1/runs", query=query)[1])

    def iter_runs(
        self,
        workflow: Optional[str] = None,
        status: Optional[str] = None,
        page_size: Optional[int] = None,
        parent_run_id: Optional[RunId] = None,
    ) -> Iterator[RunSummary]:
        """Every run that ``list_runs`` would list, newest first, fetching
        the pages as it goes."""
        cursor: Optional[str] = None
        while True:
            page = self.list_runs(workflow, status, page_size, cursor, parent_run_id)
            yield from page["runs"]
            cursor = page["next_cursor"]
            if not cursor or not page["runs"]:
                return

    def iter_run_events(
        self, run_id: RunId, after: Optional[int] = None, page_size: Optional[int] = None
    ) -> Iterator[HistoryEntry]:
        """A run's history, oldest first (after the line ``after``), fetching
        its pages as it goes."""
        while True:
            query = {"after": after, "limit": page_size}
            page = cast(HistoryPage, self._http.request("GET", f"/v1/runs/{_seg(run_id)}/events", query=query)[1])
            yield from page["events"]
            after = page["next_after"]
            if after is None or not page["events"]:
                return

    def run_events(self, run_id: RunId) -> list[HistoryEntry]:
        """A run's whole history, oldest first: every page."""
        return list(self.iter_run_events(run_id))

    def iter_map_items(self, run_id: RunId, node: str, page_size: Optional[int] = None) -> Iterator[RunTask]:
        """The items of the run's MAP node ``node``, by index."""
        after: Optional[int] = None
        while True:
            query = {"node": node, "after": after, "limit": page_size}
            page = cast(ItemPage, self._http.request("GET", f"/v1/runs/{_seg(run_id)}/items", query=query)[1])
            yield from page["items"]
            after = page["next_after"]
            if after is None or not page["items"]:
                return

    def step_logs(
        self,
        run_id: RunId,
        node: str,
        attempt: Optional[int] = None,
        after: Optional[int] = None,
        limit: Optional[int] = None,
    ) -> StepLogs:
        """A page of the lines a step's worker logged for one attempt (its
        current one unless ``attempt`` says), and which attempts have any.
        ``node`` is the node's id, or a MAP item's (``ship_each[3]``)."""
        query = {"attempt": attempt, "after": after, "limit": limit}
        path = f"/v1/runs/{_seg(run_id)}/tasks/{_seg(node)}/logs"
        return cast(StepLogs, self._http.request("GET", path, query=query)[1])

    def iter_step_logs(self, run_id: RunId, node: str, attempt: Optional[int] = None) -> Iterator[LogLine]:
        """Every line of one attempt of a step, fetching pages as it goes."""
        after: Optional[int] = None
        while True:
            page = self.step_logs(run_id, node, attempt, after)
            yield from page["lines"]
            attempt, after = page["attempt"], page["next_after"]
            if after is None or not page["lines"]:
                return

    # -- export and archive ---------------------------------------------------

    def export_runs(
        self,
        workflow: Optional[str] = None,
        from_: Optional[str] = None,
        to: Optional[str] = None,
        after: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> ExportPage:
        """A page of the runs a filter matches, oldest first, each whole (its
        tasks, history, MAP items and log lines): ``from_`` and ``to``
        (RFC 3339) bound their creation; ``limit`` is at most 100."""
        query = {"workflow": workflow, "from": from_, "to": to, "after": after, "limit": limit}
        return cast(ExportPage, self._http.request("GET", "/v1/export/runs", query=query)[1])

    def iter_export(
        self, workflow: Optional[str] = None, from_: Optional[str] = None, to: Optional[str] = None
    ) -> Iterator[ArchivedRun]:
        """Every run a filter matches, whole, oldest first, fetching pages as it goes."""
        after: Optional[str] = None
        while True:
            page = self.export_runs(workflow, from_, to, after)
            yield from page["runs"]
            after = page["next_after"]
            if after is None:
                return

    def get_archived_run(self, run_id: RunId) -> ArchivedRun:
        """A run retention archived, read back from the archive; ``NotFound``
        when no archive is set or it holds no such run."""
        return cast(ArchivedRun, self._http.request("GET", f"/v1/archive/runs/{_seg(run_id)}")[1])

    def update_run(
        self,
        run_id: str,
        name: str,
        payload: Any = None,
        id: Optional[str] = None,
        timeout: Optional[str] = None,
    ) -> UpdateAnswer:
        """Sends update ``name`` to run ``run_id``: its waiting step that
        accepts the update validates it and, when it accepts, completes with
        its output. The answer says which (``accepted``, with ``output`` or
        ``reason``). With ``id``, the update sent again is answered the same
        (``duplicate``) and applied once. A 409 (``update_not_accepted``) when
        no step takes it within ``timeout`` (``"10s"`` by default, at most
        ``"60s"``)."""
        body: dict[str, Any] = {"name": name, "payload": payload}
        if id is not None:
            body["id"] = id
        if timeout is not None:
            body["timeout"] = timeout
        # The server waits up to 60 s for a step that accepts it: the
        # request's timeout is on top.
        path = f"/v1/runs/{_seg(run_id)}/update"
        return cast(UpdateAnswer, self._http.request("POST", path, body, timeout=self._http.timeout + 60.0)[1])

    # -- events -------------------------------------------------------------

    def send_event(
        self,
        name: str,
        key: str = "",
        payload: Any = None,
        id: Optional[str] = None,
        traceparent: Optional[str] = None,
    ) -> EventSent:
        """Sends the event ``name``: it starts a run for each trigger of a
        workflow that listens to ``name`` (``started_runs``; ``trigger_errors``
        for those that matched and failed), then completes the steps waiting
        on ``key`` (WAIT_FOR_EVENT): ``payload`` becomes their output. With
        none waiting it is kept for one to come (``buffered``). ``id`` is the
        sender's id for it (1 to 256 characters): sent again with the same
        name and id, it is recorded once, starts nothing more, and the answer
        says ``duplicate`` with the runs the first sending started. With
        ``traceparent`` (sent as that header), the runs it starts continue
        the caller's trace."""
        body: dict[str, Any] = {"name": name, "key": key, "payload": payload}
        if id is not None:
            body["id"] = id
        return cast(EventSent, self._http.request("POST", "/v1/events", body, headers=_trace(traceparent))[1])

    def list_events(
        self,
        name: Optional[str] = None,
        source: Optional[str] = None,
        before: Optional[int] = None,
        limit: Optional[int] = None,
    ) -> EventPage:
        """A page of the events recorded lately, newest first, each with the
        runs its triggers started; of ``name`` and from ``source`` (``api``,
        or ``webhook:NAME``) when given; ``limit`` is 1 to 1000 (default
        50). Pass the page's ``next_before`` as ``before`` for the next one;
        it is ``None`` on the last page."""
        query = {"name": name, "source": source, "before": before, "limit": limit}
        return cast(EventPage, self._http.request("GET", "/v1/events", query=query)[1])

    def iter_events(
        self,
        name: Optional[str] = None,
        source: Optional[str] = None,
        before: Optional[int] = None,
        page_size: Optional[int] = None,
    ) -> Iterator[RecordedEvent]:
        """Every event that ``list_events`` would list (those before the
        ``seq`` ``before``), newest first, fetching the pages as it goes."""
        while True:
            page = self.list_events(name, source, before, page_size)
            yield from page["events"]
            before = page["next_before"]
            if before is None or not page["events"]:
                return

    # -- schedules and webhooks ---------------------------------------------

    def backfill_schedule(
        self,
        id: str,
        from_: Union[str, datetime],
        to: Union[str, datetime],
        overlap: Optional[BackfillOverlap] = None,
    ) -> BackfillQueued:
        """Queues the runs the schedule ``id`` would have started at its fire
        times in ``[from_, to)`` (RFC 3339 strings, or aware ``datetime`` s;
        ``to`` at most now): the coordinator starts them (``trigger`` has
        ``"backfill": True``) under ``overlap`` (``allow`` by default,
        ``skip``, ``buffer_all``), or holds them while the schedule is
        paused. A fire time started or queued before is not queued again
        (``already``). ``NotFound`` for no such schedule, ``InvalidRequest``
        (``invalid_schedule``) for a range that is empty, in the future or
        too long."""
        body: dict[str, Any] = {"from": _time(from_, "from_"), "to": _time(to, "to")}
        if overlap is not None:
            body["overlap"] = overlap
        return cast(BackfillQueued, self._http.request("POST", f"/v1/schedules/{_seg(id)}/backfill", body)[1])

    def create_webhook(self, spec: Mapping[str, Any]) -> WebhookCreated:
        """Creates the webhook ``{"name", "scheme", "secret", "tolerance"?,
        "event"?}``, or replaces the one of that name (``created`` false):
        each delivery to its ``url`` whose signature holds becomes an event.
        ``secret`` is the name of the signing secret, which each coordinator
        reads from ``COMPOSER_WEBHOOK_SECRET_<secret>`` (``A-Z 0-9 _``),
        never the secret itself; ``secret_set`` says whether this one has it."""
        status, body = self._http.request("POST", "/v1/webhooks", dict(spec))
        created = cast(WebhookCreated, body)
        created["created"] = status == 201
        return created

    def list_webhooks(self) -> list[Webhook]:
        """Every webhook, by name."""
        return cast(list[Webhook], self._http.request("GET", "/v1/webhooks")[1]["webhooks"])

    def get_webhook(self, name: str) -> Webhook:
        """A webhook (``NotFound`` when there is none of that name)."""
        return cast(Webhook, self._http.request("GET", f"/v1/webhooks/{_seg(name)}")[1])

    def delete_webhook(self, name: str) -> Deleted:
        """Deletes a webhook: its deliveries are refused from now on; the
        events it sent stay. ``NotFound`` when there is none of that name."""
        return cast(Deleted, self._http.request("DELETE", f"/v1/webhooks/{_seg(name)}")[1])

    # -- namespaces -----------------------------------------------------------

    def create_namespace(self, name: str, description: str = "") -> NamespaceCreated:
        """Creates the namespace ``name`` (1 to 63 lowercase letters, digits
        and ``-``, starting with a letter), with its own workflows, runs,
        events, schedules, webhooks, limits and queues; one that exists is
        answered as it is (``created`` false). Needs a key of every
        namespace (``Unauthorized`` otherwise); ``Conflict`` while one of
        that name is being deleted. The namespaces are cluster-wide: the
        client's own ``namespace`` does not matter here."""
        status, body = self._http.request("POST", "/v1/namespaces", {"name": name, "description": description})
        created = cast(NamespaceCreated, body)
        created["created"] = status == 201
        return created

    def list_namespaces(self) -> list[Namespace]:
        """Every namespace, ``default`` first, then by name (those being
        deleted too); a key bound to one sees that one only."""
        return cast(list[Namespace], self._http.request("GET", "/v1/namespaces")[1]["namespaces"])

    def get_namespace(self, name: str) -> Namespace:
        """A namespace with what it uses of its quotas (``NotFound`` when
        there is none of that name, it is being deleted, or the key is bound
        to another)."""
        return cast(Namespace, self._http.request("GET", f"/v1/namespaces/{_seg(name)}")[1])

    def set_namespace_quotas(self, name: str, quotas: NamespaceQuotas) -> Namespace:
        """Sets every quota of a namespace at once (one left out is none):
        a start, schedule or limit past one then raises ``Unavailable``
        (HTTP 429, its message naming the quota). Needs a key of every
        namespace with ``admin``."""
        body = dict(quotas)
        return cast(Namespace, self._http.request("PUT", f"/v1/namespaces/{_seg(name)}/quotas", body)[1])

    def delete_namespace(self, name: str) -> Namespace:
        """Deletes a namespace with everything it holds: it is no longer
        served from now on (calls naming it raise ``Conflict``), and its data
        is dropped some seconds later. Answers it, ``state`` ``deleting``.
        ``default`` cannot be deleted; ``NotFound`` when there is none of
        that name."""
        return cast(Namespace, self._http.request("DELETE", f"/v1/namespaces/{_seg(name)}")[1])

    # -- limits ---------------------------------------------------------------

    def list_limits(self, after: Optional[str] = None, limit: Optional[int] = None) -> LimitPage:
        """A page of the limits, in key order: every key a step has waited
        for or an operator set, with its values, who set them (``set_by``),
        and its use now. ``limit`` is 1 to 1000 (default 100). Pass the
        page's ``next_after`` as ``after`` for the next one; it is ``None``
        on the last page."""
        query = {"after": after, "limit": limit}
        return cast(LimitPage, self._http.request("GET", "/v1/limits", query=query)[1])

    def iter_limits(self, after: Optional[str] = None, page_size: Optional[int] = None) -> Iterator[Limit]:
        """Every limit (those after the key ``after``), in key order,
        fetching the pages as it goes."""
        while True:
            page = self.list_limits(after, page_size)
            yield from page["limits"]
            after = page["next_after"]
            if after is None or not page["limits"]:
                return

    def get_limit(self, key: str) -> Limit:
        """A limit and its use now (``NotFound`` for a key no step waited for
        and no operator set). ``key`` is the limit's key as it is
        (``stripe:acct_1``): it is encoded here."""
        return cast(Limit, self._http.request("GET", f"/v1/limits/{_seg(key)}")[1])

    def set_limit(
        self,
        key: str,
        *,
        rate: Optional[str] = None,
        burst: Optional[int] = None,
        concurrency: Optional[int] = None,
    ) -> Limit:
        """Sets a key's values at run time, across every run, item and
        coordinator: ``rate`` (``"N/period"``: ``"25/1s"``, ``"1000/1h"``, a
        token bucket holding ``burst`` tokens, N by default) and
        ``concurrency`` (steps in flight at once); a part left out is not
        limited. From now on the definitions that use the key no longer
        change it (``delete_limit`` gives it back to them); steps waiting for
        it go as soon as the new values let them. ``InvalidRequest`` for a
        value out of range (``"0/1s"``)."""
        body: dict[str, Any] = {}
        if rate is not None:
            body["rate"] = rate
        if burst is not None:
            body["burst"] = burst
        if concurrency is not None:
            body["concurrency"] = concurrency
        return cast(Limit, self._http.request("PUT", f"/v1/limits/{_seg(key)}", body)[1])

    def delete_limit(self, key: str) -> Deleted:
        """Forgets the values an operator set: the key goes back to what the
        definitions that use it say (one none of them gives values to is not
        limited). ``NotFound`` when there is no such limit."""
        return cast(Deleted, self._http.request("DELETE", f"/v1/limits/{_seg(key)}")[1])

    # -- control --------------------------------------------------------------

    def _control(self, run_id: RunId, action: str) -> Run:
        return cast(Run, self._http.request("POST", f"/v1/runs/{_seg(run_id)}/{action}")[1])

    def cancel(self, run_id: RunId) -> Run:
        """Cancels a running, paused or queued run: its open steps are
        cancelled. ``Conflict`` when it already ended."""
        return self._control(run_id, "cancel")

    def retry(self, run_id: RunId) -> Run:
        """Runs a FAILED (or CANCELLED) run again from its failed steps, on
        the same version. ``Conflict`` otherwise."""
        return self._control(run_id, "retry")

    def pause(self, run_id: RunId) -> Run:
        """Pauses a RUNNING run: steps already started finish, nothing new
        starts until ``resume``. ``Conflict`` in any other status."""
        return self._control(run_id, "pause")

    def resume(self, run_id: RunId) -> Run:
        """Resumes a PAUSED run. ``Conflict`` in any other status."""
        return self._control(run_id, "resume")

    def set_run_priority(self, run_id: RunId, priority: int) -> Run:
        """Gives an open run (QUEUED, RUNNING or PAUSED), and the open runs
        under it, the priority ``priority``, 1 (served first) to 5 (last):
        its queued start and its steps not started yet, dispatched ones
        included, are served at it; the history records it
        (``PriorityChanged``). ``Conflict`` once the run has ended,
        ``InvalidRequest`` for a priority outside 1 to 5."""
        body = {"priority": priority}
        return cast(Run, self._http.request("PUT", f"/v1/runs/{_seg(run_id)}/priority", body)[1])
