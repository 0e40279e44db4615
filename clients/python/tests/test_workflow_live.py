"""Workflows in code against a real `composer dev`: registration idempotent
by content and with a declared version, the input_schema made from the
input's type refusing a bad start, and a run whose typed steps this
process's worker runs."""

import unittest

from composer_client import Client, Conflict, InvalidRequest
from composer_client.workflow import Retry, Workflow, register, transform, worker_for

from .support import Charge, DevServer, InBackground, Order, unique

DEV = DevServer()
client = Client("http://127.0.0.1:9")  # replaced in setUpModule


def setUpModule() -> None:
    global client
    DEV.start()
    client = Client(DEV.url, timeout=30)


def tearDownModule() -> None:
    DEV.stop()


def charge_card(order: Order) -> Charge:
    return Charge(f"ch_{order.id}", order.amount * 100)


def label(order: Order, charge: Charge) -> str:
    return f"{order.id} paid {charge.amount} ({charge.id})"


def build(name: str) -> Workflow[Order]:
    wf = Workflow(name, input=Order)
    quick = Retry(max_attempts=2, initial_backoff="50ms")
    charge = wf.step(charge_card, wf.input, queue=f"{name}-payments", retry=quick, type=f"{name}-charge")
    text = wf.step(label, wf.input, charge, type=f"{name}-label", retry=quick)
    wf.output = wf.add("summary", transform({"label": text, "cents": charge["amount"]}))
    return wf


class LiveTest(unittest.TestCase):
    def test_registration_is_idempotent_and_takes_a_version(self) -> None:
        wf = build(unique("py-reg"))
        first = wf.register(client)
        self.assertEqual((first["version"], first["created"]), (1, True))
        again = register(client, wf)[0]
        self.assertEqual((again["version"], again["created"]), (1, False))
        self.assertEqual(wf.register(client, version=1)["created"], False)
        wf.description = "changed"
        with self.assertRaises(Conflict) as caught:
            wf.register(client, version=1)
        self.assertIn("version 1", caught.exception.message)
        with self.assertRaises(Conflict):
            wf.register(client, version=5)
        second = wf.register(client, version=2)
        self.assertEqual((second["version"], second["created"]), (2, True))
        wf.description = None
        self.assertEqual(wf.register(client)["version"], 1)  # the same content as version 1
        self.assertEqual(client.get_workflow(wf.name, 1)["spec"], build(wf.name).definition())

    def test_the_input_type_is_checked_at_start(self) -> None:
        wf = build(unique("py-schema"))
        wf.register(client)
        with self.assertRaises(InvalidRequest) as caught:
            client.start_run(wf.name, input={"id": "o-1", "amount": "30"})
        self.assertIn("/amount", caught.exception.message)
        with self.assertRaises(InvalidRequest):
            client.start_run(wf.name, input={"id": "o-1", "amount": 30, "extra": True})

    def test_a_run_of_typed_steps(self) -> None:
        wf = build(unique("py-run"))
        wf.register(client)
        worker = worker_for(wf, url=DEV.url, poll_wait=1)
        self.assertEqual(sorted(worker.queues), sorted([f"{wf.name}-payments", f"{wf.name}-label".lower()]))
        with InBackground(worker):
            run = client.start_run(wf.name, input={"id": "o-1", "amount": 3})
            done = client.wait(run["id"], timeout=60)
        self.assertEqual(done["status"], "SUCCEEDED", done)
        self.assertEqual(done.get("output"), {"label": "o-1 paid 300 (ch_o-1)", "cents": 300})


if __name__ == "__main__":
    unittest.main()
