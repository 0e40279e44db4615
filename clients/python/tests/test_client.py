"""The API client against a real `composer dev`: workflows, runs with their
input and output, waiting, paging, events (with triggers, ids and the event
log), schedule backfills, webhooks, limits (and an HTTP step they hold),
cancel, retry, pause and resume, priorities, and how refusals map to
exceptions."""

import hashlib
import hmac
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import unittest
import urllib.request
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional, TypeVar

from composer_client import (
    Client,
    ComposerError,
    Conflict,
    InvalidRequest,
    NotFound,
    Run,
    RunSummary,
    RunTask,
    Unavailable,
    WaitTimeout,
    parse_time,
)
from composer_client._http import Transport

from .support import PACKAGE_ROOT, DevServer, Request, StubServer, answer, api, definition, node, unique

HOOK_SECRET = "whsec-py-test-secret"
W3C = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
"""A W3C traceparent (version 00), its trace id in group 1."""
DEV = DevServer(COMPOSER_WEBHOOK_SECRET_PY_HOOK=HOOK_SECRET)
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


T = TypeVar("T")


def eventually(what: str, check: Callable[[], Optional[T]], timeout: float = 30) -> T:
    """Calls `check` until it answers something other than None."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def backfilled(workflow: str, count: int) -> list[RunSummary]:
    """The workflow's runs of backfilled fire times, once there are `count`."""

    def check() -> Optional[list[RunSummary]]:
        runs = [r for r in client.iter_runs(workflow=workflow) if (r.get("trigger") or {}).get("backfill")]
        return runs if len(runs) >= count else None

    return eventually(f"{count} backfilled runs of {workflow}", check)


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


def traceparent(trace_id: str) -> str:
    """A W3C traceparent of a span of ours in the trace ``trace_id``."""
    return f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01"


def leased_trace(queue: str, run_id: str) -> str:
    """Leases the task of the run on ``queue`` (by the task API, as a worker
    would), completes it, and answers the trace id of its ``traceparent``."""
    poll = {"worker_id": "py-trace", "queues": [queue], "max": 1, "wait": "5s"}
    batch = eventually(f"a task of {run_id}", lambda: api(DEV.url, "POST", "/v1/tasks/poll", poll)["tasks"] or None)
    leased = batch[0]
    assert leased["run_id"] == run_id, leased
    lease = {"worker_id": "py-trace", "run_id": run_id, "attempt": leased["attempt"]}
    api(DEV.url, "POST", f"/v1/tasks/{leased['id']}/complete", dict(lease, output={}))
    match = W3C.fullmatch(leased.get("traceparent") or "")
    assert match is not None, leased
    return match.group(1)


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

    def test_an_export_gives_each_run_whole_as_get_run_shows_it(self) -> None:
        name = unique("py-export")
        each = {"type": "TRANSFORM", "config": {"output": "${ .item }"}}
        client.register_workflow(definition(name, [node("m", "MAP", items=[1, 2], node=each)]))
        ids = [client.start_run(name)["id"] for _ in range(3)]
        for run_id in ids:
            client.wait(run_id, 30)
        exported = list(client.iter_export(workflow=name))
        self.assertEqual([r["run"]["id"] for r in exported], ids, "oldest first")
        first = exported[0]
        self.assertEqual(first["run"], client.get_run(ids[0]))
        self.assertEqual(first["history"], client.run_events(ids[0]))
        self.assertEqual([t["output"] for t in first.get("items", {})["m"]], [1, 2])
        page = client.export_runs(workflow=name, limit=2)
        self.assertEqual((len(page["runs"]), page["next_after"]), (2, ids[1]))
        with self.assertRaises(InvalidRequest) as refused:
            client.export_runs(limit=101)
        self.assertIn("limit", str(refused.exception))
        with self.assertRaises(NotFound) as none:
            client.get_archived_run(ids[0])
        self.assertIn("COMPOSER_ARCHIVE_URL", str(none.exception))


class ControlTest(unittest.TestCase):
    def test_an_event_completes_the_steps_waiting_for_it(self) -> None:
        name = unique("py-event")
        client.register_workflow(approval(name))
        run_id = client.start_run(name, input={"order": "e-1"})["id"]
        until_waiting(run_id)
        nobody = client.send_event("approved", "e-2", {"by": "nobody"})
        self.assertEqual((nobody["matched"], nobody["buffered"], nobody.get("delivered_to_waiters")), (0, True, 0))
        ada = client.send_event("approved", "e-1", {"by": "ada"})
        self.assertEqual((ada["matched"], ada["buffered"], ada.get("delivered_to_waiters")), (1, False, 1))
        self.assertEqual((ada.get("started_runs"), ada.get("trigger_errors"), ada.get("duplicate")), ([], [], False))
        run = client.wait(run_id, 30)
        self.assertEqual(run["status"], "SUCCEEDED", run)
        self.assertEqual(run["output"], {"done": {"by": "ada"}})

    def test_an_update_is_validated_by_its_step_and_answered_once_per_id(self) -> None:
        name = unique("py-update")
        definition = approval(name)
        definition["nodes"][0]["updates"] = [
            {"name": "approve", "validate": '.update.payload.by != "mallory"', "refusal": "not her"}
        ]
        client.register_workflow(definition)
        run_id = client.start_run(name, input={"order": "u-1"})["id"]
        until_waiting(run_id)
        refused = client.update_run(run_id, "approve", {"by": "mallory"}, id="py-u1")
        self.assertEqual((refused["accepted"], refused.get("reason"), refused["node"]), (False, "not her", "approval"))
        ada = client.update_run(run_id, "approve", {"by": "ada"}, id="py-u2")
        self.assertEqual((ada["accepted"], ada.get("output"), ada["duplicate"]), (True, {"by": "ada"}, False))
        again = client.update_run(run_id, "approve", {"by": "ada"}, id="py-u2")
        self.assertEqual((again["accepted"], again["duplicate"]), (True, True))
        run = client.wait(run_id, 30)
        self.assertEqual(run["output"], {"done": {"by": "ada"}})
        with self.assertRaises(Conflict) as late:
            client.update_run(run_id, "approve", {"by": "grace"}, timeout="0s")
        self.assertEqual((late.exception.status, late.exception.code), (409, "update_not_accepted"))

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

    def test_a_run_has_its_starts_or_its_definitions_priority_which_changes_while_it_is_open(self) -> None:
        name = unique("py-priority")
        spec = dict(approval(name), priority=2, fairness_key="tenant-${ .input.tenant }")
        client.register_workflow(spec)
        self.assertEqual(
            {k: client.get_workflow(name)["spec"].get(k) for k in ("priority", "fairness_key")},
            {"priority": 2, "fairness_key": "tenant-${ .input.tenant }"},
        )
        started = client.start_run(name, input={"order": "pr-1", "tenant": "acme"})
        self.assertEqual((started["priority"], started.get("fairness_key")), (2, "tenant-acme"))
        run_id = started["id"]
        urgent = client.start_run(name, input={"order": "pr-2", "tenant": "acme"}, priority=1)
        self.assertEqual(urgent["priority"], 1, "the start's instead of the definition's")
        plain = unique("py-priority-plain")
        client.register_workflow(echo(plain))
        default = client.wait(client.start_run(plain)["id"], 30)
        self.assertEqual(default["priority"], 3)
        self.assertNotIn("fairness_key", default, "absent when it has none")

        until_waiting(run_id)
        changed = client.set_run_priority(run_id, 4)
        self.assertEqual((changed["id"], changed["status"], changed["priority"]), (run_id, "RUNNING", 4))
        self.assertEqual([t["node_id"] for t in changed["tasks"]], ["approval"], "the run in full")
        self.assertEqual(client.get_run(run_id)["priority"], 4)
        self.assertEqual([r["priority"] for r in client.iter_runs(workflow=name)], [1, 4])
        lines = [e for e in client.run_events(run_id) if e["type"] == "PriorityChanged"]
        self.assertEqual(len(lines), 1, lines)
        self.assertEqual({k: lines[0]["payload"][k] for k in ("priority", "from")}, {"priority": 4, "from": 2})
        self.assertIn("actor", lines[0]["payload"])

        for bad in (0, 6):
            with self.assertRaises(InvalidRequest) as e:
                client.set_run_priority(run_id, bad)
            self.assertEqual(e.exception.status, 400)
            self.assertIn("priority", e.exception.message)
            with self.assertRaises(InvalidRequest):
                client.start_run(name, input={"order": "pr-3"}, priority=bad)
        with self.assertRaises(NotFound):
            client.set_run_priority(str(uuid.uuid4()), 1)
        client.cancel(run_id)
        client.cancel(urgent["id"])
        with self.assertRaises(Conflict) as ended:
            client.set_run_priority(run_id, 1)
        self.assertEqual(ended.exception.status, 409)
        self.assertEqual(client.get_run(run_id)["priority"], 4)


class EventTest(unittest.TestCase):
    def test_an_event_starts_its_triggers_runs_once_per_id(self) -> None:
        name = unique("py-trigger")
        event = f"{name}.created"
        spec = echo(name)
        spec["triggers"] = [
            {"event": event, "when": ".event.payload.total > 10", "input": {"order": "${ .event.payload.id }"}},
            {"event": event, "when": ".event.payload.total > 100", "input": "${ .event.payload.id.deep }"},
        ]
        client.register_workflow(spec)
        self.assertEqual(client.get_workflow(name)["spec"]["triggers"], spec["triggers"])

        sent = client.send_event(event, payload={"id": "o-1", "total": 20}, id="evt-1")
        self.assertEqual((sent.get("id"), sent.get("duplicate"), sent.get("trigger_errors")), ("evt-1", False, []))
        started = sent.get("started_runs", [])
        self.assertEqual([(r["workflow"], r["trigger"]) for r in started], [(name, 0)])
        run_id = started[0]["run_id"]
        run = client.wait(run_id, 30)
        self.assertEqual((run["status"], run["input"]), ("SUCCEEDED", {"order": "o-1"}), run)
        self.assertEqual(run.get("trigger"), {"event": event, "event_id": "evt-1", "trigger": 0})

        # The same name and id again: recorded once, the first sending's run.
        again = client.send_event(event, payload={"id": "o-1", "total": 20}, id="evt-1")
        self.assertEqual((again.get("id"), again.get("duplicate")), ("evt-1", True))
        self.assertEqual([r["run_id"] for r in again.get("started_runs", [])], [run_id])
        self.assertEqual([r["id"] for r in client.list_runs(workflow=name)["runs"]], [run_id])

        # A `when` that does not hold starts nothing; one whose input fails says why.
        small = client.send_event(event, payload={"id": "o-2", "total": 5})
        self.assertEqual((small.get("started_runs"), small.get("duplicate")), ([], False))
        self.assertTrue(small.get("id"), "an id is made for an event sent without one")
        self.assertNotEqual(small.get("id"), "evt-1")
        big = client.send_event(event, payload={"id": "o-3", "total": 500}, id="evt-3")
        self.assertEqual([r["trigger"] for r in big.get("started_runs", [])], [0])
        failures = big.get("trigger_errors", [])
        self.assertEqual([(f["workflow"], f["trigger"]) for f in failures], [(name, 1)])
        self.assertIn("input", failures[0]["error"])
        self.assertEqual(len(client.list_runs(workflow=name)["runs"]), 2)

        recorded = list(client.iter_events(name=event))
        self.assertEqual([e["id"] for e in recorded], ["evt-3", small.get("id"), "evt-1"])
        self.assertEqual(recorded[2]["started_runs"], started)
        self.assertEqual(recorded[0]["trigger_errors"], failures)
        self.assertEqual((recorded[2]["key"], recorded[2]["source"]), ("", "api"))

    def test_the_event_log_comes_newest_first_in_pages(self) -> None:
        name = unique("py-events")
        sent = [client.send_event(name, f"k-{i}", {"i": i}, id=f"{name}-{i}").get("id") for i in range(5)]
        self.assertEqual(sent, [f"{name}-{i}" for i in range(5)])

        pages = []
        before: Optional[int] = None
        while True:
            page = client.list_events(name=name, limit=2, before=before)
            pages.append([e["id"] for e in page["events"]])
            before = page["next_before"]
            if before is None:
                break
            self.assertLess(len(pages), 10, "paging never ends")
        self.assertEqual([len(p) for p in pages], [2, 2, 1])
        ids = [i for p in pages for i in p]
        self.assertEqual(ids, sent[::-1], "newest first")

        events = list(client.iter_events(name=name, page_size=2))
        self.assertEqual([e["id"] for e in events], ids)
        self.assertEqual(list(client.iter_events(name=name)), events)
        seqs = [e["seq"] for e in events]
        self.assertEqual(seqs, sorted(seqs, reverse=True))
        self.assertEqual([e["id"] for e in client.iter_events(name=name, before=seqs[1], page_size=1)], ids[2:])
        oldest = events[-1]
        self.assertEqual(
            (oldest["name"], oldest["key"], oldest["payload"], oldest["source"], oldest["delivered_to_waiters"]),
            (name, "k-0", {"i": 0}, "api", 0),
        )
        self.assertEqual((oldest["started_runs"], oldest["trigger_errors"]), ([], []))
        self.assertLess(abs((datetime.now(timezone.utc) - parse_time(oldest["received_at"])).total_seconds()), 300)
        self.assertEqual(len(client.list_events(name=name, source="api")["events"]), 5)
        self.assertEqual(client.list_events(name=name, source="webhook:nobody")["events"], [])

        with self.assertRaises(InvalidRequest) as e:
            client.list_events(limit=0)
        self.assertIn("limit", e.exception.message)
        with self.assertRaises(InvalidRequest) as e:
            client.send_event(name, id="")
        self.assertIn("id", e.exception.message)


class TraceTest(unittest.TestCase):
    def test_a_traceparent_sent_with_a_start_or_an_event_is_the_trace_of_the_runs_steps(self) -> None:
        name = unique("py-trace")
        event = f"{name}.go"
        spec = definition(name, [node("step", "traced", name)])
        spec["triggers"] = [{"event": event}]
        client.register_workflow(spec)

        # The header as the API takes it: accepted, and the run's step is in its trace.
        trace = uuid.uuid4().hex
        transport = Transport(DEV.url, None, 30.0, "composer-client-tests")
        status, by_hand = transport.request(
            "POST", "/v1/runs", {"workflow": name}, headers={"traceparent": traceparent(trace)}
        )
        self.assertEqual(status, 201, by_hand)
        self.assertEqual(leased_trace(name, by_hand["id"]), trace)

        # start_run and send_event send it.
        trace = uuid.uuid4().hex
        started = client.start_run(name, traceparent=traceparent(trace))
        self.assertEqual(leased_trace(name, started["id"]), trace)
        trace = uuid.uuid4().hex
        sent = client.send_event(event, traceparent=traceparent(trace))
        self.assertEqual([r["workflow"] for r in sent.get("started_runs", [])], [name], sent)
        self.assertEqual(leased_trace(name, sent.get("started_runs", [])[0]["run_id"]), trace)

        # Without one, or with one that does not read, a run's trace id is its id.
        for given in (None, "00-not-a-trace-context"):
            run_id = client.start_run(name, traceparent=given)["id"]
            self.assertEqual(leased_trace(name, run_id), uuid.UUID(run_id).hex)


class ScheduleTest(unittest.TestCase):
    def test_a_backfill_queues_the_past_fire_times_and_their_runs_start(self) -> None:
        name = unique("py-backfill")
        client.register_workflow(echo(name))
        api(DEV.url, "POST", "/v1/schedules", {"id": name, "workflow": name, "cron": "0 * * * *", "input": {"n": 1}})
        hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
        start = hour - timedelta(hours=3)
        queued = client.backfill_schedule(name, start, hour)
        self.assertEqual(
            (queued["schedule"], queued["fire_times"], queued["queued"], queued["already"]), (name, 3, 3, 0), queued
        )
        self.assertEqual((queued["overlap"], queued["paused"]), ("allow", False))
        self.assertEqual(parse_time(queued["first_fire_time"] or ""), start)
        self.assertEqual(parse_time(queued["last_fire_time"] or ""), hour - timedelta(hours=1))

        runs = backfilled(name, 3)
        fire_times = sorted(parse_time(r["trigger"]["fire_time"]) for r in runs)
        self.assertEqual(fire_times, [start + timedelta(hours=i) for i in range(3)])
        for r in runs:
            self.assertEqual((r["trigger"]["schedule"], r["trigger"]["backfill"]), (name, True))
            done = client.wait(r["id"], 30)
            self.assertEqual((done["status"], done["input"]), ("SUCCEEDED", {"n": 1}), done)

        # Asked again (as RFC 3339 text), nothing is queued twice.
        again = client.backfill_schedule(name, start.isoformat(), hour.strftime("%Y-%m-%dT%H:%M:%SZ"))
        self.assertEqual((again["fire_times"], again["queued"], again["already"]), (3, 0, 3))
        with self.assertRaises(InvalidRequest) as e:
            client.backfill_schedule(name, hour, hour + timedelta(hours=2))
        self.assertEqual((e.exception.status, e.exception.code), (400, "invalid_schedule"))
        self.assertIn("future", e.exception.message)
        with self.assertRaises(InvalidRequest):
            client.backfill_schedule(name, hour, start)
        with self.assertRaises(NotFound):
            client.backfill_schedule(unique("py-no-schedule"), start, hour)

    def test_a_paused_schedule_holds_its_backfill_until_it_is_resumed(self) -> None:
        name = unique("py-backfill-paused")
        client.register_workflow(echo(name))
        api(DEV.url, "POST", "/v1/schedules", {"id": name, "workflow": name, "cron": "0 * * * *", "paused": True})
        hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
        queued = client.backfill_schedule(name, hour - timedelta(hours=2), hour, overlap="buffer_all")
        self.assertEqual((queued["queued"], queued["overlap"], queued["paused"]), (2, "buffer_all", True), queued)
        self.assertEqual(api(DEV.url, "GET", f"/v1/schedules/{name}")["backfill_queued"], 2)
        time.sleep(1.5)
        self.assertEqual(client.list_runs(workflow=name)["runs"], [], "held while paused")

        api(DEV.url, "POST", f"/v1/schedules/{name}/resume")
        runs = backfilled(name, 2)
        self.assertEqual({client.wait(r["id"], 30)["status"] for r in runs}, {"SUCCEEDED"})
        eventually(
            "the queue to empty",
            lambda: True if api(DEV.url, "GET", f"/v1/schedules/{name}")["backfill_queued"] == 0 else None,
        )


class WebhookTest(unittest.TestCase):
    def test_webhooks_are_created_replaced_listed_and_deleted(self) -> None:
        name = unique("py-hook")
        spec: dict[str, Any] = {"name": name, "scheme": "stripe", "secret": "PY_UNSET"}
        made = client.create_webhook(spec)
        self.assertEqual((made["name"], made["scheme"], made["secret"]), (name, "stripe", "PY_UNSET"))
        self.assertEqual((made["created"], made["secret_set"]), (True, False), "no COMPOSER_WEBHOOK_SECRET_PY_UNSET")
        self.assertTrue(made["url"].endswith(f"/v1/webhooks/{name}"), made["url"])
        self.assertIsNone(made.get("tolerance"))

        replaced = client.create_webhook({**spec, "tolerance": "10m"})
        self.assertEqual((replaced["created"], replaced.get("tolerance")), (False, "10m"))
        self.assertEqual(replaced["created_at"], made["created_at"])
        got = client.get_webhook(name)
        self.assertEqual(dict(got, created=False), replaced)
        self.assertEqual({w["name"]: w for w in client.list_webhooks()}.get(name), got)

        self.assertEqual(client.delete_webhook(name), {"deleted": name})
        with self.assertRaises(NotFound):
            client.get_webhook(name)
        with self.assertRaises(NotFound):
            client.delete_webhook(name)
        self.assertNotIn(name, [w["name"] for w in client.list_webhooks()])
        with self.assertRaises(InvalidRequest) as e:
            client.create_webhook({**spec, "secret": "whsec_the-secret-itself"})
        self.assertIn("secret", e.exception.message)

    def test_a_signed_delivery_becomes_an_event_of_the_webhooks_source(self) -> None:
        name = unique("py-github")
        hook = client.create_webhook({"name": name, "scheme": "github", "secret": "PY_HOOK"})
        self.assertTrue(hook["secret_set"], "COMPOSER_WEBHOOK_SECRET_PY_HOOK is set")
        body = json.dumps({"action": "opened", "number": 7}).encode()
        signature = hmac.new(HOOK_SECRET.encode(), body, hashlib.sha256).hexdigest()
        request = urllib.request.Request(DEV.url + hook["url"], data=body, method="POST")
        request.add_header("Content-Type", "application/json")
        request.add_header("X-Hub-Signature-256", f"sha256={signature}")
        request.add_header("X-GitHub-Delivery", f"{name}-1")
        with urllib.request.urlopen(request, timeout=30) as answer:
            event_id = json.loads(answer.read()).get("id")
        # Named by what was signed (the body), not by the unsigned delivery header.
        self.assertTrue(str(event_id).startswith("sha256:"), event_id)
        events = list(client.iter_events(source=f"webhook:{name}"))
        self.assertEqual([(e["name"], e["id"], e["payload"]) for e in events], [(name, event_id, json.loads(body))])
        self.assertEqual(events[0]["source"], f"webhook:{name}")
        client.delete_webhook(name)


class LimitTest(unittest.TestCase):
    def test_limits_are_set_read_listed_and_deleted(self) -> None:
        # Every reserved character of a URL, `/` included, stays in one path segment.
        key = unique("py-limit") + ":acct_1/eu west?#%+&=é"
        made = client.set_limit(key, rate="25/1s", burst=5, concurrency=2)
        self.assertEqual(
            (made["key"], made.get("rate"), made.get("burst"), made.get("concurrency"), made["set_by"]),
            (key, "25/1s", 5, 2, "api"),
            made,
        )
        self.assertEqual((made["in_use"], made["waiting"], made.get("held_until")), (0, 0, None))
        self.assertEqual(made.get("tokens"), 5.0, "a full bucket")
        parse_time(made["updated_at"])

        got = client.get_limit(key)
        self.assertEqual(
            {k: v for k, v in got.items() if k != "tokens"}, {k: v for k, v in made.items() if k != "tokens"}
        )
        listed = {limit["key"]: limit for limit in client.iter_limits()}
        self.assertEqual(listed[key]["rate"], "25/1s")

        # Set again, with only a concurrency: the rate is no longer limited.
        other = unique("py-limit") + "/only-concurrency"
        again = client.set_limit(other, concurrency=3)
        self.assertEqual((again.get("concurrency"), again.get("rate"), again.get("burst")), (3, None, None), again)
        self.assertIsNone(again.get("tokens"))
        replaced = client.set_limit(key, rate="1000/1h")
        self.assertEqual(
            (replaced.get("rate"), replaced.get("burst"), replaced.get("concurrency")), ("1000/1h", 1000, None)
        )

        # Pages in key order, fetched one by one or from after a key.
        page = client.list_limits(limit=1000)
        keys = [limit["key"] for limit in page["limits"]]
        self.assertIn(key, keys)
        self.assertIn(other, keys)
        self.assertIsNone(page["next_after"])
        first = client.list_limits(limit=1)
        self.assertEqual(([limit["key"] for limit in first["limits"]], first["next_after"]), (keys[:1], keys[0]))
        self.assertEqual([limit["key"] for limit in client.iter_limits(page_size=1)], keys)
        at = keys.index(key)
        self.assertEqual([limit["key"] for limit in client.iter_limits(after=key, page_size=2)], keys[at + 1 :])

        self.assertEqual(client.delete_limit(key), {"deleted": key})
        with self.assertRaises(NotFound) as e:
            client.get_limit(key)
        self.assertEqual((e.exception.status, e.exception.code), (404, "not_found"))
        with self.assertRaises(NotFound):
            client.delete_limit(key)
        self.assertNotIn(key, [limit["key"] for limit in client.iter_limits()])
        client.delete_limit(other)

    def test_a_bad_limit_is_refused_naming_its_field(self) -> None:
        key = unique("py-limit-bad")
        with self.assertRaises(InvalidRequest) as e:
            client.set_limit(key, rate="0/1s")
        self.assertEqual((e.exception.status, e.exception.code), (400, "invalid_request"))
        self.assertIn("rate", e.exception.message)
        bads: list[dict[str, Any]] = [{"rate": "fast"}, {"concurrency": 0}, {"burst": 0, "rate": "1/1s"}]
        for bad in bads:
            with self.subTest(**bad), self.assertRaises(InvalidRequest):
                client.set_limit(key, **bad)
        with self.assertRaises(NotFound):
            client.get_limit(key)
        with self.assertRaises(InvalidRequest):
            client.list_limits(limit=0)

    def test_a_concurrency_limit_holds_an_http_step_until_the_one_before_is_done(self) -> None:
        lock = threading.Lock()
        now = [0, 0]  # in flight, most at once

        def slow(_r: Request) -> tuple[int, dict[str, str], bytes]:
            with lock:
                now[0] += 1
                now[1] = max(now[1], now[0])
            time.sleep(1.5)
            with lock:
                now[0] -= 1
            return answer(200, {"ok": True})

        name = unique("py-solo")
        with StubServer(slow) as target:
            call = node("call", "HTTP", url=target.url + "/slow")
            call["limits"] = [{"key": "solo", "concurrency": 1}]
            client.register_workflow(definition(name, [call]))
            runs = [client.start_run(name)["id"] for _ in range(2)]

            def held() -> Optional[tuple[Run, RunTask]]:
                for run_id in runs:
                    run = client.get_run(run_id)
                    t = task(run, "call")
                    # `queued` until the limiter's next pass, then why it waits.
                    if t is not None and t.get("held", {}).get("reason") == "concurrency":
                        return run, t
                return None

            _, waiting = eventually("a step held by the limit's concurrency", held)
            self.assertEqual(waiting["state"], "PENDING", waiting)
            self.assertEqual((waiting["held"]["key"], waiting["held"]["reason"]), ("solo", "concurrency"), waiting)
            limit = client.get_limit("solo")
            self.assertEqual((limit.get("concurrency"), limit["set_by"]), (1, "definition"), limit)
            self.assertLessEqual(limit["in_use"], 1)
            done = [client.wait(run_id, 60) for run_id in runs]
        self.assertEqual([r["status"] for r in done], ["SUCCEEDED", "SUCCEEDED"], done)
        self.assertEqual([r["output"]["call"]["body"] for r in done], [{"ok": True}] * 2)
        self.assertEqual(now[1], 1, "never two calls at once")
        self.assertEqual(len(target.requests), 2)
        self.assertTrue(all("held" not in t for r in done for t in r["tasks"]), "no longer held")
        idle = client.get_limit("solo")
        self.assertEqual((idle["in_use"], idle["waiting"]), (0, 0), idle)


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
