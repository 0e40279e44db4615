"""Python types and JSON: a JSON Schema (2020-12) of a type, a JSON value
into a typed Python value, and back.

Types understood: ``str``, ``int``, ``float``, ``bool``, ``None``, ``Any``,
``list[T]``/``Sequence[T]``, ``tuple[...]``, ``dict[str, T]``/``Mapping``,
``Optional``/``Union`` (and ``X | Y``), ``Literal``, ``Enum``s, dataclasses,
``TypedDict``s, ``datetime``/``date``/``UUID`` (as text), and pydantic models
(anything with ``model_json_schema``/``model_validate``/``model_dump``:
pydantic itself is never imported).
"""

import collections.abc
import dataclasses
import enum
import math
import sys
import types
import typing
import uuid
from datetime import date, datetime
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

__all__ = ["from_json", "json_schema", "to_json"]

JSON = Any

_UnionType = getattr(types, "UnionType", None)  # X | Y, from Python 3.10


def _is_union(origin: Any) -> bool:
    return origin is Union or (_UnionType is not None and origin is _UnionType)


def _is_pydantic(tp: Any) -> bool:
    return isinstance(tp, type) and callable(getattr(tp, "model_json_schema", None))


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__total__") and hasattr(tp, "__annotations__")


def _hints(tp: Any) -> dict[str, Any]:
    """A class's field types, forward references nested in builtin generics
    (``list["Tree"]``, left as text by Python 3.9's ``get_type_hints``) resolved."""
    module = sys.modules.get(getattr(tp, "__module__", ""), None)
    namespace = {**vars(module), tp.__name__: tp} if module is not None else {tp.__name__: tp}
    return {k: _resolve(v, namespace) for k, v in get_type_hints(tp, namespace).items()}


def _resolve(hint: Any, namespace: dict[str, Any]) -> Any:
    if isinstance(hint, str):
        return _resolve(eval(hint, namespace), namespace)  # an annotation, as get_type_hints does
    if isinstance(hint, typing.ForwardRef):
        return _resolve(hint.__forward_arg__, namespace)
    args = get_args(hint)
    if not args or get_origin(hint) is Literal:
        return hint
    resolved = tuple(_resolve(a, namespace) for a in args)
    if resolved == args:
        return hint
    if isinstance(hint, types.GenericAlias):
        return types.GenericAlias(get_origin(hint), resolved)
    copy_with = getattr(hint, "copy_with", None)
    return copy_with(resolved) if callable(copy_with) else hint


_SEQUENCES = (list, collections.abc.Sequence, collections.abc.MutableSequence, collections.abc.Iterable, set, frozenset)
_MAPPINGS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)


class _Schemas:
    """Builds one schema; named types (dataclasses, TypedDicts, enums,
    pydantic models) nested in it go to ``$defs``."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.defs: dict[str, JSON] = {}
        self.names: dict[Any, str] = {}

    def top(self) -> JSON:
        if _is_pydantic(self.root):
            return dict(self.root.model_json_schema())
        schema = self.inline(self.root)
        if self.defs:
            schema["$defs"] = self.defs
        return schema

    def ref(self, tp: Any) -> JSON:
        if tp is self.root:
            return {"$ref": "#"}
        name = self.names.get(tp)
        if name is None:
            name = tp.__name__
            n = 2
            while name in self.defs:
                name = f"{tp.__name__}{n}"
                n += 1
            self.names[tp] = name
            self.defs[name] = {}  # reserved: a recursive type refers to itself
            if _is_pydantic(tp):
                schema = dict(tp.model_json_schema())
                for k, v in schema.pop("$defs", {}).items():
                    self.defs.setdefault(k, v)
                self.defs[name] = schema
            else:
                self.defs[name] = self.inline(tp)
        return {"$ref": f"#/$defs/{name}"}

    def of(self, tp: Any) -> JSON:
        """The schema of a type in a field: named types by reference."""
        if dataclasses.is_dataclass(tp) or _is_typeddict(tp) or _is_pydantic(tp):
            return self.ref(tp)
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return self.ref(tp)
        return self.inline(tp)

    def inline(self, tp: Any) -> JSON:
        if tp is Any or tp is object:
            return {}
        if tp is None or tp is type(None):
            return {"type": "null"}
        if tp is bool:
            return {"type": "boolean"}
        if tp is int:
            return {"type": "integer"}
        if tp is float:
            return {"type": "number"}
        if tp is str:
            return {"type": "string"}
        if tp is datetime:
            return {"type": "string", "format": "date-time"}
        if tp is date:
            return {"type": "string", "format": "date"}
        if tp is uuid.UUID:
            return {"type": "string", "format": "uuid"}
        origin = get_origin(tp)
        args = get_args(tp)
        if origin is Literal:
            values = [a.value if isinstance(a, enum.Enum) else a for a in args]
            return {"const": values[0]} if len(values) == 1 else {"enum": values}
        if _is_union(origin):
            members = [self.of(a) for a in args]
            simple = [m for m in members if set(m) == {"type"} and isinstance(m["type"], str)]
            if len(simple) == len(members):
                return {"type": [m["type"] for m in simple]}
            return {"anyOf": members}
        if origin is tuple:
            if len(args) == 2 and args[1] is Ellipsis:
                return {"type": "array", "items": self.of(args[0])}
            if args == ((),) or not args:
                return {"type": "array", "maxItems": 0} if args else {"type": "array"}
            return {
                "type": "array",
                "prefixItems": [self.of(a) for a in args],
                "items": False,
                "minItems": len(args),
            }
        if origin in _SEQUENCES or tp in (list, set, frozenset):
            schema: JSON = {"type": "array"}
            if args:
                schema["items"] = self.of(args[0])
            if origin in (set, frozenset):
                schema["uniqueItems"] = True
            return schema
        if origin in _MAPPINGS or tp is dict:
            schema = {"type": "object"}
            if len(args) == 2:
                if args[0] is not str:
                    raise TypeError(f"a JSON object's keys are text: {tp!r}")
                schema["additionalProperties"] = self.of(args[1])
            return schema
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return {"enum": [m.value for m in tp]}
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            hints = _hints(tp)
            props: dict[str, JSON] = {}
            required = []
            for f in dataclasses.fields(tp):
                if not f.init:
                    continue
                props[f.name] = self.of(hints[f.name])
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    required.append(f.name)
            out: JSON = {"type": "object", "properties": props}
            if required:
                out["required"] = required
            out["additionalProperties"] = False
            return out
        if _is_typeddict(tp):
            hints = _hints(tp)
            req = getattr(tp, "__required_keys__", frozenset(hints) if tp.__total__ else frozenset())
            out = {"type": "object", "properties": {k: self.of(v) for k, v in hints.items()}}
            required = [k for k in hints if k in req]
            if required:
                out["required"] = required
            return out
        if _is_pydantic(tp):
            return self.ref(tp)
        raise TypeError(f"no JSON Schema for the type {tp!r}")


def json_schema(tp: Any) -> JSON:
    """The JSON Schema (2020-12) of values of ``tp``: a pydantic model's
    own (``model_json_schema()``), else made from the type (dataclasses'
    fields without a default are required and no others are allowed;
    nested named types are ``$defs`` referred to with ``$ref``)."""
    return _Schemas(tp).top()


def _where(path: str) -> str:
    return path or "the value"


def from_json(tp: Any, value: JSON, path: str = "") -> Any:
    """``value`` (JSON) as a ``tp``: dataclasses and pydantic models built,
    enums looked up, numbers checked; a ``ValueError`` naming the path
    (``.items[0].sku``) when it does not fit."""
    if tp is Any or tp is object:
        return value
    if tp is None or tp is type(None):
        if value is not None:
            raise ValueError(f"{_where(path)}: expected null, got {_kind(value)}")
        return None
    if _is_pydantic(tp):
        return tp.model_validate(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{_where(path)}: expected a boolean, got {_kind(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise ValueError(f"{_where(path)}: expected an integer, got {_kind(value)}")
        return int(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{_where(path)}: expected a number, got {_kind(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{_where(path)}: expected text, got {_kind(value)}")
        return value
    if tp in (datetime, date, uuid.UUID):
        if not isinstance(value, str):
            raise ValueError(f"{_where(path)}: expected text ({tp.__name__}), got {_kind(value)}")
        try:
            if tp is uuid.UUID:
                return uuid.UUID(value)
            text = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
            return tp.fromisoformat(text)
        except ValueError as e:
            raise ValueError(f"{_where(path)}: not a {tp.__name__}: {value!r}") from e
    origin = get_origin(tp)
    args = get_args(tp)
    if origin is Literal:
        if value not in [a.value if isinstance(a, enum.Enum) else a for a in args]:
            raise ValueError(f"{_where(path)}: expected one of {list(args)!r}, got {value!r}")
        for a in args:
            if isinstance(a, enum.Enum) and a.value == value:
                return a
        return value
    if _is_union(origin):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return from_json(a, value, path)
            except (ValueError, TypeError) as e:
                errors.append(str(e))
        raise ValueError(f"{_where(path)}: fits none of {tp!r}: {'; '.join(errors)}")
    if origin is tuple or origin in _SEQUENCES or tp in (list, tuple, set, frozenset):
        if not isinstance(value, list):
            raise ValueError(f"{_where(path)}: expected an array, got {_kind(value)}")
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if len(args) != len(value):
                raise ValueError(f"{_where(path)}: expected {len(args)} items, got {len(value)}")
            return tuple(from_json(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
        inner = args[0] if args else Any
        items = [from_json(inner, v, f"{path}[{i}]") for i, v in enumerate(value)]
        if origin is tuple or tp is tuple:
            return tuple(items)
        if origin in (set, frozenset) or tp in (set, frozenset):
            return (frozenset if frozenset in (origin, tp) else set)(items)
        return items
    if origin in _MAPPINGS or tp is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{_where(path)}: expected an object, got {_kind(value)}")
        inner = args[1] if len(args) == 2 else Any
        return {k: from_json(inner, v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError as e:
            raise ValueError(f"{_where(path)}: expected one of {[m.value for m in tp]!r}, got {value!r}") from e
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise ValueError(f"{_where(path)}: expected an object ({tp.__name__}), got {_kind(value)}")
        hints = _hints(tp)
        fields = {f.name: f for f in dataclasses.fields(tp) if f.init}
        unknown = [k for k in value if k not in fields]
        if unknown:
            raise ValueError(f"{_where(path)}: {tp.__name__} has no field {unknown[0]!r}")
        kwargs = {}
        for name, f in fields.items():
            if name in value:
                kwargs[name] = from_json(hints[name], value[name], f"{path}.{name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{_where(path)}: {tp.__name__}'s field {name!r} is missing")
        return tp(**kwargs)
    if _is_typeddict(tp):
        if not isinstance(value, dict):
            raise ValueError(f"{_where(path)}: expected an object ({tp.__name__}), got {_kind(value)}")
        hints = _hints(tp)
        req = getattr(tp, "__required_keys__", frozenset(hints) if tp.__total__ else frozenset())
        for name in hints:
            if name in req and name not in value:
                raise ValueError(f"{_where(path)}: {tp.__name__}'s key {name!r} is missing")
        return {k: from_json(hints[k], v, f"{path}.{k}") if k in hints else v for k, v in value.items()}
    if isinstance(tp, typing.TypeVar):
        return value
    raise TypeError(f"cannot read JSON as {tp!r}")


def _kind(value: JSON) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def to_json(value: Any) -> JSON:
    """A JSON value of a Python one: dataclasses and pydantic models as
    objects, enums as their values, tuples and sets as arrays, datetimes,
    dates and UUIDs as text."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ValueError("NaN and infinities are not JSON")
        return value
    if isinstance(value, enum.Enum):
        return to_json(value.value)
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        return dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, collections.abc.Mapping):
        return {str(k.value if isinstance(k, enum.Enum) else k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_json(v) for v in value]
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"not JSON: a {type(value).__name__}")
