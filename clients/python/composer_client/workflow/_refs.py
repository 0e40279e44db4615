"""References to values of a run (``${ .input }``, ``${ .nodes.charge.output }``)
and how a definition's values are written out as templates."""

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, Optional, TypeVar, Union, cast

__all__ = ["After", "Node", "Ref", "expr", "index", "item", "iteration", "previous", "run_id", "secret"]

T_co = TypeVar("T_co", covariant=True)
U = TypeVar("U")

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _segment(key: Union[str, int]) -> str:
    """One step of a jq path: ``.name``, ``["a-b"]`` or ``[2]``."""
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise TypeError(f"a path step is a str or an int, got {type(key).__name__}")
    if isinstance(key, int):
        return f"[{key}]"
    if _IDENT.fullmatch(key):
        return f".{key}"
    escaped = key.replace("\\", "\\\\").replace('"', '\\"')
    return f'["{escaped}"]'


class Ref(Generic[T_co]):
    """A value a run will have, typed ``T_co``: the run's input, a node's
    output, a part of one. In a node's config or the workflow's output it
    is written as the template ``${ <path> }`` (a whole string keeps the
    value's JSON type); ``str(ref)`` and f-strings give that template, and
    ``ref.jq`` the bare path (for ``when`` conditions).

    ``ref["body"]["id"]`` is a part (typed ``Any``: ``.cast(T)`` types it).
    """

    __slots__ = ("_node", "_path")

    def __init__(self, path: str, node: Optional[str] = None) -> None:
        self._path = path
        self._node = node

    @property
    def jq(self) -> str:
        """The bare jq path (``.nodes.charge.output.body.id``)."""
        return self._path

    @property
    def node_id(self) -> Optional[str]:
        """The node whose output this reads, ``None`` for anything else."""
        return self._node

    def __getitem__(self, key: Union[str, int]) -> "Ref[Any]":
        return Ref(self._path + _segment(key), self._node)

    def cast(self, tp: "type[U]") -> "Ref[U]":
        """The same reference, typed ``U`` (no check: it says what the value is)."""
        return cast("Ref[U]", Ref(self._path, self._node))

    def __str__(self) -> str:
        return "${ " + self._path + " }"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __repr__(self) -> str:
        return f"Ref({self._path!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ref) and other._path == self._path

    def __hash__(self) -> int:
        return hash(self._path)


class Node(Ref[T_co]):
    """A node of a workflow, and the reference to its output (``${
    .nodes.<id>.output }``), typed ``T_co``. ``error`` and ``state`` read
    what a failure edge or a join tests; ``on_failure()`` and friends make
    the edges other nodes take from it (``after=``)."""

    __slots__ = ("id",)

    def __init__(self, node_id: str) -> None:
        super().__init__(f".nodes{_segment(node_id)}.output", node_id)
        self.id = node_id

    @property
    def output(self) -> "Ref[T_co]":
        """The node's output (the node itself is that reference too)."""
        return self

    @property
    def error(self) -> Ref[Any]:
        """``.nodes.<id>.error``: ``{message, code, retryable, attempts, status?}`` once it FAILED."""
        return Ref(f".nodes{_segment(self.id)}.error")

    @property
    def state(self) -> Ref[str]:
        """``.nodes.<id>.state`` (``COMPLETED``, ``FAILED``, ``SKIPPED`` …)."""
        return Ref(f".nodes{_segment(self.id)}.state")

    def edge(self, on: Optional[str] = None, when: "Optional[Union[str, Ref[Any]]]" = None) -> "After":
        """An edge from this node for ``after=``: ``on`` is ``success`` (the
        default, left out), ``failure`` or ``always``; ``when`` a jq condition."""
        return After(self, on, when)

    def on_success(self, when: "Optional[Union[str, Ref[Any]]]" = None) -> "After":
        """An edge taken when this node COMPLETED, written with ``"on": "success"``."""
        return After(self, "success", when)

    def on_failure(self, when: "Optional[Union[str, Ref[Any]]]" = None) -> "After":
        """An edge taken when this node FAILED for good (``"on": "failure"``)."""
        return After(self, "failure", when)

    def always(self, when: "Optional[Union[str, Ref[Any]]]" = None) -> "After":
        """An edge taken whichever way this node ended (``"on": "always"``)."""
        return After(self, "always", when)

    def when(self, condition: "Union[str, Ref[Any]]") -> "After":
        """An edge on success taken when the jq ``condition`` holds."""
        return After(self, None, condition)

    def __repr__(self) -> str:
        return f"Node({self.id!r})"


_EDGE_ON = ("success", "failure", "always")


@dataclass(frozen=True)
class After:
    """An edge into the node being declared: from ``node``, following its
    ``on`` (``success``, ``failure``, ``always``; left out when ``None``),
    taken when ``when`` (jq, or a ``Ref`` whose path is tested) holds."""

    node: "Union[Node[Any], str]"
    on: Optional[str] = None
    when: "Optional[Union[str, Ref[Any]]]" = None

    def __post_init__(self) -> None:
        if self.on is not None and self.on not in _EDGE_ON:
            raise ValueError(f"an edge's on is one of {', '.join(_EDGE_ON)}, got {self.on!r}")

    @property
    def source(self) -> str:
        return self.node if isinstance(self.node, str) else self.node.id

    def condition(self) -> Optional[str]:
        return self.when.jq if isinstance(self.when, Ref) else self.when


def expr(jq: str) -> Ref[Any]:
    """Any jq expression as a value: ``expr('.input.items // []')`` is the
    template ``${ .input.items // [] }``."""
    return Ref(jq)


item: Ref[Any] = Ref(".item")
"""A MAP's item, in its node (``${ .item }``)."""
index: Ref[int] = Ref(".index")
"""A MAP item's index (``${ .index }``)."""
iteration: Ref[Any] = Ref(".iteration")
"""A LOOP's iteration (``.iteration.index``, and ``.iteration.output`` in ``until``)."""
previous: Ref[Any] = Ref(".previous")
"""A LOOP iteration's previous output (``${ .previous }``)."""
run_id: Ref[str] = Ref(".run.id")
"""The run's id (``${ .run.id }``)."""


def secret(name: str) -> Ref[str]:
    """``${ .secrets.NAME }``: resolved by the worker from ``COMPOSER_SECRET_NAME``."""
    return Ref(".secrets" + _segment(name))


_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1))


def duration(value: "Union[str, timedelta]") -> str:
    """A duration as the language writes it: text as it is (``"1h30m"``), a
    ``timedelta`` as its whole units (``timedelta(minutes=90)`` -> ``"1h30m"``)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, timedelta):
        raise TypeError(f"a duration is text ('30s') or a timedelta, got {type(value).__name__}")
    ms = value // timedelta(milliseconds=1)
    if ms <= 0 or value % timedelta(milliseconds=1):
        raise ValueError(f"a duration is whole milliseconds, more than none: {value!r}")
    parts = []
    for unit, size in _UNITS:
        if ms >= size:
            parts.append(f"{ms // size}{unit}")
            ms %= size
    return "".join(parts)


def render(value: Any) -> Any:
    """A JSON value from what a definition holds: each ``Ref`` as its
    template, tuples as lists, ``timedelta``s as durations, nested mappings
    and lists walked; anything else as it is (it must be JSON)."""
    if isinstance(value, Ref):
        return str(value)
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"a JSON object's key is text, got {k!r}")
            out[k] = render(v)
        return out
    if isinstance(value, (list, tuple)):
        return [render(v) for v in value]
    if isinstance(value, timedelta):
        return duration(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    to_json = getattr(value, "to_json", None)
    if callable(to_json):
        return render(to_json())
    raise TypeError(f"not a JSON value: {type(value).__name__}")


_READ = re.compile(r"""\.nodes(?:\.([A-Za-z_][A-Za-z0-9_]*)|\["((?:[^"\\]|\\.)*)"\])\s*(?:\.output\b|\["output"\])""")


def reads(value: Any) -> list[str]:
    """The nodes whose outputs a rendered value's expressions read, in
    order of first appearance (``.nodes.X.output`` in a string holding
    ``${``; errors and states are not counted)."""
    found: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, str):
            if "${" in v:
                for m in _READ.finditer(v):
                    name = m.group(1) if m.group(1) is not None else re.sub(r"\\(.)", r"\1", m.group(2))
                    if name not in found:
                        found.append(name)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(value)
    return found
