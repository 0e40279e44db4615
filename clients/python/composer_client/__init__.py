"""A Python client of Composer, the distributed workflow engine: the API
client (:class:`Client`), a worker for custom node types
(:mod:`composer_client.worker`) and workflows in code, typed steps
included (:mod:`composer_client.workflow`). Standard library only.

    from composer_client import Client, NotFound

    client = Client("http://127.0.0.1:8080", token=None)
    run = client.start_run("hello", input={"name": "Ada"})
    print(client.wait(run["id"], timeout=60)["status"])

Log records go to loggers under ``composer_client`` (``composer_client.worker``,
``composer_client.http``); the package adds no handler of its own beyond a
``NullHandler``.
"""

import logging

from ._version import __version__
from .client import Client, RunId
from .errors import (
    ComposerError,
    Conflict,
    InvalidRequest,
    NotFound,
    Unauthorized,
    Unavailable,
    WaitTimeout,
)
from .types import (
    TERMINAL,
    ArchivedRun,
    AttemptLog,
    BackfillOverlap,
    BackfillQueued,
    Deleted,
    ErrorInfo,
    EventPage,
    EventSent,
    ExportPage,
    Held,
    HeldReason,
    HistoryEntry,
    HistoryKind,
    HistoryPage,
    ItemPage,
    Limit,
    LimitPage,
    LimitSetBy,
    MapProgress,
    Namespace,
    NamespaceCreated,
    NamespaceQuotas,
    NamespaceUsage,
    RecordedEvent,
    Registered,
    Run,
    RunPage,
    RunStatus,
    RunSummary,
    RunTask,
    TaskState,
    TriggeredRun,
    TriggerFailure,
    TriggerHeld,
    UpdateAnswer,
    Webhook,
    WebhookCreated,
    WebhookScheme,
    Workflow,
    WorkflowVersion,
    parse_time,
)

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "TERMINAL",
    "ArchivedRun",
    "AttemptLog",
    "BackfillOverlap",
    "BackfillQueued",
    "Client",
    "ComposerError",
    "Conflict",
    "Deleted",
    "ErrorInfo",
    "EventPage",
    "EventSent",
    "ExportPage",
    "Held",
    "HeldReason",
    "HistoryEntry",
    "HistoryKind",
    "HistoryPage",
    "InvalidRequest",
    "ItemPage",
    "Limit",
    "LimitPage",
    "LimitSetBy",
    "MapProgress",
    "Namespace",
    "NamespaceCreated",
    "NamespaceQuotas",
    "NamespaceUsage",
    "NotFound",
    "RecordedEvent",
    "Registered",
    "Run",
    "RunId",
    "RunPage",
    "RunStatus",
    "RunSummary",
    "RunTask",
    "TaskState",
    "TriggerFailure",
    "TriggerHeld",
    "TriggeredRun",
    "Unauthorized",
    "Unavailable",
    "UpdateAnswer",
    "WaitTimeout",
    "Webhook",
    "WebhookCreated",
    "WebhookScheme",
    "Workflow",
    "WorkflowVersion",
    "__version__",
    "parse_time",
]
