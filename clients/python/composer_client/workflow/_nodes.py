"""The parts of a definition: node specs of every kind (usable as a MAP's
item node too) and the options a node or a workflow takes."""

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, Literal, Optional, TypedDict, TypeVar, Union, overload

from ._refs import Ref, duration, render

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "Concurrency",
    "HttpResponse",
    "ItemOptions",
    "Limit",
    "OnFailure",
    "Retry",
    "Spec",
    "Trigger",
    "custom",
    "fail",
    "http",
    "loop",
    "map_",
    "sub_workflow",
    "transform",
    "wait",
    "wait_for_event",
]

Duration = Union[str, timedelta]
"""``"30s"``, ``"1h30m"`` or a ``timedelta``."""
Template = Any
"""A JSON value whose strings may hold ``${ … }`` expressions, and ``Ref``s anywhere."""
Jq = Union[str, Ref[Any]]
"""A bare jq expression (``.nodes.start.output.big``), or a ``Ref`` for its path."""

NAME = re.compile(r"(\.{0,2}[A-Za-z0-9_-]|\.{3})[A-Za-z0-9_.-]*")


def check_name(what: str, name: str) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= 128 or not NAME.fullmatch(name):
        raise ValueError(f"{what} must be 1 to 128 of A-Z a-z 0-9 _ . - (and not . or ..), got {name!r}")
    return name


def _jq(value: Optional[Jq]) -> Optional[str]:
    return value.jq if isinstance(value, Ref) else value


def _drop_none(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


@dataclass(frozen=True)
class Retry:
    """A node's retry policy: ``max_attempts`` in all (3 by default), the
    backoff from ``initial_backoff`` times ``multiplier`` up to
    ``max_backoff``; ``on_429`` ``respect`` or ``ignore`` a Retry-After."""

    max_attempts: Optional[int] = None
    initial_backoff: Optional[Duration] = None
    multiplier: Optional[float] = None
    max_backoff: Optional[Duration] = None
    on_429: Optional[Literal["respect", "ignore"]] = None

    def to_json(self) -> dict[str, Any]:
        return dict(render(_drop_none(self.__dict__)))


@dataclass(frozen=True)
class Limit:
    """A limit on a node's steps across runs: per ``key`` (a template over
    the step's scope), a ``rate`` (``"25/1s"``, with a ``burst``) or a
    ``concurrency``, or neither for a named limit set at run time."""

    key: Template
    rate: Optional[str] = None
    burst: Optional[int] = None
    concurrency: Optional[int] = None

    def to_json(self) -> dict[str, Any]:
        return dict(render(_drop_none(self.__dict__)))


@dataclass(frozen=True)
class Concurrency:
    """At most ``max`` runs open at once (per value of ``key``, over ``{input}``)."""

    max: int
    key: Optional[Template] = None

    def to_json(self) -> dict[str, Any]:
        return dict(render(_drop_none(self.__dict__)))


@dataclass(frozen=True)
class Trigger:
    """Runs started by events named ``event`` whose ``when`` (jq over
    ``{event}``) holds, with ``input`` (a template over ``{event}``) and an
    ``idempotency_key``. Flow control, per ``key`` (the event's by
    default): ``debounce`` (``{"period", "leading"?, "max_wait"?}``: one
    run per burst), ``batch`` (``{"max_size", "max_wait"}``: one run for a
    list of events), ``throttle`` (``{"count", "period", "excess"?}``:
    the rest ``"queue"`` or ``"drop"``), ``singleton`` (``"skip"`` or
    ``"cancel"``: one running run per key)."""

    event: str
    when: Optional[Jq] = None
    input: Optional[Template] = None
    idempotency_key: Optional[Template] = None
    key: Optional[Template] = None
    debounce: Optional[Mapping[str, Any]] = None
    batch: Optional[Mapping[str, Any]] = None
    throttle: Optional[Mapping[str, Any]] = None
    singleton: Optional[Literal["skip", "cancel"]] = None

    def to_json(self) -> dict[str, Any]:
        d = _drop_none(self.__dict__)
        if "when" in d:
            d["when"] = _jq(d["when"])
        return dict(render(d))


@dataclass(frozen=True)
class OnFailure:
    """A run of ``workflow`` started when a run ends FAILED (or as ``on``
    says: ``["FAILED", "CANCELLED"]``), with ``input`` a template over
    ``{failed_run, input}``."""

    workflow: str
    input: Optional[Template] = None
    on: Optional[Sequence[Literal["FAILED", "CANCELLED"]]] = None
    version: Optional[int] = None

    def to_json(self) -> dict[str, Any]:
        return dict(render(_drop_none(self.__dict__)))


class HttpResponse(TypedDict):
    """An HTTP node's output: the answer's status, headers and body (parsed when JSON)."""

    status: int
    headers: dict[str, str]
    body: Any


RetryArg = Union[Retry, Mapping[str, Any]]
LimitArg = Union[Limit, Mapping[str, Any]]
Delivery = Literal["at_least_once", "at_most_once"]


class ItemOptions(TypedDict, total=False):
    """What any node (and a MAP's item node) may say besides its config."""

    queue: str
    """The queue its steps go to (its type in lower case by default)."""
    retry: RetryArg
    timeout: Duration
    """How long one attempt may take (HTTP, custom, SUB_WORKFLOW)."""
    delivery: Delivery
    """``at_most_once``: an attempt whose outcome is unknown waits IN_DOUBT."""
    limits: Sequence[LimitArg]
    deadlines: Sequence[Mapping[str, Any]]
    """Runs started when the step has not ended ``after`` it was created:
    ``[{"after": "2h", "start": {"workflow": "page", "input"?: …}}]`` (not
    on a MAP's item node)."""
    updates: Sequence[Mapping[str, Any]]
    """The updates a WAIT_FOR_EVENT step accepts while it waits:
    ``[{"name": "approve", "validate"?: jq, "refusal"?: text, "output"?: …}]``
    (``Client.update_run`` sends one)."""


_OPTION_KEYS = ("queue", "retry", "timeout", "delivery", "limits", "deadlines", "updates")


T = TypeVar("T")


@dataclass
class Spec(Generic[T]):
    """A node without its id and edges: its ``type``, ``config`` and options
    (``queue``, ``retry``, ``timeout``, ``delivery``, ``limits``,
    ``deadlines``). A MAP's
    ``node`` is one; a workflow's nodes are made of them."""

    type: str
    config: Optional[Template] = None
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in self.options:
            if key not in _OPTION_KEYS:
                raise TypeError(f"a node has no option {key!r} (it takes {', '.join(_OPTION_KEYS)})")

    def to_json(self) -> dict[str, Any]:
        """The node as JSON, without an id (a MAP's item node)."""
        out: dict[str, Any] = {"type": self.type}
        for key in _OPTION_KEYS:
            value = self.options.get(key)
            if value is None:
                continue
            if key == "timeout":
                value = duration(value)
            out[key] = render(value)
        if self.config is not None:
            out["config"] = render(self.config)
        return out


def custom(type: str, config: Optional[Template] = None, **options: "Unpack[ItemOptions]") -> Spec[Any]:
    """A node of a custom type, run by a worker serving ``type``; ``config``
    is evaluated and sent as the task's input."""
    return Spec(check_name("a custom type", type), config, dict(options))


def http(
    url: Template,
    *,
    method: Optional[str] = None,
    headers: Optional[Template] = None,
    body: Optional[Template] = None,
    idempotency_key: Optional[Template] = None,
    request_timeout: Optional[Duration] = None,
    accept: Optional[Sequence[int]] = None,
    retry_statuses: Optional[Sequence[int]] = None,
    follow_redirects: Optional[Union[bool, Template]] = None,
    **options: "Unpack[ItemOptions]",
) -> Spec[HttpResponse]:
    """An HTTP call. ``request_timeout`` is the config's ``timeout`` (how
    long the call may take); ``timeout`` among the options is the node's
    (how long one attempt may take)."""
    config = _drop_none(
        {
            "url": url,
            "method": method,
            "headers": headers,
            "body": body,
            "idempotency_key": idempotency_key,
            "timeout": None if request_timeout is None else duration(request_timeout),
            "accept": None if accept is None else list(accept),
            "retry_statuses": None if retry_statuses is None else list(retry_statuses),
            "follow_redirects": follow_redirects,
        }
    )
    return Spec("HTTP", config, dict(options))


@overload
def transform(output: Template, *, returns: None = None, **options: "Unpack[ItemOptions]") -> Spec[Any]: ...
@overload
def transform(output: Template, *, returns: "type[T]", **options: "Unpack[ItemOptions]") -> Spec[T]: ...
def transform(
    output: Template, *, returns: "Optional[type[Any]]" = None, **options: "Unpack[ItemOptions]"
) -> Spec[Any]:
    """A data mapping the coordinator evaluates: its output is ``output``
    (typed ``returns``, when given, for the steps that read it)."""
    return Spec("TRANSFORM", {"output": output}, dict(options))


def wait(
    duration: Optional[Duration] = None, *, until: Optional[Template] = None, **options: "Unpack[ItemOptions]"
) -> Spec[Any]:
    """A timer: ``duration``, or ``until`` a time (RFC 3339 or Unix seconds)."""
    if (duration is None) == (until is None):
        raise ValueError("a WAIT takes a duration or an until, one of them")
    return Spec("WAIT", _drop_none({"duration": duration, "until": until}), dict(options))


def wait_for_event(
    event: str,
    key: Template,
    *,
    timeout: Optional[Duration] = None,
    default_output: Optional[Template] = None,
    updates: Optional[Sequence[Mapping[str, Any]]] = None,
) -> Spec[Any]:
    """Waits for the event ``(event, key)``; ``timeout`` is how long (for
    ever without it), ``default_output`` the output when it times out (the
    config's ``timeout``: such a node has no attempts to time); ``updates``
    the updates it accepts while it waits (``Client.update_run``)."""
    config = _drop_none({"event": event, "key": key, "default_output": default_output})
    if timeout is not None:
        config["timeout"] = duration(timeout)
    options: dict[str, Any] = {} if updates is None else {"updates": updates}
    return Spec("WAIT_FOR_EVENT", config, options)


def map_(
    items: Template,
    node: "Spec[Any]",
    *,
    max_concurrency: Optional[int] = None,
    on_item_failure: Optional[Literal["fail", "continue"]] = None,
    tolerated_failures: Optional[Union[int, str]] = None,
    collect: Optional[Union[Literal["all", "none"], Mapping[str, Any]]] = None,
    **options: "Unpack[ItemOptions]",
) -> Spec[Any]:
    """Runs ``node`` once per item of ``items`` (``.item`` and ``.index``
    bound); ``collect`` is ``all``, ``none`` or ``{"init", "reduce"}``."""
    config = _drop_none(
        {
            "items": items,
            "node": node,
            "max_concurrency": max_concurrency,
            "on_item_failure": on_item_failure,
            "tolerated_failures": tolerated_failures,
            "collect": collect,
        }
    )
    return Spec("MAP", config, dict(options))


def sub_workflow(
    workflow: str,
    *,
    input: Optional[Template] = None,
    version: Optional[int] = None,
    on_parent_close: Optional[Literal["cancel", "abandon"]] = None,
    **options: "Unpack[ItemOptions]",
) -> Spec[Any]:
    """A child run of ``workflow``; its output is the node's."""
    config = _drop_none({"workflow": workflow, "input": input, "version": version, "on_parent_close": on_parent_close})
    return Spec("SUB_WORKFLOW", config, dict(options))


def loop(
    workflow: str,
    *,
    until: Jq,
    max_iterations: int,
    input: Optional[Template] = None,
    delay: Optional[Duration] = None,
    version: Optional[int] = None,
    on_parent_close: Optional[Literal["cancel", "abandon"]] = None,
    **options: "Unpack[ItemOptions]",
) -> Spec[Any]:
    """A child run of ``workflow`` per iteration until ``until`` (jq over
    ``{input, iteration: {index, output}}``) holds, at most ``max_iterations``."""
    config = _drop_none(
        {
            "workflow": workflow,
            "input": input,
            "until": _jq(until),
            "max_iterations": max_iterations,
            "delay": None if delay is None else duration(delay),
            "version": version,
            "on_parent_close": on_parent_close,
        }
    )
    return Spec("LOOP", config, dict(options))


def fail(
    message: Optional[Template] = None, *, code: Optional[str] = None, **options: "Unpack[ItemOptions]"
) -> Spec[Any]:
    """Fails the run with ``message`` (and the node's error ``code``)."""
    config = _drop_none({"message": message, "code": code})
    return Spec("FAIL", config, dict(options))
