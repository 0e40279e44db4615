"""What the API answers, as ``TypedDict`` s: the server's JSON as it came,
checked by a type checker, with nothing converted at run time.

Keys the server always sends are required (a nullable one is
``Optional``); keys it leaves out when they have no value (``output``,
``trigger``, ``parent_run_id`` …) are not. Timestamps are RFC 3339 strings
in UTC (``parse_time`` makes a ``datetime`` of one); ids are UUID strings.
"""

from datetime import datetime, timezone
from typing import Any, Literal, Optional, TypedDict

__all__ = [
    "TERMINAL",
    "BackfillOverlap",
    "BackfillQueued",
    "Deleted",
    "ErrorInfo",
    "EventPage",
    "EventSent",
    "Held",
    "HeldReason",
    "HistoryEntry",
    "HistoryKind",
    "HistoryPage",
    "ItemPage",
    "Limit",
    "LimitPage",
    "LimitSetBy",
    "LogLine",
    "MapProgress",
    "Namespace",
    "NamespaceCreated",
    "RecordedEvent",
    "Registered",
    "Run",
    "RunPage",
    "RunStatus",
    "RunSummary",
    "RunTask",
    "StepLogs",
    "TaskState",
    "TriggerFailure",
    "TriggerHeld",
    "TriggeredRun",
    "UpdateAnswer",
    "Webhook",
    "WebhookCreated",
    "WebhookScheme",
    "Workflow",
    "WorkflowVersion",
    "parse_time",
]

RunStatus = Literal["QUEUED", "RUNNING", "PAUSED", "SUCCEEDED", "FAILED", "CANCELLED"]
"""A run's status; it ends SUCCEEDED, FAILED or CANCELLED (``TERMINAL``)."""

TERMINAL: frozenset[str] = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
"""The statuses a run ends in."""

TaskState = Literal["QUEUED", "PENDING", "RUNNING", "WAITING", "COMPLETED", "FAILED", "SKIPPED", "CANCELLED"]
"""A task's state."""

HistoryKind = Literal[
    "RunStarted",
    "TaskDispatched",
    "TaskWaiting",
    "TaskRetryScheduled",
    "TaskCompleted",
    "TaskFailed",
    "TaskSkipped",
    "TaskCancelled",
    "RunSucceeded",
    "RunFailed",
    "RunCancelled",
    "RunRetried",
    "RunPaused",
    "RunResumed",
    "EventIgnored",
    "MapStarted",
    "TaskInDoubt",
    "TaskResolved",
    "TaskReset",
    "RunRerun",
    "HandlerStarted",
    "PriorityChanged",
    "RunMigrated",
    "DeadlinePassed",
    "ApprovalVoted",
    "ApprovalEscalated",
]
"""What a line of a run's history records (``PriorityChanged``: its
priority was changed, payload ``{"priority", "from", "actor"}``;
``RunMigrated``: it moved to another version of its workflow, payload
``{"from_version", "to_version", "map", "actor", "reason"?}``;
``HandlerStarted``: its end started a hook, payload ``{"hook", "workflow",
"run_id"}`` or ``{"hook", "workflow", "error"}``; ``DeadlinePassed``: a
deadline passed with it (or its step ``node``) open, payload ``{"workflow",
"node", "after", "run_id"}`` or with ``"error"``; ``ApprovalVoted``: a
person voted on an APPROVAL step, payload ``{"vote": {"person", "answer",
"via"?}, "actor"}``; ``ApprovalEscalated``: one escalated, payload
``{"assignees", "due_at"}``)."""


class _MapProgressRequired(TypedDict):
    total: int
    queued: int
    open: int
    completed: int
    failed: int


class MapProgress(_MapProgressRequired, total=False):
    """A MAP task's item counts: ``queued + open + completed + failed == total``;
    ``created``: the items created so far (a large MAP creates them a chunk at
    a time; absent from older coordinators)."""

    created: int


class _ErrorInfoRequired(TypedDict):
    code: str
    retryable: bool


class ErrorInfo(_ErrorInfoRequired, total=False):
    """What is known of a task's failure besides its message (what a failure
    edge tests as ``.nodes.X.error``): a stable ``code`` (``task_failed``,
    ``http_status``, ``timeout``, ``event_timeout`` …), whether it could have
    been retried, and the HTTP ``status`` when it is one."""

    status: int


HeldReason = Literal["rate", "concurrency", "retry_after", "queued"]
"""Why a step waits for a limit: ``rate`` (its bucket is empty),
``concurrency`` (every slot is taken), ``retry_after`` (a target asked for a
pause) or ``queued`` (its turn comes at the limiter's next pass)."""


class _HeldRequired(TypedDict):
    key: str
    reason: HeldReason


class Held(_HeldRequired, total=False):
    """Why a PENDING step is held back (not sent to a worker yet): the limit
    ``key`` that holds it, the ``reason``, and ``until`` when it may go, where
    that is known (a rate's next token, a pause's end)."""

    until: Optional[str]


class _RunTaskRequired(TypedDict):
    id: str
    node_id: str
    node_type: str
    state: TaskState
    attempt: int
    input: Any
    output: Any
    error: Optional[str]
    wake_at: Optional[str]
    started_at: Optional[str]
    finished_at: Optional[str]


class RunTask(_RunTaskRequired, total=False):
    """One task of a run (a node's, or a MAP item's: ``ship_each[3]``)."""

    parent_task_id: str
    item_index: int
    progress: MapProgress
    error_info: ErrorInfo
    """Of a failed task, on servers with failure edges."""
    held: Held
    """Of a step its limits hold back, on servers with limits."""


class _RunSummaryRequired(TypedDict):
    id: str
    workflow: str
    version: int
    workflow_id: str
    status: RunStatus
    error: Optional[str]
    created_at: str
    updated_at: str
    finished_at: Optional[str]
    trace_id: str
    """The OpenTelemetry trace its spans go to (32 hex digits): its own id,
    or the trace of the ``traceparent`` it was started under."""
    priority: int
    """1 (served first) to 5 (last): its steps' and its queued start's; its
    start's, else its definition's (3 by default)."""


class RunSummary(_RunSummaryRequired, total=False):
    """A run as lists show it: no input, output or tasks."""

    trigger: Any
    """What started it when not an API call: a schedule (``{"schedule",
    "fire_time"}``, with ``"backfill": True`` for a backfilled fire time) or
    an event's trigger (``{"event", "event_id", "trigger"}``, the trigger's
    place in the definition's ``triggers``)."""
    parent_run_id: str
    parent_task_id: str
    handles_run_id: str
    """A hook's run (a failure handler, ``on_success``, ``on_end``): the run
    whose end started it."""
    fairness_key: str
    """Whose work it is (its definition's ``fairness_key``, evaluated): runs
    and steps of different keys take turns. Absent when it has none."""


class HookRun(TypedDict):
    """A run a hook of another run's end started."""

    hook: str
    """``on_failure``, ``on_success``, ``on_end`` or ``deadline``."""
    run_id: str


class _RunRequired(RunSummary):
    input: Any
    tasks: list[RunTask]


class Run(_RunRequired, total=False):
    """A run with its input, its tasks and (once it has one) its output."""

    output: Any
    failure_handler_run_ids: list[str]
    """The failure handler runs its end started (a FAILED or CANCELLED run)."""
    hook_runs: list[HookRun]
    """Every hook's run its end started (``on_failure``, ``on_success``,
    ``on_end``), oldest first."""


class RunPage(TypedDict):
    """A page of ``GET /v1/runs``, newest first."""

    runs: list[RunSummary]
    next_cursor: Optional[str]


class ItemPage(TypedDict):
    """A page of a MAP's items, by index."""

    items: list[RunTask]
    next_after: Optional[int]


class HistoryEntry(TypedDict):
    """One line of a run's history."""

    seq: int
    type: HistoryKind
    payload: Any
    created_at: str


class HistoryPage(TypedDict):
    """A page of a run's history, oldest first."""

    events: list[HistoryEntry]
    next_after: Optional[int]


class LogLine(TypedDict):
    """One line of a step's log; ``at`` is when the coordinator stored it."""

    seq: int
    at: str
    line: str


class AttemptLines(TypedDict):
    """How many lines an attempt of a step has."""

    attempt: int
    lines: int


class StepLogs(TypedDict):
    """A page of one attempt's log lines, oldest first, and which attempts
    of the step have any."""

    attempt: int
    attempts: list[AttemptLines]
    lines: list[LogLine]
    next_after: Optional[int]


class AttemptLog(TypedDict):
    """The log lines of one attempt of one step (``node``: its node id, or a
    MAP item's)."""

    node: str
    attempt: int
    lines: list[LogLine]


class _ArchivedRunRequired(TypedDict):
    run: Run
    history: list[HistoryEntry]


class ArchivedRun(_ArchivedRunRequired, total=False):
    """A run whole, as an archive or an export keeps it: the run with its
    tasks as ``get_run`` answers, its whole history, each MAP's items (by
    the MAP's node id) and every step attempt's log lines."""

    items: dict[str, list[RunTask]]
    logs: list[AttemptLog]


class ExportPage(TypedDict):
    """A page of whole runs, oldest first; ``next_after`` fetches the next."""

    runs: list[ArchivedRun]
    next_after: Optional[str]


class WorkflowVersion(TypedDict):
    """A version of a workflow definition, without the definition."""

    id: str
    name: str
    version: int
    created_at: str


class Registered(WorkflowVersion):
    """What registering a definition did: ``created`` is true for a new
    version (201) and false when the definition is identical to any
    registered version of its name, whose ``version`` it then is (200).
    Registering ``version=N`` answers N when N holds the same definition;
    N registered with a different one, or not the next, is a ``Conflict``
    (409)."""

    created: bool


class _WorkflowRequired(WorkflowVersion):
    spec: dict[str, Any]


class Workflow(_WorkflowRequired, total=False):
    """A version with its definition (``spec``, as the server normalised
    it); the latest one also lists a page of ``versions``, newest first, and
    ``versions_next`` when there are more."""

    versions: list[WorkflowVersion]
    versions_next: Optional[int]


class _TriggeredRunRequired(TypedDict):
    workflow: str
    trigger: int
    run_id: str


class TriggeredRun(_TriggeredRunRequired, total=False):
    """A run an event's trigger started: ``trigger`` is the trigger's place
    in the workflow's ``triggers``; ``replayed_by``, the replay that started
    it (``POST /v1/events/replay``), absent when the event's sending did."""

    replayed_by: str


class TriggerFailure(TypedDict):
    """A trigger that matched an event but started no run, and why (its
    ``when`` or ``input`` failed to evaluate …)."""

    workflow: str
    trigger: int
    error: str


class TriggerHeld(TypedDict):
    """What a trigger's flow control (``debounce``, ``batch``, ``throttle``,
    ``singleton``) did with an event that has no run: held for a later run,
    replaced by a later event, or dropped, and why (``note``)."""

    workflow: str
    trigger: int
    flow: str
    note: str


class _EventSentRequired(TypedDict):
    matched: int
    buffered: bool


class _UpdateAnswerRequired(TypedDict):
    id: str
    name: str
    node: str
    accepted: bool
    duplicate: bool


class UpdateAnswer(_UpdateAnswerRequired, total=False):
    """What a run's step answered to an update: ``accepted`` with its
    ``output`` (the step completed with it), or refused with its ``reason``;
    ``node`` is the step that took it, and ``duplicate`` says it was answered
    before (this id): nothing was done again."""

    output: Any
    reason: str


class EventSent(_EventSentRequired, total=False):
    """What sending an event did: ``matched`` waiting tasks completed, or
    ``buffered`` when none waited (it is kept for one to come). Coordinators
    with triggers also say the event's ``id`` (the sender's, or one made for
    it), the runs its workflows' triggers started (``started_runs``), the
    triggers that matched but failed (``trigger_errors``), and whether it is
    a ``duplicate`` of one sent before with the same name and id (nothing
    was done again; ``started_runs`` are then the first sending's)."""

    id: str
    delivered_to_waiters: int
    """The waiting steps it completed (as ``matched``)."""
    started_runs: list[TriggeredRun]
    trigger_errors: list[TriggerFailure]
    duplicate: bool
    held: list[TriggerHeld]
    """Triggers whose flow control took the event without starting a run
    for it now."""


class _RecordedEventRequired(TypedDict):
    seq: int
    name: str
    id: str
    key: str
    payload: Any
    source: str
    delivered_to_waiters: int
    started_runs: list[TriggeredRun]
    trigger_errors: list[TriggerFailure]
    received_at: str


class RecordedEvent(_RecordedEventRequired, total=False):
    """An event as the coordinator recorded it (``GET /v1/events``), with what
    it did. ``source`` is ``api``, or ``webhook:NAME`` for a webhook's.
    ``payload`` is ``None`` when ``payload_omitted`` (over 64 KiB)."""

    payload_bytes: int
    payload_omitted: bool
    held: list[TriggerHeld]
    """Triggers whose flow control holds the event, replaced it or dropped it."""


class EventPage(TypedDict):
    """A page of ``GET /v1/events``, newest first; ``next_before`` fetches the
    next (``None`` on the last)."""

    events: list[RecordedEvent]
    next_before: Optional[int]


BackfillOverlap = Literal["allow", "skip", "buffer_all"]
"""What a backfilled fire time does while a run of the schedule is open:
``allow`` (all at once, the default), ``skip`` (it starts none) or
``buffer_all`` (one at a time, oldest first)."""


class BackfillQueued(TypedDict):
    """What a backfill queued: of the ``fire_times`` of the cron in the range
    (the first and last of them, ``None`` when there are none), ``queued``
    now and ``already`` started, queued or buffered before. The coordinator
    starts the runs (``trigger.backfill``) unless the schedule is
    ``paused``: then they wait for it to be resumed."""

    schedule: str
    fire_times: int
    queued: int
    already: int
    first_fire_time: Optional[str]
    last_fire_time: Optional[str]
    overlap: BackfillOverlap
    paused: bool


WebhookScheme = Literal["stripe", "github"]
"""How a webhook's deliveries are signed (HMAC-SHA256 with its secret)."""


class _WebhookRequired(TypedDict):
    name: str
    scheme: WebhookScheme
    secret: str
    url: str
    secret_set: bool
    created_at: str
    updated_at: str


class Webhook(_WebhookRequired, total=False):
    """A webhook: its spec, where the other service sends its deliveries
    (``url``, a path on the coordinator), and whether this coordinator has
    its secret set (``secret_set``: the variable
    ``COMPOSER_WEBHOOK_SECRET_<secret>``; ``secret`` is that name, never the
    secret itself)."""

    tolerance: Optional[str]
    """How far a ``stripe`` delivery's signed timestamp may be from now."""
    event: Any
    """The template that makes each delivery an event (absent: the default)."""


class WebhookCreated(Webhook):
    """What creating a webhook did: ``created`` is true for a new one (201)
    and false when it replaced one of the name (200)."""

    created: bool


LimitSetBy = Literal["definition", "api"]
"""Whose values a limit has: the nodes' that use it (``definition``), or an
operator's (``api``, set by ``set_limit``, which definitions no longer
change)."""


class _LimitRequired(TypedDict):
    key: str
    set_by: LimitSetBy
    in_use: int
    waiting: int
    updated_at: str


class Limit(_LimitRequired, total=False):
    """A limit on steps across runs (``GET /v1/limits/{key}``), with its use
    now: ``in_use`` steps sent and not finished, ``waiting`` steps held. The
    values it has are present: ``rate`` (``"N/period"``, with ``burst``) and
    ``concurrency``; a part left out is not limited."""

    rate: Optional[str]
    burst: Optional[int]
    concurrency: Optional[int]
    tokens: Optional[float]
    """The tokens in its bucket now (a rate only)."""
    held_until: Optional[str]
    """A target's ``Retry-After`` holds the key until then."""


class LimitPage(TypedDict):
    """A page of ``GET /v1/limits``, in key order; ``next_after`` fetches the
    next (``None`` on the last)."""

    limits: list[Limit]
    next_after: Optional[str]


class NamespaceQuotas(TypedDict, total=False):
    """A namespace's quotas, each absent when there is none: ``open_runs``
    (queued, running or paused at once), ``starts_per_second`` (runs
    started from outside a run, across coordinators), ``schedules``,
    ``limits`` (limit keys with values) and ``stored_bytes``."""

    open_runs: int
    starts_per_second: int
    schedules: int
    limits: int
    stored_bytes: int


class NamespaceUsage(TypedDict):
    """What a namespace uses of its quotas."""

    open_runs: int
    schedules: int
    limits: int
    stored_bytes: int


class _NamespaceRequired(TypedDict):
    name: str
    description: str
    state: str
    created_by: str
    created_at: str
    quotas: NamespaceQuotas


class Namespace(_NamespaceRequired, total=False):
    """A namespace (``GET /v1/namespaces/{name}``): its own workflows, runs,
    schedules, webhooks, limits, events, bulk jobs, queues and audit log.
    ``state`` is ``active``, or ``deleting`` (no longer served, its data
    being dropped); ``created_by`` names the key (or token) that created it;
    ``usage`` (``get_namespace`` only) is what it uses of its ``quotas``."""

    usage: NamespaceUsage


class NamespaceCreated(Namespace):
    """What creating a namespace did: ``created`` is true for a new one (201)
    and false when it existed already (200)."""

    created: bool


class Deleted(TypedDict):
    """What a delete answers: the name (or limit key) it deleted."""

    deleted: str


def parse_time(value: str) -> datetime:
    """A timestamp of the API (``2026-01-02T03:04:05.123456789Z``) as an
    aware ``datetime`` in UTC (to the microsecond)."""
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    # datetime before 3.11 takes at most 6 digits of fraction.
    head, dot, rest = text.partition(".")
    if dot:
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = head + "." + (rest[:digits][:6]).ljust(6, "0") + rest[digits:]
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)
