"""The API client against a real `composer dev`: workflows, runs with their
input and output, waiting, paging, events, cancel, retry, pause and resume,
and how refusals map to exceptions."""

import os
import socket
import subprocess
import sys
import threading
import time
import unittest
import uuid
from typing import Any, Optional

from composer_client import (
    Client,
    ComposerError,
    Conflict,
    InvalidRequest,
    NotFound,
    Run,
    RunTask,
    Unavailable,
    WaitTimeout,
    parse_time,
)

from .support import PACKAGE_ROOT, DevServer, definition, node, unique

DEV = DevServer()
client = Client("http://127.0.0.1:9")  # replaced in setUpModule


def setUpModule() -> None:
    global client
    DEV.start()
    client = Client(DEV.url, timeout=30)


def tearDownModule() -> None:
    DEV.stop()


def echo(name: str) -> dict[str, Any]:
    """A workflow whose output is its input."""
    return definition(name, [node("echo", "TRANSFORM", output="${ .input }")])


def approval(name: str, timeout: Optional[str] = None) -> dict[str, Any]:
    """A workflow that waits for the event `approved` keyed by its input's
    `order`, then says who approved."""
    wait: dict[str, Any] = {"event": "approved", "key": "${ .input.order }"}
    if timeout is not None:
        wait["timeout"] = timeout
    return definition(
        name,
        [
            node("approval", "WAIT_FOR_EVENT", **wait),
            node("done", "TRANSFORM", output={"by": "${ .nodes.approval.output.by }"}),
        ],
        [{"from": "approval", "to": "done"}],
    )


def task(run: Run, node_id: str) -> Optional[RunTask]:
    return next((t for t in run["tasks"] if t["node_id"] == node_id), None)


def until_waiting(run_id: str, node_id: str = "approval") -> Run:
    """Reads the run until its task `node_id` waits for its event."""
    deadline = time.monotonic() + 30
    while True:
        run = client.get_run(run_id)
        t = task(run, node_id)
        if t is not None and t["state"] == "WAITING":
            return run
        if time.monotonic() > deadline:
            raise AssertionError(f"{node_id} never waited: {run}")
        time.sleep(0.05)


class WorkflowTest(unittest.TestCase):
    def test_registering_makes_a_version_only_when_the_definition_changes(self) -> None:
        name = unique("py-versions")
        first = client.register_workflow(echo(name))
        self.assertEqual((first["name"], first["version"], first["created"]), (name, 1, True))
        again = client.register_workflow(echo(name))
        self.assertEqual((again["id"], again["version"], again["created"]), (first["id"], 1, False))
        changed = definition(name, [node("echo", "TRANSFORM", output={"wrapped": "${ .input }"})])
        second = client.register_workflow(changed)
        self.assertEqual((second["version"], second["created"]), (2, True))

        latest = client.get_workflow(name)
        self.assertEqual(latest["version"], 2)
        self.assertEqual(latest["spec"]["nodes"][0]["config"], {"output": {"wrapped": "${ .input }"}})
        self.assertEqual([v["version"] for v in latest["versions"]], [2, 1])
        old = client.get_workflow(name, version=1)
        self.assertEqual((old["version"], old["spec"]["nodes"][0]["config"]), (1, {"output": "${ .input }"}))
        listed = {w["name"]: w["version"] for w in client.list_workflows()}
        self.assertEqual(listed.get(name), 2)
        parse_time(latest["created_at"])  # a timestamp the helper reads


class RunTest(unittest.TestCase):
    def test_a_run_gets_its_input_and_gives_its_output(self) -> None:
        name = unique("py-echo")
        client.register_workflow(echo(name))
        data = {"order": "o-1", "items": [1, 2.5, "x", None, True], "nested": {"ü": "✓ ${ not an expression"}}
        started = client.start_run(name, input=data)
        self.assertEqual((started["workflow"], started["version"]), (name, 1))
        run = client.wait(started["id"], timeout=30)
        self.assertEqual(run["status"], "SUCCEEDED", run)
        self.assertEqual(run["input"], data)
        self.assertEqual(run["output"], {"echo": data})
        echo_task = task(run, "echo")
        assert echo_task is not None
        self.assertEqual((echo_task["state"], echo_task["output"]), ("COMPLETED", data))
        self.assertIsNotNone(run["finished_at"])

        # No input is {}; a version is pinned when asked for.
        client.register_workflow(definition(name, [node("echo", "TRANSFORM", output={"v2": "${ .input }"})]))
        self.assertEqual(client.wait(client.start_run(name)["id"], 30)["output"], {"echo": {"v2": {}}})
        pinned = client.wait(client.start_run(name, input=[1], version=1)["id"], 30)
        self.assertEqual((pinned["version"], pinned["output"]), (1, {"echo": [1]}))

    def test_an_idempotency_key_returns_the_first_run_and_refuses_another_input(self) -> None:
        name = unique("py-idem")
        client.register_workflow(echo(name))
        first = client.start_run(name, input={"n": 1}, idempotency_key="k-1")
        again = client.start_run(name, input={"n": 1}, idempotency_key="k-1")
        self.assertEqual(first["id"], again["id"])
        other = client.start_run(name, input={"n": 1}, idempotency_key="k-2")
        self.assertNotEqual(first["id"], other["id"])
        with self.assertRaises(InvalidRequest) as e:
            client.start_run(name, input={"n": 2}, idempotency_key="k-1")
        self.assertEqual((e.exception.status, e.exception.code), (422, "idempotency_key_reused"))

    def test_wait_returns_as_soon_as_the_run_ends(self) -> None:
        name = unique("py-wait")
        client.register_workflow(approval(name))
        run_id = client.start_run(name, input={"order": "w-1"})["id"]
        until_waiting(run_id)
        timer = threading.Timer(1.5, client.send_event, args=("approved", "w-1", {"by": "timer"}))
        began = time.monotonic()
        timer.start()
        try:
            run = client.wait(run_id, timeout=30)
        finally:
            timer.join()
        took = time.monotonic() - began
        self.assertEqual(run["status"], "SUCCEEDED", run)
        self.assertEqual(run["output"], {"done": {"by": "timer"}})
        self.assertGreater(took, 1.3)
        self.assertLess(took, 10, "the long-poll is woken by the end, not by a timer")

    def test_wait_gives_up_after_its_timeout_with_the_run_as_last_seen(self) -> None:
        name = unique("py-timeout")
        client.register_workflow(approval(name))
        run_id = client.start_run(name, input={"order": "t-1"})["id"]
        began = time.monotonic()
        with self.assertRaises(WaitTimeout) as e:
            client.wait(run_id, timeout=1.5)
        took = time.monotonic() - began
        self.assertIsInstance(e.exception, TimeoutError)
        self.assertEqual((e.exception.run["id"], e.exception.run["status"]), (run_id, "RUNNING"))
        self.assertGreater(took, 1.4)
        self.assertLess(took, 6)
        # timeout=0 looks once.
        with self.assertRaises(WaitTimeout):
            client.wait(run_id, timeout=0)
        client.cancel(run_id)

    def test_lists_page_through_the_runs_newest_first(self) -> None:
        name = unique("py-list")
        client.register_workflow(echo(name))
        started = {client.start_run(name, input={"i": i})["id"] for i in range(5)}

        pages = []
        cursor: Optional[str] = None
        while True:
            page = client.list_runs(workflow=name, limit=2, cursor=cursor)
            pages.append([r["id"] for r in page["runs"]])
            cursor = page["next_cursor"]
            if cursor is None:
                break
            self.assertLess(len(pages), 10, "paging never ends")
        self.assertEqual([len(p) for p in pages], [2, 2, 1])
        ids = [i for p in pages for i in p]
        self.assertEqual(set(ids), started)
        self.assertEqual(ids, sorted(ids, reverse=True), "newest (highest UUIDv7) first")
        self.assertTrue(all("input" not in r for r in client.list_runs(workflow=name)["runs"]), "summaries")

        self.assertEqual([r["id"] for r in client.iter_runs(workflow=name, page_size=2)], ids)
        self.assertEqual([r["id"] for r in client.iter_runs(workflow=name)], ids)
        self.assertEqual(len(list(client.iter_runs(workflow=name, status="succeeded", page_size=3))), 5)
        self.assertEqual(client.list_runs(workflow=name, status="FAILED")["runs"], [])
        with self.assertRaises(InvalidRequest) as e:
            client.list_runs(limit=0)
        self.assertIn("limit", e.exception.message)

    def test_history_and_map_items_come_in_pages(self) -> None:
        name = unique("py-map")
        each = {"type": "TRANSFORM", "config": {"output": "${ .item * 10 }"}}
        mapping: dict[str, Any] = {"items": "${ .input.xs }", "node": each}
        client.register_workflow(definition(name, [node("m", "MAP", **mapping)]))
        run_id = client.start_run(name, input={"xs": [1, 2, 3]})["id"]
        run = client.wait(run_id, 30)
        self.assertEqual((run["status"], run["output"]), ("SUCCEEDED", {"m": [10, 20, 30]}), run)

        items = list(client.iter_map_items(run_id, "m", page_size=2))
        self.assertEqual([(t.get("item_index"), t["output"]) for t in items], [(0, 10), (1, 20), (2, 30)])

        history = client.run_events(run_id)
        self.assertEqual((history[0]["type"], history[-1]["type"]), ("RunStarted", "RunSucceeded"))
        seqs = [e["seq"] for e in history]
        self.assertEqual(seqs, sorted(set(seqs)))
        self.assertEqual(list(client.iter_run_events(run_id, page_size=1)), history)
        self.assertEqual([e["seq"] for e in client.iter_run_events(run_id, after=seqs[1])], seqs[2:])


class ControlTest(unittest.TestCase):
    def test_an_event_completes_the_steps_waiting_for_it(self) -> None:
        name = unique("py-event")
        client.register_workflow(approval(name))
        run_id = client.start_run(name, input={"order": "e-1"})["id"]
        until_waiting(run_id)
        self.assertEqual(client.send_event("approved", "e-2", {"by": "nobody"}), {"matched": 0, "buffered": True})
        self.assertEqual(client.send_event("approved", "e-1", {"by": "ada"}), {"matched": 1, "buffered": False})
        run = client.wait(run_id, 30)
        self.assertEqual(run["status"], "SUCCEEDED", run)
        self.assertEqual(run["output"], {"done": {"by": "ada"}})

    def test_cancel_ends_an_open_run_and_refuses_an_ended_one(self) -> None:
        name = unique("py-cancel")
        client.register_workflow(approval(name))
        run_id = client.start_run(name, input={"order": "c-1"})["id"]
        until_waiting(run_id)
        cancelled = client.cancel(run_id)
        self.assertEqual(cancelled["status"], "CANCELLED")
        waiting = task(cancelled, "approval")
        assert waiting is not None
        self.assertEqual(waiting["state"], "CANCELLED")
        self.assertEqual(client.wait(run_id, 5)["status"], "CANCELLED")
        with self.assertRaises(Conflict) as e:
            client.cancel(run_id)
        self.assertEqual((e.exception.status, e.exception.code), (409, "conflict"))

    def test_retry_runs_a_failed_run_again_from_its_failed_step(self) -> None:
        name = unique("py-retry")
        client.register_workflow(approval(name, timeout="1s"))
        run_id = client.start_run(name, input={"order": "r-1"})["id"]
        failed = client.wait(run_id, 30)
        self.assertEqual(failed["status"], "FAILED", failed)
        with self.assertRaises(Conflict):
            client.pause(run_id)
        # Kept for the retried wait, which takes it at once.
        self.assertTrue(client.send_event("approved", "r-1", {"by": "retry"})["buffered"])
        retried = client.retry(run_id)
        self.assertIn(retried["status"], ("RUNNING", "SUCCEEDED"))
        run = client.wait(run_id, 30)
        self.assertEqual(run["status"], "SUCCEEDED", run)
        self.assertEqual(run["output"], {"done": {"by": "retry"}})
        again = task(run, "approval")
        assert again is not None
        self.assertEqual(again["attempt"], 2)
        self.assertIn("RunRetried", [e["type"] for e in client.run_events(run_id)])
        with self.assertRaises(Conflict):
            client.retry(run_id)

    def test_pause_holds_what_comes_next_until_resume(self) -> None:
        name = unique("py-pause")
        client.register_workflow(approval(name))
        run_id = client.start_run(name, input={"order": "p-1"})["id"]
        until_waiting(run_id)
        with self.assertRaises(Conflict):
            client.resume(run_id)
        self.assertEqual(client.pause(run_id)["status"], "PAUSED")
        with self.assertRaises(Conflict):
            client.pause(run_id)
        self.assertEqual(client.send_event("approved", "p-1", {"by": "paused"})["matched"], 1)
        time.sleep(0.5)
        run = client.get_run(run_id)
        self.assertEqual(run["status"], "PAUSED", run)
        started = task(run, "approval")
        assert started is not None
        self.assertEqual(started["state"], "COMPLETED", "a started step finishes")
        held = task(run, "done")
        self.assertTrue(held is None or held["state"] not in ("COMPLETED", "RUNNING"), f"nothing new starts: {run}")
        with self.assertRaises(WaitTimeout):
            client.wait(run_id, timeout=1)

        self.assertIn(client.resume(run_id)["status"], ("RUNNING", "SUCCEEDED"))
        run = client.wait(run_id, 30)
        self.assertEqual((run["status"], run["output"]), ("SUCCEEDED", {"done": {"by": "paused"}}), run)
        with self.assertRaises(Conflict):
            client.resume(run_id)


class ErrorTest(unittest.TestCase):
    def test_what_does_not_exist_is_not_found(self) -> None:
        missing = str(uuid.uuid4())
        with self.assertRaises(NotFound) as e:
            client.get_run(missing)
        self.assertEqual(e.exception.status, 404)
        self.assertIn(e.exception.code, ("not_found", "run_not_found"))
        self.assertIn(missing, e.exception.message)
        with self.assertRaises(NotFound):
            client.cancel(missing)
        with self.assertRaises(NotFound):
            client.run_events(missing)
        with self.assertRaises(NotFound) as e:
            client.get_workflow("py-no-such-workflow")
        self.assertIn("py-no-such-workflow", e.exception.message)
        with self.assertRaises(NotFound):
            client.start_run("py-no-such-workflow")
        name = unique("py-versions-404")
        client.register_workflow(echo(name))
        with self.assertRaises(NotFound):
            client.get_workflow(name, version=7)
        with self.assertRaises(NotFound):
            client.start_run(name, version=7)
        with self.assertRaises(NotFound):
            client.get_workflow("a/../../v1/runs")  # a name stays one path segment

    def test_a_bad_request_is_invalid_with_the_servers_code_and_message(self) -> None:
        with self.assertRaises(InvalidRequest) as e:
            client.get_run("not-a-uuid")
        self.assertEqual((e.exception.status, e.exception.code), (400, "invalid_request"))
        self.assertIn("UUID", e.exception.message)
        self.assertIn("400 invalid_request", str(e.exception))
        with self.assertRaises(InvalidRequest) as e:
            client.register_workflow({"name": "py-bad", "nodes": []})
        self.assertEqual((e.exception.status, e.exception.code), (400, "invalid_definition"))
        with self.assertRaises(InvalidRequest) as e:
            client.register_workflow(definition("py-bad", [node("a", "WAIT", duration="soon")]))
        self.assertIn("duration", e.exception.message)
        with self.assertRaises(InvalidRequest) as e:
            client.list_runs(status="bogus")
        self.assertIn("status", e.exception.message)
        with self.assertRaises(InvalidRequest):
            client.send_event("", "k")
        self.assertTrue(issubclass(InvalidRequest, ComposerError))

    def test_no_server_is_unavailable(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        nobody = Client(f"http://127.0.0.1:{port}", timeout=2)
        with self.assertRaises(Unavailable) as e:
            nobody.list_workflows()
        self.assertEqual((e.exception.status, e.exception.code), (None, "unreachable"))
        with self.assertRaises(Unavailable):
            nobody.wait(str(uuid.uuid4()), timeout=0.5)


class ExampleTest(unittest.TestCase):
    def test_the_client_example_runs_a_workflow_to_its_end(self) -> None:
        env = dict(os.environ, COMPOSER_URL=DEV.url, PYTHONPATH=PACKAGE_ROOT)
        env.pop("COMPOSER_API_TOKEN", None)
        example = os.path.join(PACKAGE_ROOT, "examples", "start_and_wait.py")
        done = subprocess.run(
            [sys.executable, example, "Ada"], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("SUCCEEDED", done.stdout)
        self.assertIn("Hello, Ada", done.stdout)


if __name__ == "__main__":
    unittest.main()
