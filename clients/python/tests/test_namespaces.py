"""Namespaces: the worker names its namespace in every call of the task API
and refuses a bad name (against a stub coordinator, no composer needed),
``worker_for`` takes ``COMPOSER_NAMESPACE``; and against a real
`composer dev`, a namespace created by the administrator holds a workflow
and a run that a worker of that namespace runs, that the default namespace
does not see, and a deleted namespace is no longer served."""

import os
import threading
import time
import unittest
from typing import Any, Optional
from unittest import mock

from composer_client import Client, Conflict, NotFound, Unavailable
from composer_client.worker import Task, TaskError, Worker
from composer_client.workflow import worker_for

from .support import Answer, DevServer, InBackground, Request, StubServer, answer, definition, node, unique

NAMESPACE = "team-x"


def leased(task_id: str, lease_ttl_ms: int) -> dict[str, Any]:
    return {
        "id": task_id, "run_id": "r-1", "attempt": 1, "node_id": f"n-{task_id}", "node_type": "step", "queue": "q",
        "input": {"id": task_id}, "lease_ttl_ms": lease_ttl_ms,
    }  # fmt: skip


def namespace_of(request: Request) -> Optional[str]:
    return next((v for k, v in request.headers.items() if k.lower() == "composer-namespace"), None)


class WorkerNamespaceTest(unittest.TestCase):
    def test_every_call_of_the_task_api_names_the_namespace(self) -> None:
        # t-1 logs a line and outlives a third of its lease (a heartbeat) before it
        # completes; t-2 fails: poll, logs, heartbeat, complete and fail are all seen.
        polls: list[int] = []
        reported: set[str] = set()

        def respond(r: Request) -> Answer:
            if r.route == "/v1/tasks/poll":
                polls.append(1)
                return answer(200, {"tasks": [leased("t-1", 300), leased("t-2", 10000)] if len(polls) == 1 else []})
            if r.route.endswith("/heartbeat"):
                return answer(200, {"lease_ttl_ms": 300})
            if r.route.endswith(("/complete", "/fail")):
                reported.add(r.route)
            return answer(200, {"applied": True})

        def step(task: Task) -> Any:
            if task.id == "t-2":
                raise TaskError("no", retryable=False)
            task.log("working")
            time.sleep(0.5)
            return {"done": task.id}

        with StubServer(respond) as stub:
            w = Worker(stub.url, queues=["q"], poll_wait=0.1, worker_id="py-ns", eager=False, namespace=NAMESPACE)
            self.assertEqual(w.namespace, NAMESPACE)
            self.assertIn("namespace='team-x'", repr(w))
            with InBackground(w.handle("step", step, queue="q")):
                deadline = time.monotonic() + 20
                while len(reported) < 2 and time.monotonic() < deadline:
                    time.sleep(0.02)
        self.assertEqual(reported, {"/v1/tasks/t-1/complete", "/v1/tasks/t-2/fail"})
        kinds = {r.route.rsplit("/", 1)[1] for r in stub.requests}
        self.assertEqual(kinds, {"poll", "logs", "heartbeat", "complete", "fail"})
        self.assertEqual({namespace_of(r) for r in stub.requests}, {NAMESPACE})

    def test_a_worker_without_a_namespace_names_none(self) -> None:
        with StubServer(lambda _r: answer(200, {"tasks": []})) as stub:
            for w in (Worker(stub.url, queues=["q"], poll_wait=0.1), Worker(stub.url, queues=["q"], namespace="")):
                self.assertIsNone(w.namespace)
                before = len(stub.requests)
                with InBackground(w.handle("step", lambda t: None, queue="q")):
                    deadline = time.monotonic() + 10
                    while len(stub.requests) == before and time.monotonic() < deadline:
                        time.sleep(0.02)
                self.assertGreater(len(stub.requests), before, "it polled")
        self.assertEqual({namespace_of(r) for r in stub.requests}, {None})

    def test_a_bad_name_is_refused_when_the_worker_is_made(self) -> None:
        for bad in ("Team-x", "team_x", "9team", "a" * 64):
            with self.subTest(namespace=bad), self.assertRaisesRegex(ValueError, "^namespace must be"):
                Worker("http://127.0.0.1:9", namespace=bad)

    def test_worker_for_takes_composer_namespace_unless_given_one(self) -> None:
        handlers = {"step": lambda _t: None}
        with mock.patch.dict(os.environ, {"COMPOSER_NAMESPACE": "team-env"}):
            self.assertEqual(worker_for(url="http://127.0.0.1:9", handlers=handlers).namespace, "team-env")
            given = worker_for(url="http://127.0.0.1:9", handlers=handlers, namespace="team-given")
            self.assertEqual(given.namespace, "team-given")
            self.assertIsNone(worker_for(url="http://127.0.0.1:9", handlers=handlers, namespace="").namespace)
        bad = {"COMPOSER_NAMESPACE": "Not_A_Name"}
        with mock.patch.dict(os.environ, bad), self.assertRaisesRegex(ValueError, "^namespace must be"):
            worker_for(url="http://127.0.0.1:9", handlers=handlers)


class LiveTest(unittest.TestCase):
    """Against `composer dev`, which has no token: its caller is an administrator."""

    dev = DevServer(COMPOSER_LEASE_TTL="2s")

    @classmethod
    def setUpClass(cls) -> None:
        cls.dev.start()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.dev.stop()

    def test_a_worker_of_a_namespace_runs_its_run_which_default_does_not_see(self) -> None:
        admin = Client(self.dev.url, timeout=30)
        made = admin.create_namespace(NAMESPACE, "the x team")
        self.assertEqual((made["name"], made["state"], made["created"]), (NAMESPACE, "active", True))
        self.assertFalse(admin.create_namespace(NAMESPACE)["created"], "it exists: answered as it is")
        self.assertEqual(admin.get_namespace(NAMESPACE)["description"], "the x team")
        names = [n["name"] for n in admin.list_namespaces()]
        self.assertEqual(names[0], "default")
        self.assertIn(NAMESPACE, names)

        team = Client(self.dev.url, timeout=30, namespace=NAMESPACE)
        name, queue = unique("py-ns"), unique("py-ns-q")
        team.register_workflow(definition(name, [node("work", "ns-step", queue, size=3)]))
        run = team.start_run(name, input={"n": 1})
        seen: list[str] = []
        lock = threading.Lock()

        def step(task: Task) -> Any:
            with lock:
                seen.append(task.run_id)
            return {"doubled": task.input["size"] * 2}

        worker = Worker(self.dev.url, poll_wait=1, namespace=NAMESPACE).handle("ns-step", step, queue=queue)
        self.assertEqual(worker.queues, [queue])
        with InBackground(worker):
            done = team.wait(run["id"], timeout=60)
        self.assertEqual(done["status"], "SUCCEEDED", done)
        self.assertEqual(done.get("output"), {"work": {"doubled": 6}})
        self.assertEqual(seen, [run["id"]])

        # The default namespace has neither the run nor the workflow.
        with self.assertRaises(NotFound):
            admin.get_run(run["id"])
        with self.assertRaises(NotFound):
            admin.get_workflow(name)
        self.assertNotIn(name, [w["name"] for w in admin.list_workflows()])
        # A namespace nobody created is a 404 of the server; a bad name never leaves the client.
        with self.assertRaises(NotFound) as missing:
            Client(self.dev.url, namespace="team-nobody").list_workflows()
        self.assertIn("team-nobody", missing.exception.message)
        for bad in ("Team-X", "team_x", "x" * 64):
            with self.subTest(namespace=bad), self.assertRaisesRegex(ValueError, "^namespace must be"):
                Client(self.dev.url, namespace=bad)

    def test_a_deleted_namespace_is_no_longer_served(self) -> None:
        admin = Client(self.dev.url, timeout=30)
        gone = unique("team-gone")
        admin.create_namespace(gone)
        inside = Client(self.dev.url, timeout=30, namespace=gone)
        self.assertEqual(inside.list_workflows(), [])
        self.assertEqual(admin.delete_namespace(gone)["state"], "deleting")
        with self.assertRaises(Conflict):
            inside.list_workflows()
        with self.assertRaises(NotFound):
            admin.delete_namespace(unique("team-never"))
        with self.assertRaises(Conflict):
            admin.delete_namespace("default")

    def test_a_namespace_s_quotas_refuse_a_start_by_name_and_its_usage_is_shown(self) -> None:
        admin = Client(self.dev.url, timeout=30)
        small = unique("team-small")
        admin.create_namespace(small)
        inside = Client(self.dev.url, timeout=30, namespace=small)
        name = unique("py-waits")
        inside.register_workflow(
            {"name": name, "nodes": [{"id": "w", "type": "WAIT_FOR_EVENT", "config": {"event": "go", "key": "k"}}]}
        )
        answer = admin.set_namespace_quotas(small, {"open_runs": 1, "schedules": 3})
        self.assertEqual(answer["quotas"], {"open_runs": 1, "schedules": 3})
        inside.start_run(name)
        with self.assertRaises(Unavailable) as over:
            inside.start_run(name)
        self.assertEqual((over.exception.status, over.exception.code), (429, "over_quota"))
        self.assertIn("quota open_runs (1)", over.exception.message)
        self.assertEqual(over.exception.retry_after, 1.0)
        described = admin.get_namespace(small)
        self.assertEqual(described["usage"]["open_runs"], 1, described)
        self.assertEqual(admin.set_namespace_quotas(small, {})["quotas"], {})
        inside.start_run(name)


if __name__ == "__main__":
    unittest.main()
