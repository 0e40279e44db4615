"""The worker's eager dispatch against a stub coordinator (no composer
needed): a report asks for the next task, and the task its answer brings
runs on the slot the reported one freed, without a poll; a coordinator that
refuses the ask gets the result again without it, once, and is not asked
again; ``eager=False`` never asks."""

import logging
import threading
import time
import unittest
from typing import Any, Callable

from composer_client.worker import Task, TaskError, Worker

from .support import Answer, InBackground, Request, StubServer, answer

LEASE = {"worker_id": "py-eager", "run_id": "r-1", "attempt": 1}
TAKE_NEXT = {"queues": ["q", "q2"], "max": 1}


def leased(task_id: str, lease_ttl_ms: int = 10000) -> dict[str, Any]:
    return {
        "id": task_id, "run_id": "r-1", "attempt": 1, "node_id": f"n-{task_id}", "node_type": "step", "queue": "q",
        "input": {"id": task_id}, "lease_ttl_ms": lease_ttl_ms,
    }  # fmt: skip


def first_poll_brings(task: dict[str, Any]) -> Callable[[Request], Answer]:
    """An answer to polls: ``task`` to the first, nothing to the others."""
    polls: list[int] = []

    def poll(_r: Request) -> Answer:
        polls.append(1)
        return answer(200, {"tasks": [task] if len(polls) == 1 else []})

    return poll


def serve(stub: StubServer, handler: Callable[[Task], Any], done: Callable[[], bool], **options: Any) -> None:
    """Runs a worker of queues q and q2, one task at a time, until ``done()``."""
    w = Worker(stub.url, queues=["q", "q2"], poll_wait=0.1, worker_id="py-eager", concurrency=1, **options)
    with InBackground(w.handle("step", handler)):
        deadline = time.monotonic() + 20
        while not done() and time.monotonic() < deadline:
            time.sleep(0.02)


def reports(stub: StubServer) -> list[tuple[str, Any]]:
    return [(r.route, r.body) for r in stub.requests if r.route != "/v1/tasks/poll"]


class EagerDispatchTest(unittest.TestCase):
    def test_the_task_a_report_took_runs_on_the_slot_it_freed_with_heartbeats_and_its_own_report(self) -> None:
        poll = first_poll_brings(leased("t-1"))

        def respond(r: Request) -> Answer:
            if r.route == "/v1/tasks/poll":
                return poll(r)
            if r.route == "/v1/tasks/t-1/complete":
                return answer(200, {"applied": True, "next": [leased("t-2", lease_ttl_ms=300)]})
            if r.route.endswith("/heartbeat"):
                return answer(200, {"lease_ttl_ms": 300})
            return answer(200, {"applied": True})

        threads: dict[str, threading.Thread] = {}

        def step(task: Task) -> Any:
            threads[task.id] = threading.current_thread()
            if task.id == "t-1":
                return {"first": True}
            time.sleep(0.25)  # past a third of its lease: a heartbeat
            raise TaskError("second fails", retryable=False)

        with StubServer(respond) as stub:
            serve(stub, step, lambda: any(r.route == "/v1/tasks/t-2/fail" for r in stub.requests))
        sent = [(r.route, r.body) for r in stub.requests]
        first = sent.index(("/v1/tasks/t-1/complete", {**LEASE, "output": {"first": True}, "next": TAKE_NEXT}))
        second = sent.index(
            ("/v1/tasks/t-2/fail", {**LEASE, "error": "second fails", "retryable": False, "next": TAKE_NEXT})
        )
        between = sent[first + 1 : second]
        self.assertTrue(between, "t-2 was heartbeaten")
        self.assertEqual(between, [("/v1/tasks/t-2/heartbeat", LEASE)] * len(between), "and not polled for")
        self.assertIs(threads["t-1"], threads["t-2"], "on the thread, and so the slot, t-1 freed")

    def test_a_refused_next_sends_the_result_again_without_it_once_and_is_never_asked_again(self) -> None:
        polls: list[int] = []

        def respond(r: Request) -> Answer:
            if r.route == "/v1/tasks/poll":
                polls.append(1)
                return answer(200, {"tasks": [leased(f"t-{len(polls)}")] if len(polls) <= 2 else []})
            if "next" in r.body:
                return answer(400, {"error": {"code": "invalid_request", "message": "unknown field `next`"}})
            return answer(200, {"applied": True})

        with StubServer(respond) as stub, self.assertLogs("composer_client.worker", logging.WARNING) as logs:
            serve(stub, lambda t: t.input, lambda: any(r.route == "/v1/tasks/t-2/complete" for r in stub.requests))
        self.assertEqual(
            reports(stub),
            [
                ("/v1/tasks/t-1/complete", {**LEASE, "output": {"id": "t-1"}, "next": TAKE_NEXT}),
                ("/v1/tasks/t-1/complete", {**LEASE, "output": {"id": "t-1"}}),
                ("/v1/tasks/t-2/complete", {**LEASE, "output": {"id": "t-2"}}),
            ],
        )
        refused = [m for m in logs.output if "refused next" in m]
        self.assertEqual(len(refused), 1, logs.output)
        self.assertIn("unknown field `next`", refused[0])
        self.assertFalse([m for m in logs.output if m.startswith("ERROR")], logs.output)

    def test_no_next_is_asked_with_eager_off(self) -> None:
        poll = first_poll_brings(leased("t-1"))

        def respond(r: Request) -> Answer:
            return poll(r) if r.route == "/v1/tasks/poll" else answer(200, {"applied": True})

        with StubServer(respond) as stub:
            serve(stub, lambda t: t.input, lambda: bool(reports(stub)), eager=False)
        self.assertEqual(reports(stub), [("/v1/tasks/t-1/complete", {**LEASE, "output": {"id": "t-1"}})])

    def test_no_next_is_asked_once_the_worker_is_stopping(self) -> None:
        poll = first_poll_brings(leased("t-1"))

        def respond(r: Request) -> Answer:
            return poll(r) if r.route == "/v1/tasks/poll" else answer(200, {"applied": True})

        with StubServer(respond) as stub:
            w = Worker(stub.url, queues=["q"], poll_wait=0.1, worker_id="py-eager")

            def stop_then_return(task: Task) -> Any:
                w.stop()
                return task.input

            w.handle("step", stop_then_return)
            runner = threading.Thread(target=w.run, daemon=True)
            runner.start()
            runner.join(20)
            self.assertFalse(runner.is_alive(), "the worker stopped")
        self.assertEqual(reports(stub), [("/v1/tasks/t-1/complete", {**LEASE, "output": {"id": "t-1"}})])


if __name__ == "__main__":
    unittest.main()
