"""Tests of the Python worker against a real `composer dev` (its embedded
PostgreSQL and Redis). Usage: COMPOSER_BIN=target/debug/composer
python3 -m unittest clients/python/test_worker.py"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import composer_worker  # noqa: E402
from composer_worker import Task, TaskError, Worker  # noqa: E402

DEV = None
URL = ""
WORK = ""


def setUpModule():
    global DEV, URL, WORK
    binary = os.path.abspath(os.environ.get("COMPOSER_BIN", "target/debug/composer"))
    WORK = tempfile.mkdtemp()
    os.chmod(WORK, 0o755)  # run as root, the embedded PostgreSQL runs as postgres
    env = dict(os.environ, COMPOSER_LISTEN="127.0.0.1:0", COMPOSER_ADDR_FILE=os.path.join(WORK, "addr"),
               COMPOSER_LOG="error", COMPOSER_TASK_LEASE_TTL="2s")
    env.pop("COMPOSER_API_TOKEN", None)
    with open(os.path.join(WORK, "dev.log"), "w") as log:
        DEV = subprocess.Popen([binary, "dev"], cwd=WORK, env=env, stdout=subprocess.DEVNULL, stderr=log)
    for _ in range(600):
        path = os.path.join(WORK, "addr")
        if os.path.exists(path) and os.path.getsize(path) > 0:
            with open(path) as f:
                URL = f.read().strip()
            return
        if DEV.poll() is not None:
            break
        time.sleep(0.1)
    with open(os.path.join(WORK, "dev.log")) as f:
        raise RuntimeError("composer dev did not start: " + f.read())


def tearDownModule():
    if DEV is not None:
        DEV.send_signal(signal.SIGTERM)
        try:
            DEV.wait(30)
        except subprocess.TimeoutExpired:
            DEV.kill()
    shutil.rmtree(WORK, ignore_errors=True)


def call(method, path, body=None):
    req = urllib.request.Request(URL + path, method=method,
                                 data=None if body is None else json.dumps(body).encode())
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=70) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def start(workflow, nodes, edges=(), input=None):
    status, body = call("POST", "/v1/workflows", {"name": workflow, "nodes": nodes, "edges": list(edges)})
    assert status in (200, 201), body
    status, run = call("POST", "/v1/runs", {"workflow": workflow, "input": input or {}})
    assert status == 201, run
    return run["id"]


def wait_for(run_id, timeout=60):
    deadline = time.time() + timeout
    while True:
        _, run = call("GET", f"/v1/runs/{run_id}?wait=5s")
        if run["status"] in ("SUCCEEDED", "FAILED", "CANCELLED") or time.time() > deadline:
            return run


def node(id, type, queue, **config):
    return {"id": id, "type": type, "queue": queue, "config": config,
            "retry": {"max_attempts": 3, "initial_backoff": "50ms"}}


class InBackground:
    """A worker running on a thread for the length of a `with`."""

    def __init__(self, worker):
        self.worker = worker
        self.thread = threading.Thread(target=worker.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self.worker

    def __exit__(self, *exc):
        self.worker.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the worker did not stop"


class SecretsTest(unittest.TestCase):
    def test_references_are_resolved_escapes_unescaped_and_values_scrubbed(self):
        os.environ["COMPOSER_SECRET_API_KEY"] = "s3cr3t-value"
        used = []
        got = composer_worker._resolve(
            {"h": "Bearer ${ .secrets.API_KEY }", "data": "$${ .input.x }", "n": 1, "$${k}": ["${.secrets.API_KEY}"]},
            used)
        self.assertEqual(got, {"h": "Bearer s3cr3t-value", "data": "${ .input.x }", "n": 1, "${k}": ["s3cr3t-value"]})
        self.assertEqual(used, ["s3cr3t-value"])
        self.assertEqual(composer_worker._scrub({"echo": "got s3cr3t-value"}, used), {"echo": "got [secret]"})
        with self.assertRaises(TaskError) as e:
            composer_worker._resolve("${ .secrets.MISSING }", [])
        self.assertFalse(e.exception.retryable)


class WorkerTest(unittest.TestCase):
    def test_a_workflow_of_python_steps_runs_with_only_a_url(self):
        attempts = {}

        def double(task: Task):
            attempts[task.node_id] = attempts.get(task.node_id, 0) + 1
            if task.node_id == "b" and attempts["b"] == 1:
                raise RuntimeError("flaky once")
            return {"n": task.input["n"] * 2}

        nodes = [node("a", "double", "py1", n="${ .input.n }"),
                 node("b", "double", "py1", n="${ .nodes.a.output.n }"),
                 node("c", "double", "py1", n="${ .nodes.b.output.n }")]
        run_id = start("py-double", nodes, [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}], {"n": 3})
        with InBackground(Worker(URL, queues=["py1"], poll_wait=1).handle("double", double)):
            run = wait_for(run_id)
        self.assertEqual(run["status"], "SUCCEEDED", run)
        self.assertEqual(run["output"]["c"], {"n": 24}, run)
        self.assertEqual(attempts, {"a": 1, "b": 2, "c": 1})

    def test_a_task_error_that_is_not_retryable_fails_the_run_with_its_message(self):
        def refuse(task):
            raise TaskError("width must be positive", retryable=False)

        run_id = start("py-refuse", [node("r", "refuse", "py2")])
        with InBackground(Worker(URL, queues=["py2"], poll_wait=1).handle("refuse", refuse)):
            run = wait_for(run_id)
        self.assertEqual(run["status"], "FAILED", run)
        self.assertIn("width must be positive", run["tasks"][0]["error"])
        self.assertEqual(run["tasks"][0]["attempt"], 1, "not retried")

    def test_a_worker_killed_mid_task_loses_it_to_another_that_finishes_it(self):
        run_id = start("py-resize", [node("thumb", "resize-image", "images", width=64)])
        env = dict(os.environ, COMPOSER_URL=URL, RESIZE_SECONDS="600")
        doomed = subprocess.Popen([sys.executable, os.path.join(HERE, "examples", "resize_worker.py")], env=env)
        try:
            deadline = time.time() + 30
            while True:
                _, run = call("GET", f"/v1/runs/{run_id}")
                if run["tasks"] and run["tasks"][0]["state"] == "RUNNING":
                    break
                self.assertLess(time.time(), deadline, f"the first worker never started the task: {run}")
                time.sleep(0.1)
        finally:
            doomed.kill()  # SIGKILL: no goodbye, the lease just stops being renewed
            doomed.wait()

        def resize(task):
            return {"width": task.input["width"], "by": "survivor"}

        with InBackground(Worker(URL, queues=["images"], poll_wait=1).handle("resize-image", resize)):
            run = wait_for(run_id)
        self.assertEqual(run["status"], "SUCCEEDED", run)
        self.assertEqual(run["output"]["thumb"], {"width": 64, "by": "survivor"})
        self.assertEqual(run["tasks"][0]["attempt"], 1, "taken over at the same attempt")

    def test_stop_lets_the_running_task_finish_and_report(self):
        started = threading.Event()

        def slow(task):
            started.set()
            time.sleep(1.5)
            return "done"

        run_id = start("py-slow", [node("s", "slow", "py3")])
        worker = Worker(URL, queues=["py3"], poll_wait=1).handle("slow", slow)
        bg = InBackground(worker)
        bg.__enter__()
        self.assertTrue(started.wait(30))
        bg.__exit__(None, None, None)  # stop() while the task runs
        run = wait_for(run_id, timeout=10)
        self.assertEqual(run["status"], "SUCCEEDED", run)
        self.assertEqual(run["output"]["s"], "done")


if __name__ == "__main__":
    unittest.main()
