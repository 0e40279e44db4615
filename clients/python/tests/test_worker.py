"""The worker against a real `composer dev` (a lease of 2 s, so takeovers
are quick): steps run with only a URL, task errors, a worker killed
mid-task, a graceful stop, a lost lease, logging; and against a stub
coordinator, reports that are retried. Secrets are resolved and scrubbed."""

import base64
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import unittest
import urllib.parse
import uuid
from typing import Any, Optional
from unittest import mock

import composer_worker
from composer_client import Client, Run, worker
from composer_client.worker import LeaseLost, Task, TaskError, Worker

from .support import (
    PACKAGE_ROOT,
    Answer,
    DevServer,
    InBackground,
    Request,
    StubServer,
    answer,
    definition,
    node,
    unique,
)

DEV = DevServer(COMPOSER_LEASE_TTL="2s")
client = Client("http://127.0.0.1:9")  # replaced in setUpModule


def setUpModule() -> None:
    global client
    DEV.start()
    client = Client(DEV.url, timeout=30)


def tearDownModule() -> None:
    DEV.stop()


def start(workflow: str, nodes: list[dict[str, Any]], edges: Any = (), input: Any = None) -> str:
    client.register_workflow(definition(workflow, nodes, list(edges)))
    return client.start_run(workflow, input=input or {})["id"]


def until_state(run_id: str, state: str, timeout: float = 30) -> Run:
    deadline = time.monotonic() + timeout
    while True:
        run = client.get_run(run_id)
        if run["tasks"] and run["tasks"][0]["state"] == state:
            return run
        if time.monotonic() > deadline:
            raise AssertionError(f"the task never reached {state}: {run}")
        time.sleep(0.05)


class Records(logging.Handler):
    """Keeps every record of the `composer_client` loggers, formatted."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.logger = logging.getLogger("composer_client")

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> "Records":
        self.level_was = self.logger.level
        self.logger.setLevel(logging.DEBUG)
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level_was)

    def text(self) -> str:
        return "\n".join(f"{r.levelname} {r.name} {r.getMessage()}" for r in self.records)

    def at(self, level: int) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == level]


class SecretsTest(unittest.TestCase):
    def test_references_are_resolved_escapes_unescaped_and_values_scrubbed(self) -> None:
        with mock.patch.dict(os.environ, {"COMPOSER_SECRET_API_KEY": "s3cr3t-value"}):
            used: list[str] = []
            refs = {"h": "Bearer ${ .secrets.API_KEY }", "data": "$${ .input.x }", "n": 1}
            refs["$${k}"] = ["${.secrets.API_KEY}"]
            got = worker._resolve(refs, used)
            self.assertEqual(
                got, {"h": "Bearer s3cr3t-value", "data": "${ .input.x }", "n": 1, "${k}": ["s3cr3t-value"]}
            )
            self.assertEqual(used, ["s3cr3t-value"])
            self.assertEqual(worker._scrub({"echo": "got s3cr3t-value"}, used), {"echo": "got [secret]"})
            with self.assertRaises(TaskError) as e:
                worker._resolve("${ .secrets.MISSING }", [])
            self.assertFalse(e.exception.retryable)
            self.assertNotIn("s3cr3t-value", repr(Task("t", "r", 1, "n", "x", "q", got, 1000)), "repr leaves input out")

    def test_a_secret_is_scrubbed_in_any_case_url_encoded_json_escaped_or_in_base64(self) -> None:
        secret = 'Sup3r"Secr€t/+=?&x'
        forms = [
            secret.upper(),
            urllib.parse.quote(secret),
            urllib.parse.quote(secret).lower(),
            urllib.parse.quote_plus(secret),
            json.dumps({"t": secret}),
            base64.b64encode(secret.encode()).decode(),
            base64.urlsafe_b64encode(secret.encode()).decode(),
            "Basic " + base64.b64encode(("user:" + secret).encode()).decode(),
        ]
        for form in forms:
            scrubbed = worker._scrub(form, [secret])
            self.assertIn("[secret]", scrubbed, form)
            self.assertNotIn("Secr", scrubbed, form)
        # A short one is found only as it is: its encodings would match ordinary text.
        self.assertEqual(worker._scrub("zq and ZQ", ["zq"]), "[secret] and ZQ")

    def test_the_old_module_name_still_imports_the_worker(self) -> None:
        self.assertIs(composer_worker.Worker, Worker)
        self.assertIs(composer_worker.Task, Task)
        self.assertIs(composer_worker.TaskError, TaskError)
        self.assertIs(composer_worker.LeaseLost, LeaseLost)
        self.assertIs(composer_worker._resolve, worker._resolve)


class WorkerTest(unittest.TestCase):
    def test_a_workflow_of_python_steps_runs_with_only_a_url(self) -> None:
        attempts: dict[str, int] = {}

        def double(task: Task) -> Any:
            attempts[task.node_id] = attempts.get(task.node_id, 0) + 1
            if task.node_id == "b" and attempts["b"] == 1:
                raise RuntimeError("flaky once")
            return {"n": task.input["n"] * 2}

        nodes = [
            node("a", "double", "py1", n="${ .input.n }"),
            node("b", "double", "py1", n="${ .nodes.a.output.n }"),
            node("c", "double", "py1", n="${ .nodes.b.output.n }"),
        ]
        run_id = start(unique("py-double"), nodes, [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}], {"n": 3})
        with InBackground(Worker(DEV.url, queues=["py1"], poll_wait=1).handle("double", double)):
            run = client.wait(run_id, 60)
        self.assertEqual(run["status"], "SUCCEEDED", run)
        self.assertEqual(run["output"]["c"], {"n": 24}, run)
        self.assertEqual(attempts, {"a": 1, "b": 2, "c": 1})

    def test_a_worker_without_queues_polls_its_handlers_default_queues(self) -> None:
        # A custom node without a `queue` goes to its type in lower case
        # (the coordinator's rule); a worker given no queues polls just that.
        node_type = "Resize" + uuid.uuid4().hex[:8].upper()
        seen: list[str] = []

        def resize(task: Task) -> Any:
            seen.append(task.queue)
            return {"size": task.input["size"] // 2}

        run_id = start(unique("py-default-queue"), [node("r", node_type, size="${ .input.size }")], input={"size": 8})
        w = Worker(DEV.url, poll_wait=1).handle(node_type, resize)
        with InBackground(w):
            run = client.wait(run_id, 30)
        self.assertEqual(run["status"], "SUCCEEDED", run)
        self.assertEqual(run["output"], {"r": {"size": 4}})
        self.assertEqual(seen, [node_type.lower()])
        self.assertEqual(w.queues, [node_type.lower()])

    def test_the_default_queues_are_the_handlers_types_in_lower_case_each_once_and_checked_at_start(self) -> None:
        def noop(task: Task) -> Any:
            return None

        w = Worker("http://127.0.0.1:9").handle("Thumb", noop).handle("thumb", noop).handle("Resize-Image.v2", noop)
        self.assertEqual(w.queues, ["resize-image.v2", "thumb"])
        self.assertEqual(Worker("http://127.0.0.1:9", queues=["a", "b"]).handle("Thumb", noop).queues, ["a", "b"])
        self.assertEqual(Worker("http://127.0.0.1:9", queues=[]).handle("Thumb", noop).queues, ["thumb"])
        # Only ASCII letters are lowered, as the coordinator does.
        self.assertEqual(worker._default_queue("ÀB"), "Àb")
        # What the task API would refuse in every poll is refused by run(), before any.
        with self.assertRaisesRegex(ValueError, "no handlers"):
            Worker("http://127.0.0.1:9").run()
        with self.assertRaisesRegex(ValueError, r"handler for type 'has space'.*pass queues"):
            Worker("http://127.0.0.1:9").handle("has space", noop).run()
        many = Worker("http://127.0.0.1:9")
        for i in range(33):
            many.handle(f"t{i}", noop)
        with self.assertRaisesRegex(ValueError, r"33 queues \(one per handler type\): a worker may poll at most 32"):
            many.run()

    def test_explicit_queues_that_miss_a_handler_s_default_queue_warn_at_start(self) -> None:
        def noop(task: Task) -> Any:
            return None

        w = Worker(DEV.url, queues=["images"], poll_wait=1, worker_id="py-misses").handle("Resize", noop)
        w.handle("images", noop)  # its default queue is polled: no warning for it
        shown = "'Resize'.* goes to queue 'resize', which this worker does not poll"
        warned = self.assertWarnsRegex(UserWarning, shown)
        with warned, self.assertLogs("composer_client.worker", logging.WARNING) as logs, InBackground(w):
            pass
        warnings = [m for m in logs.output if "does not poll" in m]
        self.assertEqual(
            warnings,
            [
                "WARNING:composer_client.worker:worker py-misses: handler for type 'Resize': a node of this type "
                "without a `queue` goes to queue 'resize', which this worker does not poll (it polls images)"
            ],
        )

    def test_the_step_a_report_made_ready_comes_leased_with_its_answer_eager_dispatch(self) -> None:
        ran: list[str] = []

        def inc(task: Task) -> Any:
            ran.append(task.node_id)
            return {"n": task.input["n"] + 1}

        nodes = [
            node("a", "inc", "py-eager", n="${ .input.n }"),
            node("b", "inc", "py-eager", n="${ .nodes.a.output.n }"),
            node("c", "inc", "py-eager", n="${ .nodes.b.output.n }"),
        ]
        run_id = start(unique("py-eager"), nodes, [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}], {"n": 1})
        w = Worker(DEV.url, queues=["py-eager"], poll_wait=1).handle("inc", inc)
        post = w._post
        reports: list[tuple[Any, Any]] = []
        echoed: list[tuple[Any, list[str]]] = []

        def recording(
            path: str, body: Any, timeout: Optional[float] = None, headers: Optional[dict[str, str]] = None
        ) -> Any:
            ack = post(path, body, timeout, headers)
            if path.endswith(("/complete", "/fail")):
                reports.append((body.get("next"), ack))
                echoed.append((headers, sorted(body.get("stages") or {})))
            return ack

        with mock.patch.object(w, "_post", side_effect=recording), InBackground(w):
            run = client.wait(run_id, 60)
        self.assertEqual(run["status"], "SUCCEEDED", run)
        self.assertEqual(run["output"], {"c": {"n": 4}}, run)
        self.assertEqual(ran, ["a", "b", "c"])
        # Each result names its run's priority and sends back its lease's stages with the handler's.
        for headers, stages in echoed:
            self.assertEqual(headers, {"composer-priority": "3"})
            self.assertIn("leased_at_us", stages)
            self.assertTrue({"started_at_us", "finished_at_us"} <= set(stages), stages)
        self.assertEqual([asked for asked, _ in reports], [{"queues": ["py-eager"], "max": 1}] * 3)
        # a's answer leased b, b's leased c; c ended the run.
        taken = [[t["node_id"] for t in ack.get("next", [])] for _, ack in reports]
        self.assertEqual(taken, [["b"], ["c"], []], reports)
        for _, ack in reports:
            self.assertLessEqual(set(ack), {"applied", "ignored", "next"}, ack)
            for t in ack.get("next", []):
                self.assertEqual(
                    set(t) - {"traceparent", "stages"},
                    {"id", "run_id", "attempt", "node_id", "node_type", "queue", "input", "lease_ttl_ms", "priority"},
                )

    def test_an_urgent_slot_runs_a_priority_1_run_while_the_one_other_slot_is_held(self) -> None:
        ran: list[str] = []
        release = threading.Event()

        def job(task: Task) -> Any:
            ran.append(task.input["who"])
            if task.input["who"] == "bulk":
                release.wait(30)
            return {}

        queue = unique("py-urgent")
        one = [node("s", "job", queue, who="${ .input.who }")]
        bulk, normal, urgent = unique("py-bulk"), unique("py-normal"), unique("py-urgent")
        for name in (bulk, normal):
            client.register_workflow(definition(name, one))
        steps = [node("a", "job", queue, who="urgent-a"), node("b", "job", queue, who="urgent-b")]
        client.register_workflow(definition(urgent, steps, [{"from": "a", "to": "b"}]))
        bulk_run = client.start_run(bulk, input={"who": "bulk"}, priority=5)["id"]
        w = Worker(DEV.url, queues=[queue], poll_wait=1, concurrency=1, urgent_slots=1).handle("job", job)
        polls: list[Any] = []
        post = w._post

        def recording(
            path: str, body: Any, timeout: Optional[float] = None, headers: Optional[dict[str, str]] = None
        ) -> Any:
            if path == "/v1/tasks/poll":
                polls.append(body.get("priority_at_most"))
            return post(path, body, timeout, headers)

        with mock.patch.object(w, "_post", side_effect=recording), InBackground(w):
            deadline = time.monotonic() + 30
            while not ran:  # the bulk step holds the one ordinary slot
                self.assertLess(time.monotonic(), deadline, "the bulk step never started")
                time.sleep(0.02)
            normal_run = client.start_run(normal, input={"who": "normal"})["id"]
            urgent_run = client.start_run(urgent, priority=1)["id"]
            self.assertEqual(client.wait(urgent_run, 30)["status"], "SUCCEEDED")
            # The default priority waits for the ordinary slot, however often the urgent slot polls.
            time.sleep(0.3)
            self.assertEqual(ran, ["bulk", "urgent-a", "urgent-b"])
            release.set()
            self.assertEqual(client.wait(bulk_run, 30)["status"], "SUCCEEDED")
            self.assertEqual(client.wait(normal_run, 30)["status"], "SUCCEEDED")
        self.assertEqual(ran, ["bulk", "urgent-a", "urgent-b", "normal"])
        self.assertIn(2, polls)
        self.assertIn(None, polls)

    def test_slots_out_of_range_are_refused_by_name(self) -> None:
        for concurrency, urgent_slots, name in (
            (0, 0, "concurrency"),
            (10_001, 0, "concurrency"),
            (1, -1, "urgent_slots"),
            (1, 10_001, "urgent_slots"),
        ):
            with self.assertRaisesRegex(ValueError, name):
                Worker("http://127.0.0.1:9", concurrency=concurrency, urgent_slots=urgent_slots)

    def test_a_task_error_that_is_not_retryable_fails_the_run_with_its_message(self) -> None:
        def refuse(task: Task) -> Any:
            raise TaskError("width must be positive", retryable=False)

        run_id = start(unique("py-refuse"), [node("r", "refuse", "py2")])
        with InBackground(Worker(DEV.url, queues=["py2"], poll_wait=1).handle("refuse", refuse)):
            run = client.wait(run_id, 60)
        self.assertEqual(run["status"], "FAILED", run)
        self.assertIn("width must be positive", run["tasks"][0]["error"] or "")
        self.assertEqual(run["tasks"][0]["attempt"], 1, "not retried")

    def test_a_task_error_s_code_and_status_are_the_step_s_error_info(self) -> None:
        def charge(task: Task) -> Any:
            raise TaskError("the card was declined", retryable=False, code="card_declined", status=402)

        run_id = start(unique("py-declined"), [node("c", "charge", "py9")])
        with InBackground(Worker(DEV.url, queues=["py9"], poll_wait=1).handle("charge", charge)):
            run = client.wait(run_id, 60)
        self.assertEqual(run["status"], "FAILED", run)
        task = run["tasks"][0]
        self.assertEqual(task["error_info"]["code"], "card_declined", task)
        self.assertEqual(task["error_info"]["status"], 402, task)
        self.assertIs(task["error_info"]["retryable"], False, task)
        self.assertIn("the card was declined", task["error"] or "")

    def test_a_task_error_s_code_and_status_are_checked_when_it_is_made(self) -> None:
        for code in ["", "Card", "a b", "x" * 65, "é"]:
            with self.assertRaises(ValueError, msg=code):
                TaskError("no", code=code)
        for status in [99, 600, True, 402.0]:
            with self.assertRaises(ValueError, msg=repr(status)):
                TaskError("no", status=status)  # type: ignore[arg-type]
        made = TaskError("no", code="a.b-c_9", status=599)
        self.assertEqual((made.code, made.status, made.retryable), ("a.b-c_9", 599, True))
        self.assertEqual((TaskError("no").code, TaskError("no").status), (None, None))
        for ms in [-1, 1.5, True, "1000", 2**63]:
            with self.assertRaises(ValueError, msg=repr(ms)):
                TaskError("slow down", status=429, retry_after_ms=ms)  # type: ignore[arg-type]
        self.assertEqual(TaskError("slow down", status=429, retry_after_ms=0).retry_after_ms, 0)
        self.assertIsNone(TaskError("no").retry_after_ms)

    def test_a_429_s_retry_after_delays_the_next_attempt_and_holds_its_limit(self) -> None:
        key = unique("py-throttled")
        began: list[float] = []

        def charge(task: Task) -> Any:
            began.append(time.monotonic())
            if task.attempt == 1:
                raise TaskError("rate limited", code="rate_limited", status=429, retry_after_ms=2000)
            return {"charged": task.attempt}

        call = node("c", "charge", "py-ra")  # retried after 50 ms but for the Retry-After
        call["limits"] = [{"key": key, "concurrency": 5}]
        run_id = start(unique("py-retry-after"), [call])
        with InBackground(Worker(DEV.url, queues=["py-ra"], poll_wait=1).handle("charge", charge)):
            deadline = time.monotonic() + 30
            limit = client.get_limit(key) if began else None
            while not (limit and limit.get("held_until")) and time.monotonic() < deadline:
                time.sleep(0.05)
                limit = client.get_limit(key) if began else None
            self.assertTrue(limit and limit.get("held_until"), f"the key is held: {limit}")
            run = client.wait(run_id, 60)
        self.assertEqual((run["status"], run["output"]), ("SUCCEEDED", {"c": {"charged": 2}}), run)
        self.assertEqual(len(began), 2)
        self.assertGreaterEqual(began[1] - began[0], 1.8, "the second attempt waited for the Retry-After")

    def test_a_worker_killed_mid_task_loses_it_to_another_that_finishes_it(self) -> None:
        run_id = start(unique("py-resize"), [node("thumb", "resize-image", "images", width=64)])
        env = dict(os.environ, COMPOSER_URL=DEV.url, RESIZE_SECONDS="600", PYTHONPATH=PACKAGE_ROOT, LOG_LEVEL="ERROR")
        example = os.path.join(PACKAGE_ROOT, "examples", "resize_worker.py")
        doomed = subprocess.Popen([sys.executable, example], env=env)
        try:
            until_state(run_id, "RUNNING")
        finally:
            doomed.kill()  # SIGKILL: no goodbye, the lease just stops being renewed
            doomed.wait()

        def resize(task: Task) -> Any:
            return {"width": task.input["width"], "by": "survivor"}

        with InBackground(Worker(DEV.url, queues=["images"], poll_wait=1).handle("resize-image", resize)):
            run = client.wait(run_id, 60)
        self.assertEqual(run["status"], "SUCCEEDED", run)
        self.assertEqual(run["output"]["thumb"], {"width": 64, "by": "survivor"})
        self.assertEqual(run["tasks"][0]["attempt"], 1, "taken over at the same attempt")

    def test_stop_lets_the_running_task_finish_and_report(self) -> None:
        started = threading.Event()

        def slow(task: Task) -> Any:
            started.set()
            time.sleep(1.5)
            return "done"

        run_id = start(unique("py-slow"), [node("s", "slow", "py3")])
        bg = InBackground(Worker(DEV.url, queues=["py3"], poll_wait=1).handle("slow", slow))
        bg.__enter__()
        self.assertTrue(started.wait(30))
        bg.__exit__(None, None, None)  # stop() while the task runs
        run = client.wait(run_id, timeout=10)
        self.assertEqual(run["status"], "SUCCEEDED", run)
        self.assertEqual(run["output"]["s"], "done")

    def test_sigterm_stops_a_worker_process_after_its_task_reported(self) -> None:
        run_id = start(unique("py-term"), [node("thumb", "resize-image", "images-term", width=8)])
        env = dict(os.environ, COMPOSER_URL=DEV.url, RESIZE_SECONDS="2", PYTHONPATH=PACKAGE_ROOT, LOG_LEVEL="INFO")
        env["QUEUE"] = "images-term"
        example = os.path.join(PACKAGE_ROOT, "examples", "resize_worker.py")
        proc = subprocess.Popen([sys.executable, example], env=env, stderr=subprocess.PIPE, text=True)
        try:
            until_state(run_id, "RUNNING")
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        self.assertEqual(proc.returncode, 0, stderr)
        self.assertIn("SIGTERM received", stderr)
        self.assertIn("stopped", stderr)
        run = client.wait(run_id, timeout=10)
        self.assertEqual(run["status"], "SUCCEEDED", run)
        self.assertEqual(run["output"]["thumb"]["width"], 8)

    def test_a_task_longer_than_its_lease_keeps_it_by_heartbeating(self) -> None:
        calls: list[str] = []

        def long(task: Task) -> Any:
            calls.append(task.id)
            time.sleep(3.5)  # the lease is 2 s
            return {"cancelled": task.cancelled.is_set()}

        run_id = start(unique("py-long"), [node("l", "long", "py6")])
        with InBackground(Worker(DEV.url, queues=["py6"], poll_wait=1, concurrency=2).handle("long", long)):
            run = client.wait(run_id, 30)
        self.assertEqual(run["status"], "SUCCEEDED", run)
        self.assertEqual(run["output"]["l"], {"cancelled": False})
        self.assertEqual(len(calls), 1, "never taken over, not even by this worker's next poll")
        self.assertEqual(run["tasks"][0]["attempt"], 1)

    def test_a_lost_lease_drops_the_result_and_is_logged(self) -> None:
        started = threading.Event()
        saw_cancel = threading.Event()

        def hang(task: Task) -> Any:
            started.set()
            if task.cancelled.wait(20):
                saw_cancel.set()
            return {"late": True}

        run_id = start(unique("py-lost"), [node("h", "hang", "py4")])
        with Records() as logs, InBackground(Worker(DEV.url, queues=["py4"], poll_wait=1).handle("hang", hang)):
            self.assertTrue(started.wait(30))
            client.cancel(run_id)  # the lease goes with the run: the next heartbeat gets 409
            self.assertTrue(saw_cancel.wait(10), "task.cancelled was set")
            time.sleep(0.2)
        run = client.get_run(run_id)
        self.assertEqual((run["status"], run["tasks"][0]["state"]), ("CANCELLED", "CANCELLED"))
        self.assertNotIn("output", run, "the late result was dropped")
        warnings = logs.at(logging.WARNING)
        self.assertTrue(any("lease lost" in w for w in warnings), logs.text())
        self.assertTrue(any("result is dropped" in w for w in warnings), logs.text())

    def test_it_logs_start_stop_and_each_task_without_inputs_or_secrets(self) -> None:
        def leak(task: Task) -> Any:
            if task.input["fail"]:
                raise ValueError(f"could not use {task.input['token']} for {task.input['private']}")
            return {"echo": task.input["token"]}

        name = unique("py-logs")
        nodes = [node("ok", "leak", "py5", token="${ .secrets.LOG_TOKEN }", private="${ .input.private }", fail=False)]
        nodes.append(node("bad", "leak", "py5", token="${ .secrets.LOG_TOKEN }", private="${ .input.private }",
                          fail=True))  # fmt: skip
        client.register_workflow(definition(name, nodes, [{"from": "ok", "to": "bad"}]))
        secret = "tok-9f8e7d6c"
        with mock.patch.dict(os.environ, {"COMPOSER_SECRET_LOG_TOKEN": secret}), Records() as logs:
            run_id = client.start_run(name, input={"private": "card-4242"})["id"]
            with InBackground(Worker(DEV.url, queues=["py5"], poll_wait=1, worker_id="py-logger").handle("leak", leak)):
                run = client.wait(run_id, 60)
        self.assertEqual(run["status"], "FAILED", run)
        ok_task = next(t for t in run["tasks"] if t["node_id"] == "ok")
        self.assertEqual(ok_task["output"], {"echo": "[secret]"})
        bad_task = next(t for t in run["tasks"] if t["node_id"] == "bad")
        self.assertIn("could not use [secret]", bad_task["error"] or "")

        text = logs.text()
        self.assertNotIn(secret, text)
        self.assertNotIn("card-4242", text, "no input in the log")
        info = logs.at(logging.INFO)
        self.assertTrue(any("py-logger started" in m and "py5" in m for m in info), text)
        self.assertTrue(any("py-logger stopped" in m for m in info), text)
        debug = logs.at(logging.DEBUG)
        self.assertTrue(any(f"task {ok_task['id']} started" in m for m in debug), text)
        self.assertTrue(any(f"task {ok_task['id']} completed" in m for m in debug), text)
        failed = [m for m in debug if f"task {bad_task['id']} failed" in m]
        self.assertEqual(len(failed), 3, text)
        self.assertIn("ValueError", failed[0])
        self.assertIn("in leak", failed[0], "where it was raised")
        self.assertTrue(all(r.name.startswith("composer_client") for r in logs.records))


class TraceTest(unittest.TestCase):
    def test_a_handler_sees_its_attempt_s_traceparent_in_the_run_s_trace(self) -> None:
        seen: dict[str, Optional[str]] = {}

        def traced(task: Task) -> Any:
            seen[task.run_id] = task.traceparent
            return {"traceparent": task.traceparent}

        workflow = unique("py-traced")
        client.register_workflow(definition(workflow, [node("t", "traced", "py-trace")]))
        trace = uuid.uuid4().hex
        given = client.start_run(workflow, traceparent=f"00-{trace}-{uuid.uuid4().hex[:16]}-01")["id"]
        own = client.start_run(workflow)["id"]
        with InBackground(Worker(DEV.url, queues=["py-trace"], poll_wait=1).handle("traced", traced)):
            runs = [client.wait(given, 60), client.wait(own, 60)]
        self.assertEqual([r["status"] for r in runs], ["SUCCEEDED", "SUCCEEDED"], runs)
        traces = {}
        for run_id, tp in seen.items():
            assert isinstance(tp, str), seen
            match = re.fullmatch(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}", tp)
            assert match is not None, tp
            traces[run_id] = match.group(1)
        # The caller's trace, or the run's own (its id) when it gave none.
        self.assertEqual(traces, {given: trace, own: uuid.UUID(own).hex})
        self.assertEqual(runs[0]["output"], {"t": {"traceparent": seen[given]}})

        # A coordinator that sends none: None.
        leased = {"id": "t", "run_id": "r", "attempt": 1, "node_id": "n", "node_type": "x", "queue": "q"}
        self.assertIsNone(Task._of(dict(leased, input={}, lease_ttl_ms=1000)).traceparent)


class StepLogsTest(unittest.TestCase):
    def test_task_log_and_the_handler_s_logging_reach_the_step_scrubbed_before_its_result(self) -> None:
        secret = "py-log-s3cr3t"
        name = unique("logs")
        client.register_workflow(definition(name, [node("talk", "chatty", "py6", token="${ .secrets.PYLOG_TOKEN }")]))

        def chatty(task: Task) -> Any:
            task.log(f"token is {task.input['token']}")
            logging.getLogger("my.handler").warning("careful: <%s>", "markup")
            logging.getLogger("my.handler").debug("below the logger's level: not captured")
            return {"ok": True}

        logging.getLogger("my.handler").setLevel(logging.INFO)
        with mock.patch.dict(os.environ, {"COMPOSER_SECRET_PYLOG_TOKEN": secret}):
            run_id = client.start_run(name)["id"]
            with InBackground(Worker(DEV.url, queues=["py6"], poll_wait=1).handle("chatty", chatty)):
                run = client.wait(run_id, 60)
        self.assertEqual(run["status"], "SUCCEEDED", run)
        logs = client.step_logs(run_id, "talk")
        lines = [line["line"] for line in logs["lines"]]
        self.assertEqual(lines, ["token is [secret]", "WARNING my.handler: careful: <markup>"], logs)
        self.assertEqual(logs["attempts"], [{"attempt": 1, "lines": 2}])
        self.assertEqual([line["line"] for line in client.iter_step_logs(run_id, "talk")], lines)

    def test_a_flood_of_lines_is_bounded_and_says_how_many_it_dropped(self) -> None:
        t = Task("t", "r", 1, "n", "x", "q", {}, 1000)
        for i in range(worker.MAX_PENDING_LOG_LINES + 5):
            t.log(f"line {i}")
        taken = t._take_logs()
        self.assertEqual(len(taken), worker.MAX_PENDING_LOG_LINES + 1)
        self.assertIn("5 lines dropped", taken[-1])
        self.assertEqual(t._take_logs(), [])
        # What the coordinator can store: 4,096 bytes, valid UTF-8, no NUL.
        t.log("é" * 3000)
        t.log("a\x00b")
        t.log(b"\xff".decode("utf-8", "surrogateescape"))
        cut, nul, bad = t._take_logs()
        self.assertLessEqual(len(cut.encode()), 4096)
        self.assertEqual(nul, "a\ufffdb")
        bad.encode("utf-8")  # strict: no lone surrogate is left


class ReportRetryTest(unittest.TestCase):
    """A stub coordinator: one task, and a completion refused with 503 twice;
    failures with a Retry-After."""

    def test_retry_after_ms_is_sent_with_a_429_only(self) -> None:
        def leased(n: int) -> dict[str, Any]:
            return {
                "id": f"t-{n}", "run_id": "r-1", "attempt": 1, "node_id": f"n{n}", "node_type": "call", "queue": "q",
                "input": {"status": [429, 503, 429][n]}, "lease_ttl_ms": 10000,
                "priority": [1, 5, 9][n], "stages": [{"leased_at_us": 100, "a_newer_stage_us": 5}, {}, "not stages"][n],
            }  # fmt: skip

        polls: list[int] = []
        fails: dict[str, Any] = {}
        priorities: dict[str, Optional[str]] = {}
        stages: dict[str, Any] = {}

        def respond(r: Request) -> Answer:
            if r.route == "/v1/tasks/poll":
                polls.append(1)
                return answer(200, {"tasks": [leased(n) for n in range(3)] if len(polls) == 1 else []})
            if r.route.endswith("/fail"):
                task = r.route.split("/")[3]
                stages[task] = r.body.pop("stages", None)
                fails[task] = r.body
                priorities[task] = next((v for k, v in r.headers.items() if k.lower() == "composer-priority"), None)
            return answer(200, {"applied": True})

        def call(task: Task) -> Any:
            wait = None if task.node_id == "n2" else 1500
            raise TaskError("throttled", status=task.input["status"], retry_after_ms=wait)

        with StubServer(respond) as stub:
            w = Worker(stub.url, queues=["q"], poll_wait=0.1, worker_id="py-stub").handle("call", call)
            with InBackground(w):
                deadline = time.monotonic() + 20
                while len(fails) < 3 and time.monotonic() < deadline:
                    time.sleep(0.05)
        lease = {"worker_id": "py-stub", "run_id": "r-1", "attempt": 1, "error": "throttled", "retryable": True}
        lease["next"] = {"queues": ["q"], "max": 1}  # each asks for the next task (eager dispatch, on by default)
        self.assertEqual(
            fails,
            {
                "t-0": {**lease, "status": 429, "retry_after_ms": 1500},
                "t-1": {**lease, "status": 503},
                "t-2": {**lease, "status": 429},
            },
        )
        # The run's priority goes back as a header (one that is not a priority as the default, 3) ...
        self.assertEqual(priorities, {"t-0": "1", "t-1": "5", "t-2": "3"})
        # ... and the lease's stages in the body, with when the handler ran: only stages the API
        # knows, and none when the lease had none.
        self.assertEqual(set(stages["t-0"]), {"leased_at_us", "started_at_us", "finished_at_us"})
        self.assertEqual(stages["t-0"]["leased_at_us"], 100)
        self.assertLessEqual(stages["t-0"]["started_at_us"], stages["t-0"]["finished_at_us"])
        self.assertEqual((stages["t-1"], stages["t-2"]), (None, None))

    def test_a_report_is_retried_through_5xx_and_each_retry_is_logged(self) -> None:
        leased = {
            "id": "t-1", "run_id": "r-1", "attempt": 1, "node_id": "n", "node_type": "echo", "queue": "q",
            "input": {"x": 1}, "lease_ttl_ms": 10000, "a_field_of_a_newer_server": True,
        }  # fmt: skip
        polls: list[int] = []
        completes: list[Any] = []

        def respond(r: Request) -> Answer:
            if r.route == "/v1/tasks/poll":
                polls.append(1)
                return answer(200, {"tasks": [leased] if len(polls) == 1 else []})
            if r.route == "/v1/tasks/t-1/complete":
                completes.append(r.body)
                if len(completes) <= 2:
                    return answer(503, {"error": {"code": "busy", "message": "the engine is busy; retry shortly"}})
                return answer(200, {"applied": True})
            return answer(404, {"error": {"code": "not_found", "message": "no such endpoint"}})

        with StubServer(respond) as stub, Records() as logs:
            w = Worker(stub.url, queues=["q"], poll_wait=0.1, worker_id="py-stub").handle("echo", lambda t: t.input)
            with InBackground(w):
                deadline = time.monotonic() + 20
                while len(completes) < 3 and time.monotonic() < deadline:
                    time.sleep(0.05)
        self.assertEqual(len(completes), 3, logs.text())
        lease = {"worker_id": "py-stub", "run_id": "r-1", "attempt": 1}
        self.assertEqual(completes[-1], {**lease, "output": {"x": 1}, "next": {"queues": ["q"], "max": 1}})
        retries = [m for m in logs.at(logging.WARNING) if "reporting complete failed" in m]
        self.assertEqual(len(retries), 2, logs.text())
        self.assertIn("busy", retries[0])
        self.assertEqual(logs.at(logging.ERROR), [])


if __name__ == "__main__":
    unittest.main()
