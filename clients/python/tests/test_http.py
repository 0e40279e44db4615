"""The client against a stub server (no composer needed): every error status
maps to its exception with the server's code and message, the token is sent
and never shown, requests are what the API expects (a namespace named in
each), and wait rides out a server that is briefly unavailable."""

import time
import unittest
import urllib.parse
from datetime import datetime, timedelta, timezone

from composer_client import (
    Client,
    ComposerError,
    Conflict,
    InvalidRequest,
    NotFound,
    Unauthorized,
    Unavailable,
    parse_time,
)

from .support import Answer, Request, StubServer, answer

RUN_ID = "01a23095-67fc-760e-a848-aa9556f1060d"


def run_view(status: str) -> dict[str, object]:
    return {
        "id": RUN_ID, "workflow": "w", "version": 1, "workflow_id": RUN_ID, "status": status, "input": {},
        "error": None, "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z",
        "finished_at": None, "tasks": [],
    }  # fmt: skip


def error(status: int, code: str, message: str) -> Answer:
    return answer(status, {"error": {"code": code, "message": message}})


class ErrorMappingTest(unittest.TestCase):
    def test_each_status_raises_its_exception_with_the_servers_code_and_message(self) -> None:
        cases: list[tuple[int, type[ComposerError]]] = [
            (400, InvalidRequest), (401, Unauthorized), (403, Unauthorized), (404, NotFound), (405, InvalidRequest),
            (409, Conflict), (413, InvalidRequest), (414, InvalidRequest), (415, InvalidRequest),
            (422, InvalidRequest), (429, Unavailable), (500, Unavailable), (503, Unavailable),
        ]  # fmt: skip
        for status, kind in cases:
            refusal = error(status, f"code_{status}", f"because {status}")
            with self.subTest(status=status), StubServer(lambda _r, a=refusal: a) as stub:  # type: ignore[misc]
                with self.assertRaises(kind) as e:
                    Client(stub.url).get_run(RUN_ID)
                self.assertIs(type(e.exception), kind)
                self.assertEqual((e.exception.status, e.exception.code), (status, f"code_{status}"))
                self.assertEqual(e.exception.message, f"because {status}")
                self.assertEqual(str(e.exception), f"{status} code_{status}: because {status}")
        # A status no class names is still a ComposerError, and none of the others.
        with StubServer(lambda _r: error(418, "teapot", "short and stout")) as stub:
            with self.assertRaises(ComposerError) as e:
                Client(stub.url).get_run(RUN_ID)
            self.assertIs(type(e.exception), ComposerError)

    def test_an_answer_that_is_not_the_apis_keeps_its_status_and_reason(self) -> None:
        page = (502, {"Content-Type": "text/html"}, b"<html>upstream down</html>")
        with StubServer(lambda _r: page) as stub, self.assertRaises(Unavailable) as e:
            Client(stub.url).list_workflows()
        self.assertEqual((e.exception.status, e.exception.code), (502, "http_error"))
        self.assertIn("Bad Gateway", e.exception.message)
        self.assertIn("upstream down", e.exception.message)

    def test_a_server_that_is_not_composer_is_not_taken_for_one(self) -> None:
        # Another service on the port answers JSON, a 200 or a 404 of its own,
        # without the header every coordinator's answer carries.
        for status in (200, 404):
            other: Answer = (status, {"Content-Type": "application/json"}, b'{"workflows": []}')

            def respond(_r: Request, a: Answer = other) -> Answer:
                return a

            with StubServer(respond) as stub, self.assertRaises(ComposerError) as e:
                Client(stub.url).list_workflows()
            self.assertIs(type(e.exception), ComposerError)
            self.assertEqual((e.exception.status, e.exception.code), (status, "not_composer"))
            self.assertIn("not a Composer coordinator", e.exception.message)

    def test_a_redirect_is_not_followed(self) -> None:
        def respond(r: Request) -> Answer:
            if r.route == "/elsewhere":
                return answer(200, {"workflows": []})
            return 302, {"Location": "/elsewhere"}, b""

        with StubServer(respond) as stub:
            with self.assertRaises(ComposerError) as e:
                Client(stub.url, "tok").list_workflows()
            self.assertEqual(e.exception.status, 302)
            self.assertEqual([r.route for r in stub.requests], ["/v1/workflows"], "the token went nowhere else")

    def test_retry_after_is_kept(self) -> None:
        busy = error(503, "busy", "the engine is busy; retry shortly")
        with StubServer(lambda _r: (busy[0], {**busy[1], "Retry-After": "2"}, busy[2])) as stub:
            with self.assertRaises(Unavailable) as e:
                Client(stub.url).start_run("w")
            self.assertEqual(len(stub.requests), 1, "the client itself does not retry")
        self.assertEqual((e.exception.code, e.exception.retry_after), ("busy", 2.0))

    def test_a_slow_server_is_unavailable_after_the_timeout(self) -> None:
        def slow(_r: Request) -> Answer:
            time.sleep(1.5)
            return answer(200, {"workflows": []})

        with StubServer(slow) as stub:
            began = time.monotonic()
            with self.assertRaises(Unavailable) as e:
                Client(stub.url, timeout=0.3).list_workflows()
            self.assertLess(time.monotonic() - began, 1.4)
        self.assertEqual((e.exception.status, e.exception.code), (None, "timeout"))

    def test_a_url_without_a_scheme_is_refused_at_once(self) -> None:
        with self.assertRaises(ValueError):
            Client("127.0.0.1:8080")
        with self.assertRaises(ValueError):
            Client("http://x", timeout=0)


class RequestTest(unittest.TestCase):
    def test_a_name_dot_or_dot_dot_is_refused_before_anything_is_sent(self) -> None:
        # A URL resolves . and .. away: the request would reach another route.
        with StubServer(lambda req: answer(200, {})) as stub:
            client = Client(stub.url)
            for name in (".", ".."):
                with self.assertRaisesRegex(ValueError, "cannot carry"):
                    client.get_workflow(name)
                with self.assertRaisesRegex(ValueError, "cannot carry"):
                    client.get_limit(name)
            self.assertEqual(stub.requests, [], "nothing was sent")

    def test_the_token_is_sent_as_a_bearer_and_never_shown(self) -> None:
        with StubServer(lambda _r: error(401, "unauthorized", "missing or wrong bearer token")) as stub:
            secret = "tok-very-secret"
            client = Client(stub.url, secret)
            with self.assertRaises(Unauthorized) as e:
                client.list_workflows()
            with self.assertRaises(Unauthorized):
                Client(stub.url).list_workflows()
        self.assertEqual(stub.requests[0].headers.get("Authorization"), f"Bearer {secret}")
        self.assertNotIn("Authorization", stub.requests[1].headers)
        self.assertNotIn(secret, str(e.exception) + repr(e.exception) + repr(client))

    def test_requests_are_the_apis(self) -> None:
        def respond(r: Request) -> Answer:
            if r.route == "/v1/runs" and r.method == "GET":
                return answer(200, {"runs": [], "next_cursor": None})
            if r.route.startswith("/v1/workflows"):
                return answer(201 if r.method == "POST" else 200, {"id": RUN_ID, "name": "w", "version": 1})
            if r.route == "/v1/events":
                return answer(200, {"matched": 0, "buffered": True})
            return answer(200 if "/v1/runs/" in r.route else 201, run_view("RUNNING"))

        with StubServer(respond) as stub:
            client = Client(stub.url + "/")
            self.assertTrue(client.register_workflow({"name": "w", "nodes": []})["created"])
            client.get_workflow("a b/c")
            client.get_workflow("w", version=3)
            client.start_run("w")
            client.start_run("w", input={"x": 1}, version=2, idempotency_key="k")
            client.list_runs(workflow="w", status="FAILED", limit=5, cursor="c", parent_run_id=RUN_ID)
            client.get_run(RUN_ID, wait=2.5)
            client.get_run(RUN_ID, wait=0.25)
            client.send_event("e", "k")
            client.pause(RUN_ID)
            client.start_run("w", priority=1)
            client.set_run_priority(RUN_ID, 5)
            with self.assertRaises(ValueError):
                client.start_run("w", input=float("nan"))  # not JSON: refused before it is sent
        got = [(r.method, r.path, r.body) for r in stub.requests]
        self.assertEqual(
            got,
            [
                ("POST", "/v1/workflows", {"name": "w", "nodes": []}),
                ("GET", "/v1/workflows/a%20b%2Fc", None),
                ("GET", "/v1/workflows/w/versions/3", None),
                ("POST", "/v1/runs", {"workflow": "w"}),
                ("POST", "/v1/runs", {"workflow": "w", "input": {"x": 1}, "version": 2, "idempotency_key": "k"}),
                ("GET", f"/v1/runs?workflow=w&status=FAILED&limit=5&cursor=c&parent_run_id={RUN_ID}", None),
                ("GET", f"/v1/runs/{RUN_ID}?wait=2s", None),
                ("GET", f"/v1/runs/{RUN_ID}?wait=250ms", None),
                ("POST", "/v1/events", {"name": "e", "key": "k", "payload": None}),
                ("POST", f"/v1/runs/{RUN_ID}/pause", None),
                ("POST", "/v1/runs", {"workflow": "w", "priority": 1}),
                ("PUT", f"/v1/runs/{RUN_ID}/priority", {"priority": 5}),
            ],
        )
        posts = [r for r in stub.requests if r.body is not None]
        self.assertTrue(all(r.headers.get("Content-Type") == "application/json" for r in posts))
        self.assertTrue(all(r.headers.get("User-Agent", "").startswith("composer-client-python/") for r in posts))

    def test_a_traceparent_is_sent_as_its_header_only_when_given(self) -> None:
        def respond(r: Request) -> Answer:
            if r.route == "/v1/events":
                return answer(200, {"matched": 0, "buffered": True})
            return answer(201, run_view("RUNNING"))

        tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        with StubServer(respond) as stub:
            client = Client(stub.url)
            client.start_run("w", traceparent=tp)
            client.start_run("w")
            client.send_event("e", "k", traceparent=tp)
            client.send_event("e", "k")
        sent = [{k.lower(): v for k, v in r.headers.items()}.get("traceparent") for r in stub.requests]
        self.assertEqual(sent, [tp, None, tp, None])
        bodies = [r.body for r in stub.requests]
        self.assertEqual(bodies[::2], [{"workflow": "w"}, {"name": "e", "key": "k", "payload": None}])

    def test_wait_rides_out_a_server_that_is_briefly_unavailable(self) -> None:
        answers = [error(503, "unavailable", "the database is unavailable; retry later")] * 2
        answers += [answer(200, run_view("RUNNING")), answer(200, run_view("SUCCEEDED"))]

        def respond(_r: Request) -> Answer:
            return answers.pop(0)

        with StubServer(respond) as stub:
            run = Client(stub.url).wait(RUN_ID, timeout=20)
        self.assertEqual(run["status"], "SUCCEEDED")
        self.assertEqual(len(stub.requests), 4)
        waits = [urllib.parse.parse_qs(urllib.parse.urlsplit(r.path).query)["wait"][0] for r in stub.requests]
        self.assertTrue(all(w.endswith("s") and w != "0s" for w in waits), waits)
        self.assertIn(waits[0], ("19s", "20s"), "the timeout is the first wait")

    def test_wait_gives_up_when_unavailable_past_its_timeout(self) -> None:
        with StubServer(lambda _r: error(503, "unavailable", "down")) as stub:
            began = time.monotonic()
            with self.assertRaises(Unavailable):
                Client(stub.url).wait(RUN_ID, timeout=1)
            self.assertLess(time.monotonic() - began, 3)

    def test_pages_are_followed_until_the_last(self) -> None:
        pages = {
            None: {"runs": [{"id": "3"}, {"id": "2"}], "next_cursor": "2"},
            "2": {"runs": [{"id": "1"}], "next_cursor": None},
        }

        def respond(r: Request) -> Answer:
            cursor = urllib.parse.parse_qs(urllib.parse.urlsplit(r.path).query).get("cursor", [None])[0]
            return answer(200, pages[cursor])

        with StubServer(respond) as stub:
            ids = [r["id"] for r in Client(stub.url).iter_runs(page_size=2)]
        self.assertEqual(ids, ["3", "2", "1"])
        self.assertEqual(len(stub.requests), 2)


class EventScheduleWebhookRequestTest(unittest.TestCase):
    def test_the_requests_of_events_backfills_and_webhooks_are_the_apis(self) -> None:
        hook = {"name": "h", "scheme": "github", "secret": "GH", "url": "/v1/webhooks/h", "secret_set": False}

        def respond(r: Request) -> Answer:
            if r.route == "/v1/events" and r.method == "GET":
                return answer(200, {"events": [], "next_before": None})
            if r.route == "/v1/events":
                return answer(200, {"matched": 0, "buffered": True, "id": "x", "duplicate": False})
            if r.route.endswith("/backfill"):
                return answer(202, {"schedule": "s", "fire_times": 2, "queued": 2, "already": 0})
            if r.route == "/v1/webhooks" and r.method == "GET":
                return answer(200, {"webhooks": [hook]})
            if r.route == "/v1/webhooks" and r.method == "POST":
                return answer(201 if "tolerance" in r.body else 200, hook)  # new, or replaced
            if r.method == "DELETE":
                return answer(200, {"deleted": "h"})
            return answer(200, hook)

        with StubServer(respond) as stub:
            client = Client(stub.url)
            client.send_event("e")
            client.send_event("e", "k", {"a": 1}, id="evt-1")
            client.list_events()
            client.list_events(name="a b", source="webhook:gh", before=7, limit=2)
            when = datetime(2026, 12, 1, 11, tzinfo=timezone(timedelta(hours=1)))
            queued = client.backfill_schedule("nightly/x", "2026-12-01T00:00:00Z", when, overlap="skip")
            self.assertEqual(queued["queued"], 2)
            with self.assertRaises(ValueError):
                client.backfill_schedule("s", datetime(2026, 12, 1), "2026-12-02T00:00:00Z")  # no time zone
            spec = {"name": "h", "scheme": "github", "secret": "GH"}
            self.assertFalse(client.create_webhook(spec)["created"], "200: replaced")
            self.assertTrue(client.create_webhook({**spec, "tolerance": "5m"})["created"], "201: new")
            self.assertEqual(client.list_webhooks(), [hook])
            client.get_webhook("a/b")
            self.assertEqual(client.delete_webhook("h"), {"deleted": "h"})
        got = [(r.method, r.path, r.body) for r in stub.requests]
        self.assertEqual(
            got,
            [
                ("POST", "/v1/events", {"name": "e", "key": "", "payload": None}),
                ("POST", "/v1/events", {"name": "e", "key": "k", "payload": {"a": 1}, "id": "evt-1"}),
                ("GET", "/v1/events", None),
                ("GET", "/v1/events?name=a+b&source=webhook%3Agh&before=7&limit=2", None),
                (
                    "POST",
                    "/v1/schedules/nightly%2Fx/backfill",
                    {"from": "2026-12-01T00:00:00Z", "to": "2026-12-01T10:00:00Z", "overlap": "skip"},
                ),
                ("POST", "/v1/webhooks", spec),
                ("POST", "/v1/webhooks", {**spec, "tolerance": "5m"}),
                ("GET", "/v1/webhooks", None),
                ("GET", "/v1/webhooks/a%2Fb", None),
                ("DELETE", "/v1/webhooks/h", None),
            ],
        )

    def test_iter_events_pages_with_before_until_the_last_page(self) -> None:
        def respond(r: Request) -> Answer:
            before = urllib.parse.parse_qs(urllib.parse.urlsplit(r.path).query).get("before", ["7"])[0]
            seq = int(before) - 1
            events = [{"seq": s} for s in range(seq, max(seq - 3, 0), -1)]
            return answer(200, {"events": events, "next_before": events[-1]["seq"] if seq > 3 else None})

        with StubServer(respond) as stub:
            seqs = [e["seq"] for e in Client(stub.url).iter_events(name="n", page_size=3)]
        self.assertEqual(seqs, [6, 5, 4, 3, 2, 1])
        self.assertEqual(
            [r.path for r in stub.requests],
            ["/v1/events?name=n&limit=3", "/v1/events?name=n&before=4&limit=3"],
        )


class LimitRequestTest(unittest.TestCase):
    def test_the_requests_of_limits_are_the_apis_with_the_key_one_path_segment(self) -> None:
        view = {"key": "k", "set_by": "api", "in_use": 0, "waiting": 0, "updated_at": "2026-12-01T00:00:00Z"}

        def respond(r: Request) -> Answer:
            if r.route == "/v1/limits":
                after = urllib.parse.parse_qs(urllib.parse.urlsplit(r.path).query).get("after", [""])[0]
                keys = [k for k in ["a", "b", "c"] if k > after][:2]
                return answer(
                    200, {"limits": [{**view, "key": k} for k in keys], "next_after": keys[-1] if keys else None}
                )
            if r.method == "DELETE":
                return answer(200, {"deleted": "stripe:acct_1/x"})
            return answer(200, view)

        with StubServer(respond) as stub:
            client = Client(stub.url)
            self.assertEqual(client.list_limits()["next_after"], "b")
            client.list_limits(after="stripe:a", limit=2)
            self.assertEqual([limit["key"] for limit in client.iter_limits(page_size=2)], ["a", "b", "c"])
            client.get_limit("stripe:acct_1/x")
            client.set_limit("stripe:acct_1/x", rate="25/1s", burst=5, concurrency=2)
            client.set_limit("a b?#%&=+.~", concurrency=1)
            client.set_limit("named")
            self.assertEqual(client.delete_limit("stripe:acct_1/x"), {"deleted": "stripe:acct_1/x"})
        got = [(r.method, r.path, r.body) for r in stub.requests]
        self.assertEqual(
            got,
            [
                ("GET", "/v1/limits", None),
                ("GET", "/v1/limits?after=stripe%3Aa&limit=2", None),
                ("GET", "/v1/limits?limit=2", None),
                ("GET", "/v1/limits?after=b&limit=2", None),
                ("GET", "/v1/limits?after=c&limit=2", None),
                ("GET", "/v1/limits/stripe%3Aacct_1%2Fx", None),
                ("PUT", "/v1/limits/stripe%3Aacct_1%2Fx", {"rate": "25/1s", "burst": 5, "concurrency": 2}),
                ("PUT", "/v1/limits/a%20b%3F%23%25%26%3D%2B.~", {"concurrency": 1}),
                ("PUT", "/v1/limits/named", {}),
                ("DELETE", "/v1/limits/stripe%3Aacct_1%2Fx", None),
            ],
        )
        self.assertEqual(stub.requests[-2].headers.get("Content-Type"), "application/json", "a body, if empty")


class NamespaceRequestTest(unittest.TestCase):
    def test_every_request_names_the_clients_namespace_and_none_without_one(self) -> None:
        def respond(r: Request) -> Answer:
            if r.route == "/v1/workflows":
                return answer(200, {"workflows": []})
            return answer(201 if r.method == "POST" else 200, run_view("RUNNING"))

        with StubServer(respond) as stub:
            client = Client(stub.url, "tok", namespace="team-a")
            self.assertEqual(client.namespace, "team-a")
            client.list_workflows()
            client.start_run("w")
            client.get_run(RUN_ID, wait=0.25)
            client.cancel(RUN_ID)
            for default in (Client(stub.url), Client(stub.url, namespace="")):
                self.assertIsNone(default.namespace)
                default.list_workflows()
        sent = [{k.lower(): v for k, v in r.headers.items()}.get("composer-namespace") for r in stub.requests]
        self.assertEqual(sent, ["team-a"] * 4 + [None, None])
        self.assertIn("namespace='team-a'", repr(client))

    def test_a_name_the_server_would_refuse_is_refused_before_anything_is_sent(self) -> None:
        with StubServer(lambda _r: answer(200, {"workflows": []})) as stub:
            for bad in ("Team-a", "1team", "-team", "team_a", "team.a", "a" * 64, "tëam", "team\n", " team"):
                with self.subTest(namespace=bad), self.assertRaisesRegex(ValueError, "^namespace must be 1 to 63"):
                    Client(stub.url, namespace=bad)
            Client(stub.url, namespace="a" + "-" * 62).list_workflows()  # 63 characters: the longest
        self.assertEqual(len(stub.requests), 1)

    def test_the_requests_of_namespaces_are_the_apis(self) -> None:
        view = {"name": "team-a", "description": "", "state": "active", "created_by": "dev", "created_at": "x"}

        def respond(r: Request) -> Answer:
            if r.route == "/v1/namespaces" and r.method == "POST":
                return answer(201 if r.body["description"] else 200, {**view, "description": r.body["description"]})
            if r.route == "/v1/namespaces":
                return answer(200, {"namespaces": [{**view, "name": "default"}, view]})
            if r.method == "DELETE":
                return answer(202, {**view, "state": "deleting"})
            return answer(200, view)

        with StubServer(respond) as stub:
            client = Client(stub.url)
            made = client.create_namespace("team-a", "the a team")
            self.assertEqual((made["created"], made["description"]), (True, "the a team"))
            self.assertFalse(client.create_namespace("team-a")["created"], "200: it existed")
            self.assertEqual([n["name"] for n in client.list_namespaces()], ["default", "team-a"])
            self.assertEqual(client.get_namespace("team-a"), view)
            self.assertEqual(client.delete_namespace("team-a")["state"], "deleting")
        got = [(r.method, r.path, r.body) for r in stub.requests]
        self.assertEqual(
            got,
            [
                ("POST", "/v1/namespaces", {"name": "team-a", "description": "the a team"}),
                ("POST", "/v1/namespaces", {"name": "team-a", "description": ""}),
                ("GET", "/v1/namespaces", None),
                ("GET", "/v1/namespaces/team-a", None),
                ("DELETE", "/v1/namespaces/team-a", None),
            ],
        )


class ParseTimeTest(unittest.TestCase):
    def test_api_timestamps_become_aware_utc_datetimes(self) -> None:
        want = datetime(2026, 12, 1, 7, 50, 27, 570874, tzinfo=timezone.utc)
        self.assertEqual(parse_time("2026-12-01T07:50:27.570874Z"), want)
        self.assertEqual(parse_time("2026-12-01T07:50:27.570874123Z"), want)
        self.assertEqual(parse_time("2026-12-01T08:50:27.570874+01:00"), want)
        self.assertEqual(parse_time("2026-12-01T07:50:27Z"), want.replace(microsecond=0))
        self.assertEqual(parse_time("2026-12-01T07:50:27.5Z").microsecond, 500000)
        with self.assertRaises(ValueError):
            parse_time("yesterday")


if __name__ == "__main__":
    unittest.main()
