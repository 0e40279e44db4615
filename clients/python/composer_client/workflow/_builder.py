"""``Workflow``: a definition declared in Python, typed steps included."""

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Generic, Optional, TypedDict, TypeVar, Union, get_type_hints, overload

from ..client import Client
from ..types import Registered
from ..worker import Handler, Task, TaskError
from ._json import from_json, json_schema, to_json
from ._nodes import (
    Concurrency,
    Duration,
    ItemOptions,
    Jq,
    OnFailure,
    Spec,
    Template,
    Trigger,
    check_name,
    map_,
)
from ._refs import After, Node, Ref, duration, item, reads, render

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["NodeOptions", "StepOptions", "Workflow", "WorkflowOptions", "handler_for", "step"]

I = TypeVar("I")  # noqa: E741 - the input's type
T = TypeVar("T")
R = TypeVar("R")
A1 = TypeVar("A1")
A2 = TypeVar("A2")
A3 = TypeVar("A3")
A4 = TypeVar("A4")
A5 = TypeVar("A5")
A6 = TypeVar("A6")
F = TypeVar("F", bound=Callable[..., Any])

AfterArg = Union["Node[Any]", After, str, Sequence[Union["Node[Any]", After, str]]]
"""What ``after=`` takes: a node (or its id), an ``After`` edge, or a list of them."""


class NodeOptions(ItemOptions, total=False):
    """A node's options, and ``after``: the edges into it beyond those its reads make."""

    after: AfterArg


class StepOptions(NodeOptions, total=False):
    """A typed step's options: its ``id`` (the function's name by default)
    and ``type`` (the ``@step`` decorator's, else the function's name)."""

    id: str
    type: str


class WorkflowOptions(TypedDict, total=False):
    """A definition's fields besides ``name`` and ``nodes`` (each settable
    later as the attribute of that name, e.g. ``wf.output = {...}``)."""

    description: str
    timeout: Duration
    output: Template
    concurrency: Union[int, Concurrency, Mapping[str, Any]]
    on_failure: Union[str, OnFailure, Mapping[str, Any]]
    on_success: Union[str, Mapping[str, Any]]
    on_end: Union[str, Mapping[str, Any]]
    deadlines: Sequence[Mapping[str, Any]]
    tags: Mapping[str, Template]
    triggers: Sequence[Union[Trigger, Mapping[str, Any]]]
    priority: int
    fairness_key: Template
    input_schema: Union[Mapping[str, Any], bool]


_STEP = "__composer_step__"


def step(
    *,
    type: Optional[str] = None,
    **options: "Unpack[ItemOptions]",
) -> Callable[[F], F]:
    """Declares a function's node defaults: its ``type`` (the function's
    name by default) and options (``queue``, ``retry``, ``timeout``,
    ``delivery``, ``limits``), which every ``wf.step(fn, …)`` of it takes
    unless it says otherwise. The function is returned as it is."""
    if type is not None:
        check_name("a step's type", type)

    def mark(fn: F) -> F:
        setattr(fn, _STEP, {"type": type, **options})
        return fn

    return mark


def _defaults(fn: Callable[..., Any]) -> dict[str, Any]:
    return dict(getattr(fn, _STEP, {}))


def _fn_name(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or name == "<lambda>":
        raise ValueError("a step's function needs a name: pass id= and type=")
    return name


def handler_for(fn: Callable[..., Any]) -> Handler:
    """A worker handler running ``fn``: the task's input (an object keyed by
    ``fn``'s parameter names) read into each parameter's annotated type,
    the return value written back as JSON. An input that does not fit
    fails the step for good (``TaskError`` code ``bad_input``)."""
    signature = inspect.signature(fn)
    hints = get_type_hints(fn)

    def handle(task: Task) -> Any:
        given = task.input if task.input is not None else {}
        if not isinstance(given, dict):
            kind = type(given).__name__
            raise TaskError(f"the step's input is not an object: {kind}", retryable=False, code="bad_input")
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for name, param in signature.parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            if name not in given:
                if param.default is param.empty:
                    raise TaskError(f"the step's input has no {name!r}", retryable=False, code="bad_input")
                continue
            try:
                value = from_json(hints.get(name, Any), given[name], name)
            except (ValueError, TypeError) as e:
                raise TaskError(f"input {e}", retryable=False, code="bad_input") from e
            if param.kind is param.POSITIONAL_ONLY:
                args.append(value)
            else:
                kwargs[name] = value
        return to_json(fn(*args, **kwargs))

    handle.__name__ = f"handle_{getattr(fn, '__name__', 'step')}"
    handle.__qualname__ = handle.__name__
    return handle


def _params(fn: Callable[..., Any], count: int) -> list[str]:
    names = [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if count > len(names):
        raise TypeError(f"{_fn_name(fn)} takes {len(names)} arguments, {count} refs given")
    return names[:count]


@dataclass
class _Decl:
    id: str
    spec: Spec[Any]
    fn: Optional[Callable[..., Any]] = None
    """The function a typed step (or a MAP step's item) runs."""


@dataclass
class _Edge:
    src: str
    dst: str
    on: Optional[str] = None
    when: Optional[str] = None
    seq: int = 0


@dataclass
class StepInfo:
    """A typed step: its node, type, queue (``None``: its type in lower
    case) and function."""

    node: str
    type: str
    queue: Optional[str]
    fn: Callable[..., Any] = field(repr=False)


class Workflow(Generic[I]):
    """A workflow definition built in code: ``definition()`` is the JSON
    the server takes (``POST /v1/workflows``).

    ``input`` is the type of the run's input (a dataclass, a TypedDict, a
    pydantic model …): ``wf.input`` is a ``Ref`` of that type, and the
    definition's ``input_schema`` is made from it (``input_schema=`` gives
    one instead; ``False`` leaves it out).

    Nodes: ``wf.add(id, spec)`` with a spec of any kind (``http``,
    ``transform``, ``wait``, ``wait_for_event``, ``map_``, ``loop``,
    ``sub_workflow``, ``fail``, ``custom``), and typed steps
    ``wf.step(fn, *refs)`` / ``wf.map_step(fn, items)`` run by this
    process's worker (``wf.handlers()``).

    Edges: a node that reads another's output (a ``Ref`` in its config, or
    ``${ .nodes.X.output }`` in its text) gets an edge from it, unless that
    node is upstream of it already; ``after=`` adds edges (``charge``,
    ``charge.on_failure()``, ``start.when(".nodes.start.output.big")``),
    and so does ``wf.edge(src, dst)``.
    """

    @overload
    def __init__(
        self: "Workflow[Any]", name: str, *, input: None = None, **options: "Unpack[WorkflowOptions]"
    ) -> None: ...
    @overload
    def __init__(self, name: str, *, input: "type[I]", **options: "Unpack[WorkflowOptions]") -> None: ...
    def __init__(self, name: str, *, input: "Optional[type[Any]]" = None, **options: "Unpack[WorkflowOptions]") -> None:
        self.name = check_name("a workflow's name", name)
        self.input_type = input
        self.description: Optional[str] = options.get("description")
        self.timeout: Optional[Duration] = options.get("timeout")
        self.output: Optional[Template] = options.get("output")
        self.concurrency: Optional[Union[int, Concurrency, Mapping[str, Any]]] = options.get("concurrency")
        self.on_failure: Optional[Union[str, OnFailure, Mapping[str, Any]]] = options.get("on_failure")
        self.on_success: Optional[Union[str, Mapping[str, Any]]] = options.get("on_success")
        self.on_end: Optional[Union[str, Mapping[str, Any]]] = options.get("on_end")
        self.deadlines: Optional[Sequence[Mapping[str, Any]]] = options.get("deadlines")
        self.tags: Optional[Mapping[str, Template]] = options.get("tags")
        self.triggers: Optional[Sequence[Union[Trigger, Mapping[str, Any]]]] = options.get("triggers")
        self.priority: Optional[int] = options.get("priority")
        self.fairness_key: Optional[Template] = options.get("fairness_key")
        self.input_schema: Optional[Union[Mapping[str, Any], bool]] = options.get("input_schema")
        unknown = set(options) - set(WorkflowOptions.__annotations__)
        if unknown:
            raise TypeError(f"Workflow() has no option {sorted(unknown)[0]!r}")
        self._nodes: list[_Decl] = []
        self._ids: dict[str, int] = {}
        self._edges: list[_Edge] = []

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, nodes={list(self._ids)!r})"

    @property
    def input(self) -> Ref[I]:
        """The run's input (``${ .input }``), of the workflow's input type."""
        return Ref(".input")

    # -- nodes -------------------------------------------------------------

    def add(self, id: str, spec: Spec[T], *, after: Optional[AfterArg] = None) -> Node[T]:
        """Adds the node ``id`` made of ``spec`` (``http(...)``,
        ``transform(...)``, …), with edges from what it reads and from
        ``after``; returns the node, which is also its output's ``Ref``."""
        return self._add(id, spec, after)

    def _add(
        self, id: str, spec: Spec[Any], after: Optional[AfterArg], fn: Optional[Callable[..., Any]] = None
    ) -> Node[Any]:
        check_name("a node's id", id)
        if id in self._ids:
            raise ValueError(f"the workflow {self.name!r} has a node {id!r} already (give the step another id=)")
        self._ids[id] = len(self._nodes)
        self._nodes.append(_Decl(id, spec, fn))
        for edge in _afters(after):
            self.edge(edge.source, id, on=edge.on, when=edge.condition())
        return Node(id)

    def edge(
        self,
        src: Union[Node[Any], str],
        dst: Union[Node[Any], str],
        *,
        on: Optional[str] = None,
        when: Optional[Jq] = None,
    ) -> None:
        """An edge ``src`` -> ``dst`` (``on``: ``success``, ``failure`` or
        ``always``, left out when ``None``; ``when``: a jq condition)."""
        checked = After(src, on, when)
        self._edges.append(
            _Edge(checked.source, dst if isinstance(dst, str) else dst.id, on, checked.condition(), len(self._edges))
        )

    def _step_spec(
        self, fn: Callable[..., Any], config: Optional[dict[str, Any]], options: Mapping[str, Any]
    ) -> tuple[str, Spec[Any]]:
        merged = {k: v for k, v in _defaults(fn).items() if v is not None}
        merged.update({k: v for k, v in options.items() if v is not None})
        node_type = merged.pop("type", None) or _fn_name(fn)
        node_id = merged.pop("id", None) or _fn_name(fn)
        merged.pop("after", None)
        return node_id, Spec(check_name("a step's type", node_type), config, merged)

    @overload
    def step(self, fn: Callable[[], R], /, **options: "Unpack[StepOptions]") -> Node[R]: ...
    @overload
    def step(self, fn: Callable[[A1], R], a1: Ref[A1], /, **options: "Unpack[StepOptions]") -> Node[R]: ...
    @overload
    def step(
        self, fn: Callable[[A1, A2], R], a1: Ref[A1], a2: Ref[A2], /, **options: "Unpack[StepOptions]"
    ) -> Node[R]: ...
    @overload
    def step(
        self, fn: Callable[[A1, A2, A3], R], a1: Ref[A1], a2: Ref[A2], a3: Ref[A3], /, **options: "Unpack[StepOptions]"
    ) -> Node[R]: ...
    @overload
    def step(
        self,
        fn: Callable[[A1, A2, A3, A4], R],
        a1: Ref[A1],
        a2: Ref[A2],
        a3: Ref[A3],
        a4: Ref[A4],
        /,
        **options: "Unpack[StepOptions]",
    ) -> Node[R]: ...
    @overload
    def step(
        self,
        fn: Callable[[A1, A2, A3, A4, A5], R],
        a1: Ref[A1],
        a2: Ref[A2],
        a3: Ref[A3],
        a4: Ref[A4],
        a5: Ref[A5],
        /,
        **options: "Unpack[StepOptions]",
    ) -> Node[R]: ...
    @overload
    def step(
        self,
        fn: Callable[[A1, A2, A3, A4, A5, A6], R],
        a1: Ref[A1],
        a2: Ref[A2],
        a3: Ref[A3],
        a4: Ref[A4],
        a5: Ref[A5],
        a6: Ref[A6],
        /,
        **options: "Unpack[StepOptions]",
    ) -> Node[R]: ...
    def step(self, fn: Callable[..., Any], /, *refs: Ref[Any], **options: "Unpack[StepOptions]") -> Node[Any]:
        """A typed step: a node running ``fn`` on this process's worker,
        whose arguments are ``refs`` (the workflow's input, other steps'
        outputs …) — mypy checks each ``Ref[A]`` against ``fn``'s parameter.
        The node's config is ``{<parameter name>: ${ <ref> }}``; its type
        and id are ``fn``'s name unless ``type=``/``id=`` (or ``@step``)
        say otherwise. Returns the node: a ``Ref`` of ``fn``'s return type."""
        for r in refs:
            if not isinstance(r, Ref):
                raise TypeError(f"a step's arguments are Refs (wf.input, a node …), got {type(r).__name__}")
        config = dict(zip(_params(fn, len(refs)), refs)) if refs else None
        node_id, spec = self._step_spec(fn, config, options)
        return self._add(node_id, spec, options.get("after"), fn)

    def map_step(
        self,
        fn: Callable[[A1], R],
        items: "Ref[Sequence[A1]]",
        /,
        *,
        max_concurrency: Optional[int] = None,
        tolerated_failures: Optional[Union[int, str]] = None,
        **options: "Unpack[StepOptions]",
    ) -> "Node[list[R]]":
        """A MAP whose item node runs ``fn`` on each item of ``items`` (a
        ``Ref`` of a list of ``fn``'s parameter type); its output is the
        list of ``fn``'s results. The options but ``id`` and ``after`` are
        the item node's."""
        (param,) = _params(fn, 1)
        item_id, spec = self._step_spec(fn, {param: item}, options)
        node_id = options.get("id") or item_id
        mapped = map_(items, spec, max_concurrency=max_concurrency, tolerated_failures=tolerated_failures)
        return self._add(node_id, mapped, options.get("after"), fn)

    # -- the definition ------------------------------------------------------

    def steps(self) -> list[StepInfo]:
        """The typed steps (``step`` and ``map_step``), in declaration order."""
        out = []
        for decl in self._nodes:
            if decl.fn is None:
                continue
            spec = decl.spec
            if spec.type == "MAP" and isinstance(spec.config, dict):
                spec = spec.config["node"]
            out.append(StepInfo(decl.id, spec.type, spec.options.get("queue"), decl.fn))
        return out

    def handlers(self) -> dict[str, Handler]:
        """The worker handlers of the typed steps, by node type
        (``Worker.handle(type, handler)`` each)."""
        out: dict[str, Handler] = {}
        fns: dict[str, Callable[..., Any]] = {}
        for s in self.steps():
            known = fns.get(s.type)
            if known is not None and known is not s.fn:
                raise ValueError(f"the type {s.type!r} is run by two functions ({_fn_name(known)}, {_fn_name(s.fn)})")
            fns[s.type] = s.fn
            out[s.type] = handler_for(s.fn)
        return out

    def definition(self) -> dict[str, Any]:
        """The definition as JSON (what ``POST /v1/workflows`` takes)."""
        if not self._nodes:
            raise ValueError(f"the workflow {self.name!r} has no nodes")
        out: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            out["description"] = self.description
        schema = self._schema()
        if schema is not None:
            out["input_schema"] = schema
        if self.timeout is not None:
            out["timeout"] = duration(self.timeout)
        if self.concurrency is not None:
            c = self.concurrency
            out["concurrency"] = {"max": c} if isinstance(c, int) else render(c)
        if self.priority is not None:
            out["priority"] = self.priority
        if self.fairness_key is not None:
            out["fairness_key"] = render(self.fairness_key)
        if self.tags is not None:
            out["tags"] = render(self.tags)
        if self.triggers is not None:
            out["triggers"] = [render(t) for t in self.triggers]
        if self.deadlines is not None:
            out["deadlines"] = [render(d) for d in self.deadlines]
        for hook in ("on_failure", "on_success", "on_end"):
            f = getattr(self, hook)
            if f is not None:
                out[hook] = {"workflow": f} if isinstance(f, str) else render(f)
        nodes = []
        for decl in self._nodes:
            node = {"id": decl.id, **decl.spec.to_json()}
            nodes.append(node)
        out["nodes"] = nodes
        edges = self._all_edges(nodes)
        if edges:
            out["edges"] = [_edge_json(e) for e in edges]
        if self.output is not None:
            out["output"] = render(self.output)
        return out

    def _schema(self) -> Optional[Mapping[str, Any]]:
        if self.input_schema is False:
            return None
        if isinstance(self.input_schema, Mapping):
            return dict(self.input_schema)
        if self.input_type is None:
            return None
        schema: dict[str, Any] = json_schema(self.input_type)
        return schema

    def _all_edges(self, nodes: list[dict[str, Any]]) -> list[_Edge]:
        for e in self._edges:
            for end in (e.src, e.dst):
                if end not in self._ids:
                    raise ValueError(f"an edge {e.src} -> {e.dst} names no node {end!r} of {self.name!r}")
        preds: dict[str, set[str]] = {}
        for e in self._edges:
            preds.setdefault(e.dst, set()).add(e.src)

        def upstream(node: str) -> set[str]:
            seen: set[str] = set()
            todo = list(preds.get(node, ()))
            while todo:
                n = todo.pop()
                if n not in seen:
                    seen.add(n)
                    todo.extend(preds.get(n, ()))
            return seen

        derived: list[_Edge] = []
        for node in nodes:
            me = node["id"]
            read = [r for r in reads(node.get("config")) if r != me]
            for r in read:
                if r not in self._ids:
                    raise ValueError(f"the node {me!r} of {self.name!r} reads .nodes.{r}, which is no node of it")
            # The latest declared first: an earlier node it reads is then often upstream already.
            for r in sorted(read, key=lambda n: -self._ids[n]):
                if r in upstream(me):
                    continue
                preds.setdefault(me, set()).add(r)
                derived.append(_Edge(r, me, seq=len(self._edges) + len(derived)))
        every = self._edges + derived
        return sorted(every, key=lambda e: (self._ids[e.src], self._ids[e.dst], e.seq))

    # -- the server ----------------------------------------------------------

    def register(self, client: Client, version: Optional[int] = None) -> Registered:
        """Registers the definition: the version of the same content when one
        is registered (``created`` false), else a new one (``version``: the
        number it must be, a ``Conflict`` otherwise)."""
        return client.register_workflow(self.definition(), version=version)


def _afters(after: Optional[AfterArg]) -> list[After]:
    if after is None:
        return []
    many = after if isinstance(after, Sequence) and not isinstance(after, str) else [after]
    out = []
    for a in many:
        if isinstance(a, After):
            out.append(a)
        elif isinstance(a, (Node, str)):
            out.append(After(a))
        else:
            raise TypeError(f"after= takes nodes, their ids or edges (node.on_failure() …), got {type(a).__name__}")
    return out


def _edge_json(e: _Edge) -> dict[str, Any]:
    out: dict[str, Any] = {"from": e.src, "to": e.dst}
    if e.on is not None:
        out["on"] = e.on
    if e.when is not None:
        out["when"] = e.when
    return out
