"""``composer_client.workflow.simulate``: a workflow built in code run
offline by ``composer workflow simulate --ask``, each step answered by its
own Python function (or a mock). Needs the binary (``COMPOSER_BIN``), no
server."""

import os
import unittest
from dataclasses import dataclass
from typing import Any

from composer_client.worker import TaskError
from composer_client.workflow import (
    AttemptTimeout,
    Retry,
    SimulationError,
    Workflow,
    fail,
    simulate,
    transform,
)

from .support import REPO_ROOT, Charge, Order


def setUpModule() -> None:
    binary = os.path.abspath(os.environ.get("COMPOSER_BIN", os.path.join(REPO_ROOT, "target", "debug", "composer")))
    if not os.access(binary, os.X_OK):
        raise unittest.SkipTest(f"no composer binary at {binary}: set COMPOSER_BIN")
    os.environ["COMPOSER_BIN"] = binary


@dataclass
class Shipment:
    order: str
    charge: str


calls: list[Any] = []


def charge_card(order: Order) -> Charge:
    calls.append(("charge_card", order))
    if order.amount > 1000:
        raise TaskError(f"declined: {order.amount}", retryable=False, code="card_declined")
    if order.amount < 0:
        raise RuntimeError("the card service is down")
    return Charge(f"ch_{order.id}", order.amount)


def ship(order: Order, charge: Charge) -> Shipment:
    calls.append(("ship", order, charge))
    return Shipment(order.id, charge.id)


def build() -> Workflow[Order]:
    wf = Workflow("py_sim_order", input=Order)
    charge = wf.step(charge_card, wf.input, queue="payments", retry=Retry(max_attempts=3, initial_backoff="1s"))
    shipment = wf.step(ship, wf.input, charge)
    summary = wf.add("summary", transform({"order": wf.input["id"], "charge": charge["id"], "shipped": shipment}))
    wf.add(
        "declined",
        fail(f"order {wf.input['id']}: {charge.error['message']}", code="declined"),
        after=charge.on_failure(),
    )
    wf.output = summary
    return wf


class SimulateTest(unittest.TestCase):
    def setUp(self) -> None:
        calls.clear()

    def test_the_steps_own_functions_answer(self) -> None:
        sim = simulate(build(), {"id": "o-1", "amount": 30})
        self.assertEqual(sim.status, "SUCCEEDED", sim.report)
        self.assertTrue(sim.succeeded)
        self.assertEqual(
            sim.output, {"order": "o-1", "charge": "ch_o-1", "shipped": {"order": "o-1", "charge": "ch_o-1"}}
        )
        # The functions ran with typed arguments, read from the JSON the engine evaluated.
        self.assertEqual(
            calls,
            [("charge_card", Order("o-1", 30)), ("ship", Order("o-1", 30), Charge("ch_o-1", 30))],
        )
        self.assertEqual(
            [(a.node, a.type, a.attempt) for a in sim.asks], [("charge_card", "charge_card", 1), ("ship", "ship", 1)]
        )
        self.assertEqual(sim.nodes["declined"]["state"], "SKIPPED")
        self.assertEqual(
            sim.nodes["ship"]["input"], {"order": {"id": "o-1", "amount": 30}, "charge": {"id": "ch_o-1", "amount": 30}}
        )

    def test_a_raising_handler_is_retried_then_fails_the_step(self) -> None:
        sim = simulate(build(), {"id": "o-2", "amount": -1})
        self.assertEqual(sim.status, "FAILED")
        self.assertEqual(sim.nodes["charge_card"]["state"], "FAILED")
        self.assertEqual(sim.nodes["charge_card"]["attempts"], 3)  # the node's retry policy
        self.assertEqual([a.attempt for a in sim.asks], [1, 2, 3])
        self.assertIn("RuntimeError: the card service is down", str(sim.asks[0].answer["error"]))
        self.assertEqual(sim.nodes["declined"]["state"], "FAILED")  # the failure edge ran the FAIL node
        self.assertIn("order o-2: RuntimeError: the card service is down", str(sim.error))
        self.assertNotIn(sim.nodes["ship"]["state"], ("COMPLETED", "FAILED"))  # never ran

    def test_a_task_error_not_retryable_fails_at_once(self) -> None:
        sim = simulate(build(), {"id": "o-3", "amount": 5000})
        self.assertEqual(sim.status, "FAILED")
        self.assertEqual(sim.nodes["charge_card"]["attempts"], 1)
        self.assertIn("declined: 5000", str(sim.error))

    def test_a_mock_function_replaces_a_step(self) -> None:
        seen: list[Any] = []

        def fake_charge(given: Any) -> Any:
            seen.append(given)
            return {"id": "ch_mocked", "amount": 1}

        sim = simulate(build(), {"id": "o-4", "amount": 30}, mocks={"charge_card": fake_charge})
        self.assertEqual(sim.status, "SUCCEEDED", sim.report)
        self.assertEqual(seen, [{"order": {"id": "o-4", "amount": 30}}])  # the node's input, as JSON
        self.assertEqual(sim.output["charge"], "ch_mocked")
        self.assertEqual([c[0] for c in calls], ["ship"])  # charge_card itself never ran

    def test_a_mock_value_and_a_failure_go_to_the_simulator(self) -> None:
        sim = simulate(build(), {"id": "o-5", "amount": 30}, mocks={"charge_card": {"id": "ch_json", "amount": 2}})
        self.assertEqual(sim.output["charge"], "ch_json")
        self.assertEqual([a.answer for a in sim.asks if a.node == "charge_card"], [{"mock": True}])
        calls.clear()
        failed = simulate(build(), {"id": "o-6", "amount": 30}, failures={"ship": "no truck"})
        self.assertEqual(failed.status, "FAILED")
        self.assertEqual(failed.nodes["ship"]["state"], "FAILED")
        self.assertIn("no truck", str(failed.error))
        self.assertEqual([c[0] for c in calls], ["charge_card"])  # ship's function never ran: --fail did

    def test_a_timeout(self) -> None:
        def slow(given: Any) -> Any:
            raise AttemptTimeout()

        sim = simulate(build(), {"id": "o-7", "amount": 30}, mocks={"charge_card": slow})
        self.assertEqual(sim.status, "FAILED")
        self.assertEqual([a.answer for a in sim.asks], [{"timeout": True}] * 3)

    def test_an_input_the_type_refuses(self) -> None:
        # The definition's input_schema (from the dataclass) refuses it before any step.
        with self.assertRaises(SimulationError) as caught:
            simulate(build(), {"id": "o-8", "amount": "thirty"})
        # The simulator's own words (exit status 1, no run), naming the JSON Pointer at fault.
        message = str(caught.exception)
        self.assertIn('no run: workflow "py_sim_order": the input does not match input_schema at /amount', message)
        self.assertIn("the input does not match input_schema at /amount", caught.exception.stderr)
        self.assertEqual(calls, [])

    def test_an_invalid_definition(self) -> None:
        wf = build()
        wf.timeout = "soon"
        with self.assertRaises(SimulationError) as caught:
            simulate(wf, {"id": "o-9", "amount": 30})
        self.assertIn("timeout", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
