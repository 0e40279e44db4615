"""The workflow builder without a server: JSON Schemas of types, JSON into
typed values and back, typed steps' nodes and handlers, edges from reads,
options of every kind, and register's ``?version=``."""

import enum
import unittest
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, Optional, TypedDict, Union

from composer_client import Client
from composer_client.worker import Task, TaskError
from composer_client.workflow import (
    Concurrency,
    Limit,
    OnFailure,
    Retry,
    Trigger,
    Workflow,
    custom,
    expr,
    from_json,
    handler_for,
    http,
    json_schema,
    map_,
    queues_of,
    secret,
    step,
    sub_workflow,
    to_json,
    transform,
    wait,
    wait_for_event,
)

from .support import StubServer, answer

BATCH = {"max_size": 10, "max_wait": "5s"}


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass
class Line:
    sku: str
    qty: int = 1


@dataclass
class Tree:
    name: str
    children: list["Tree"] = field(default_factory=list)


@dataclass
class Order:
    id: str
    amount: float
    lines: list[Line]
    color: Color = Color.RED
    note: Optional[str] = None
    mode: Literal["fast", "slow"] = "fast"
    tags: dict[str, int] = field(default_factory=dict)


class Customer(TypedDict):
    name: str
    vip: bool


class FakeModel:
    """What simulate and the handlers expect of a pydantic model (duck typing)."""

    def __init__(self, x: int) -> None:
        self.x = x

    @classmethod
    def model_json_schema(cls) -> dict[str, Any]:
        return {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"], "title": "FakeModel"}

    @classmethod
    def model_validate(cls, value: Any) -> "FakeModel":
        return cls(int(value["x"]))

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        return {"x": self.x}


def task(node_type: str, given: Any) -> Task:
    return Task("t", "r", 1, node_type, node_type, node_type.lower(), given, 60_000)


class SchemaTest(unittest.TestCase):
    def test_a_dataclass(self) -> None:
        self.assertEqual(
            json_schema(Order),
            {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "amount": {"type": "number"},
                    "lines": {"type": "array", "items": {"$ref": "#/$defs/Line"}},
                    "color": {"$ref": "#/$defs/Color"},
                    "note": {"type": ["string", "null"]},
                    "mode": {"enum": ["fast", "slow"]},
                    "tags": {"type": "object", "additionalProperties": {"type": "integer"}},
                },
                "required": ["id", "amount", "lines"],
                "additionalProperties": False,
                "$defs": {
                    "Line": {
                        "type": "object",
                        "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                        "required": ["sku"],
                        "additionalProperties": False,
                    },
                    "Color": {"enum": ["red", "blue"]},
                },
            },
        )

    def test_recursion_typeddicts_unions_and_models(self) -> None:
        self.assertEqual(json_schema(Tree)["properties"]["children"], {"type": "array", "items": {"$ref": "#"}})
        self.assertEqual(
            json_schema(Customer),
            {
                "type": "object",
                "properties": {"name": {"type": "string"}, "vip": {"type": "boolean"}},
                "required": ["name", "vip"],
            },
        )
        self.assertEqual(
            json_schema(Union[Line, int]),
            {"anyOf": [{"$ref": "#/$defs/Line"}, {"type": "integer"}], "$defs": {"Line": json_schema(Line)}},
        )
        self.assertEqual(json_schema(FakeModel), FakeModel.model_json_schema())
        self.assertEqual(json_schema(Literal["x"]), {"const": "x"})
        with self.assertRaises(TypeError):
            json_schema(complex)

    def test_the_definition_carries_it(self) -> None:
        wf = Workflow("typed", input=Order)
        wf.add("t", transform(wf.input))
        self.assertEqual(wf.definition()["input_schema"], json_schema(Order))
        wf.input_schema = False
        self.assertNotIn("input_schema", wf.definition())
        wf.input_schema = {"type": "object"}
        self.assertEqual(wf.definition()["input_schema"], {"type": "object"})
        untyped = Workflow("untyped")
        untyped.add("t", transform(1))
        self.assertNotIn("input_schema", untyped.definition())


class ConversionTest(unittest.TestCase):
    def test_round_trip(self) -> None:
        raw = {"id": "o", "amount": 3, "lines": [{"sku": "a"}], "color": "blue", "tags": {"x": 1}}
        order = from_json(Order, raw)
        self.assertEqual(order, Order("o", 3.0, [Line("a", 1)], Color.BLUE, tags={"x": 1}))
        self.assertEqual(
            to_json(order),
            {
                "id": "o",
                "amount": 3.0,
                "lines": [{"sku": "a", "qty": 1}],
                "color": "blue",
                "note": None,
                "mode": "fast",
                "tags": {"x": 1},
            },
        )
        self.assertEqual(from_json(Customer, {"name": "n", "vip": True}), {"name": "n", "vip": True})
        self.assertEqual(from_json(Optional[int], None), None)
        self.assertEqual(from_json(tuple[int, str], [1, "a"]), (1, "a"))
        self.assertEqual(to_json(from_json(FakeModel, {"x": 4})), {"x": 4})

    def test_what_does_not_fit_names_where(self) -> None:
        cases = [
            (Order, {"id": "o", "amount": 1, "lines": [{"sku": 5}]}, ".lines[0].sku: expected text"),
            (Order, {"id": "o", "amount": 1}, "'lines' is missing"),
            (Order, {"id": "o", "amount": 1, "lines": [], "extra": 1}, "no field 'extra'"),
            (Order, {"id": "o", "amount": True, "lines": []}, ".amount: expected a number"),
            (Order, {"id": "o", "amount": 1, "lines": [], "color": "green"}, ".color: expected one of"),
            (int, 1.5, "expected an integer"),
            (Customer, {"name": "n"}, "'vip' is missing"),
        ]
        for tp, value, message in cases:
            with self.subTest(value=value), self.assertRaises(ValueError) as caught:
                from_json(tp, value)
            self.assertIn(message, str(caught.exception))


@dataclass
class Charge:
    id: str
    amount: float


def charge_card(order: Order) -> Charge:
    return Charge(f"ch_{order.id}", order.amount)


@step(type="ship-it", queue="shipping", retry=Retry(max_attempts=7))
def ship(order: Order, charge: Charge) -> list[str]:
    return [order.id, charge.id]


def pack(line: Line) -> int:
    return line.qty


class BuilderTest(unittest.TestCase):
    def test_typed_steps(self) -> None:
        wf = Workflow("shop", input=Order, description="d")
        charge = wf.step(charge_card, wf.input, queue="payments", timeout=timedelta(seconds=30))
        shipped = wf.step(ship, wf.input, charge, id="ship")
        packed = wf.map_step(pack, wf.input["lines"].cast(list[Line]), id="pack_all", max_concurrency=2)
        wf.output = {"shipped": shipped, "packed": packed, "paid": charge["amount"]}
        d = wf.definition()
        self.assertEqual(
            d["nodes"],
            [
                {
                    "id": "charge_card",
                    "type": "charge_card",
                    "queue": "payments",
                    "timeout": "30s",
                    "config": {"order": "${ .input }"},
                },
                {
                    "id": "ship",
                    "type": "ship-it",
                    "queue": "shipping",
                    "retry": {"max_attempts": 7},
                    "config": {"order": "${ .input }", "charge": "${ .nodes.charge_card.output }"},
                },
                {
                    "id": "pack_all",
                    "type": "MAP",
                    "config": {
                        "items": "${ .input.lines }",
                        "max_concurrency": 2,
                        "node": {"type": "pack", "config": {"line": "${ .item }"}},
                    },
                },
            ],
        )
        self.assertEqual(d["edges"], [{"from": "charge_card", "to": "ship"}])
        self.assertEqual(
            d["output"],
            {
                "shipped": "${ .nodes.ship.output }",
                "packed": "${ .nodes.pack_all.output }",
                "paid": "${ .nodes.charge_card.output.amount }",
            },
        )
        self.assertEqual(sorted(wf.handlers()), ["charge_card", "pack", "ship-it"])
        self.assertEqual(queues_of(wf), ["pack", "payments", "shipping"])
        raw = {"id": "o", "amount": 2, "lines": []}
        self.assertEqual(
            wf.handlers()["charge_card"](task("charge_card", {"order": raw})), {"id": "ch_o", "amount": 2.0}
        )
        self.assertEqual(
            wf.handlers()["ship-it"](task("ship-it", {"order": raw, "charge": {"id": "c", "amount": 1}})), ["o", "c"]
        )
        self.assertEqual(wf.handlers()["pack"](task("pack", {"line": {"sku": "s", "qty": 3}})), 3)

    def test_a_bad_input_fails_the_step_for_good(self) -> None:
        handle = handler_for(charge_card)
        for given in ({"order": {"id": 1}}, {}, [1]):
            with self.subTest(given=given), self.assertRaises(TaskError) as caught:
                handle(task("charge_card", given))
            self.assertFalse(caught.exception.retryable)
            self.assertEqual(caught.exception.code, "bad_input")

    def test_edges_from_reads_and_after(self) -> None:
        wf = Workflow("edges")
        a = wf.add("a", custom("work", {"x": wf.input["x"]}))
        b = wf.add("b", transform({"a": a}))
        # c reads a and b: a is upstream of b already, so one edge, from b.
        wf.add("c", transform({"a": a["v"], "b": f"{b['w']}!"}))
        # d reads a's error on its failure edge: no success edge from a.
        wf.add("d", transform({"why": a.error["message"]}), after=a.on_failure(when=".nodes.a.error.retryable"))
        wf.add("e", wait(timedelta(minutes=90)), after=[b.when(b["ok"]), a.always()])
        wf.add("f", transform("${ .nodes.e.output }"))
        self.assertEqual(
            wf.definition()["edges"],
            [
                {"from": "a", "to": "b"},
                {"from": "a", "to": "d", "on": "failure", "when": ".nodes.a.error.retryable"},
                {"from": "a", "to": "e", "on": "always"},
                {"from": "b", "to": "c"},
                {"from": "b", "to": "e", "when": ".nodes.b.output.ok"},
                {"from": "e", "to": "f"},
            ],
        )
        self.assertEqual(wf.definition()["nodes"][4]["config"], {"duration": "1h30m"})

    def test_mistakes_are_refused(self) -> None:
        wf = Workflow("bad")
        wf.add("a", transform(1))
        with self.assertRaises(ValueError):
            wf.add("a", transform(2))
        with self.assertRaises(ValueError):
            wf.add("..", transform(2))
        wf.add("b", transform("${ .nodes.nope.output }"))
        with self.assertRaises(ValueError) as caught:
            wf.definition()
        self.assertIn("nope", str(caught.exception))
        with self.assertRaises(ValueError):
            Workflow("empty").definition()
        with self.assertRaises(TypeError):
            Workflow("w", colour="red")  # type: ignore[call-overload]
        with self.assertRaises(ValueError):
            Workflow("w").edge("a", "b", on="sometimes")

    def test_every_option(self) -> None:
        wf = Workflow(
            "all",
            timeout=timedelta(hours=2),
            concurrency=Concurrency(2, key="${ .input.k }"),
            on_failure=OnFailure("handler", on=["FAILED"], version=2),
            on_success="notify",
            on_end={"workflow": "audit", "input": {"id": "${ .run.id }"}},
            deadlines=[{"after": "2h", "start": {"workflow": "page"}}],
            tags={"customer": "${ .input.c }", "n": 1},
            triggers=[
                Trigger("e", when=".event.payload.ok", input={"x": "${ .event.payload }"}),
                Trigger("f", key="${ .event.payload.user }", batch=BATCH, singleton="skip"),
            ],
            priority=1,
            fairness_key="${ .input.tenant }",
        )
        wf.add(
            "h",
            http(
                "https://x/${ .input.id }",
                method="PUT",
                headers={"Authorization": f"Bearer {secret('TOKEN')}"},
                accept=[404],
                retry_statuses=[409],
                follow_redirects=True,
                request_timeout="5s",
                delivery="at_most_once",
                limits=[Limit("k", rate="1/1s", burst=2), {"key": "raw", "concurrency": 1}],
                retry={"max_attempts": 2, "on_429": "ignore"},
                queue="q",
            ),
        )
        approve = {"name": "approve", "validate": ".update.payload.ok"}
        late = {"late": True}
        wf.add("w", wait_for_event("ev", "${ .input.id }", timeout="1d", default_output=late, updates=[approve]))
        wf.add("s", sub_workflow("child", input=wf.input, version=3, on_parent_close="abandon"))
        wf.add("m", map_([1, 2], custom("work", {"i": expr(".item")}), on_item_failure="continue", collect="none"))
        wf.add("until", wait(until="2030-01-01T00:00:00Z", deadlines=[{"after": "1h", "start": {"workflow": "p"}}]))
        d = wf.definition()
        self.assertEqual(d["timeout"], "2h")
        self.assertEqual(d["concurrency"], {"max": 2, "key": "${ .input.k }"})
        self.assertEqual(d["on_failure"], {"workflow": "handler", "on": ["FAILED"], "version": 2})
        self.assertEqual(d["on_success"], {"workflow": "notify"})
        self.assertEqual(d["on_end"], {"workflow": "audit", "input": {"id": "${ .run.id }"}})
        self.assertEqual(d["deadlines"], [{"after": "2h", "start": {"workflow": "page"}}])
        self.assertEqual(
            d["triggers"][0], {"event": "e", "when": ".event.payload.ok", "input": {"x": "${ .event.payload }"}}
        )
        flow = {"event": "f", "key": "${ .event.payload.user }", "batch": BATCH, "singleton": "skip"}
        self.assertEqual(d["triggers"][1], flow)
        self.assertEqual((d["priority"], d["fairness_key"]), (1, "${ .input.tenant }"))
        h = d["nodes"][0]
        self.assertEqual(h["config"]["headers"], {"Authorization": "Bearer ${ .secrets.TOKEN }"})
        self.assertEqual(h["limits"], [{"key": "k", "rate": "1/1s", "burst": 2}, {"key": "raw", "concurrency": 1}])
        self.assertEqual((h["delivery"], h["queue"], h["config"]["timeout"]), ("at_most_once", "q", "5s"))
        self.assertEqual(
            d["nodes"][1]["config"],
            {"event": "ev", "key": "${ .input.id }", "timeout": "1d", "default_output": {"late": True}},
        )
        self.assertEqual(d["nodes"][2]["config"]["input"], "${ .input }")
        self.assertEqual(d["nodes"][3]["config"]["node"], {"type": "work", "config": {"i": "${ .item }"}})
        self.assertEqual(d["nodes"][4]["deadlines"], [{"after": "1h", "start": {"workflow": "p"}}])
        self.assertEqual(d["nodes"][1]["updates"], [approve])
        self.assertNotIn("edges", d)

    def test_register_sends_the_version(self) -> None:
        wf = Workflow("reg")
        wf.add("t", transform(1))
        with StubServer(lambda _r: answer(200, {"id": "x", "name": "reg", "version": 3})) as stub:
            got = wf.register(Client(stub.url), version=3)
            wf.register(Client(stub.url))
        self.assertEqual((got["version"], got["created"]), (3, False))
        self.assertEqual([r.path for r in stub.requests], ["/v1/workflows?version=3", "/v1/workflows"])
        self.assertEqual(stub.requests[0].body, wf.definition())


if __name__ == "__main__":
    unittest.main()
