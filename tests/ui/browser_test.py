#!/usr/bin/env python3
"""The web UI in a real browser (Debian's chromium, driven by Playwright).

Starts `composer dev` with an API token and a fake payment service, makes a
run fail, then does what a person would: logs in, opens the runs list,
filters it to FAILED runs, opens the failed run, sees the failed step in the
failure colour with its error, presses Retry, and sees the run succeed; then
reruns it from a step with a reason, reads why waiting runs wait, completes a
step by hand, finds runs by tag, cancels chosen ones and the rest by a bulk
job, opens the overview and the queues, replays events whose trigger
failed once it is fixed, and decides an approval from the inbox. Along the way it checks what
issue 51 found misleading: a node's label fits its box, a running run's
header says nothing of finishing, the act button says what it does, a
long-polling worker shows once per queue as waiting for work, and Log out
shows only in a session.

Usage: browser_test.py COMPOSER_BINARY [SCREENSHOT_DIR]
Screenshots go to SCREENSHOT_DIR when given (docs/ keeps the ones the book's
web UI page, docs/ui.md, shows), else to a temporary directory.
"""

import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from playwright.sync_api import expect, sync_playwright

TOKEN = "ui-test-token-7f3a"
CHROMIUM = os.environ.get("COMPOSER_CHROMIUM", "/usr/bin/chromium")


class Payments(http.server.BaseHTTPRequestHandler):
    """Declines while `failing` is set, then accepts."""

    failing = True

    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        if Payments.failing:
            self.send_response(402)
            body = b'{"error": "card declined"}'
        else:
            self.send_response(200)
            body = b'{"id": "ch_1"}'
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def api(base, method, path, body=None):
    req = urllib.request.Request(
        base + path,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"authorization": "Bearer " + TOKEN, "content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read() or b"null")


def wait_for_run(base, run_id, status, timeout=60):
    until = time.time() + timeout
    while time.time() < until:
        run = api(base, "GET", f"/v1/runs/{run_id}")
        if run["status"] == status:
            return run
        time.sleep(0.2)
    raise AssertionError(f"run {run_id} is {run['status']}, not {status}: {run}")


def main():
    binary = os.path.abspath(sys.argv[1])
    # Screenshots go where asked (the book's are taken with docs/), else
    # into a temp dir removed at the end with the rest.
    keep_shots = len(sys.argv) > 2
    shots = sys.argv[2] if keep_shots else tempfile.mkdtemp(prefix="composer-ui-shots-")
    os.makedirs(shots, exist_ok=True)
    work = tempfile.mkdtemp(prefix="composer-ui-")
    os.chmod(work, 0o755)  # run as root, the embedded PostgreSQL runs as postgres
    payments = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Payments)
    threading.Thread(target=payments.serve_forever, daemon=True).start()
    pay_url = f"http://127.0.0.1:{payments.server_address[1]}/charge"

    addr_file = os.path.join(work, "addr")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSER_")}
    env.update(COMPOSER_LISTEN="127.0.0.1:0", COMPOSER_ADDR_FILE=addr_file, COMPOSER_API_TOKEN=TOKEN,
               COMPOSER_LOG="warn")
    dev = subprocess.Popen([binary, "dev"], cwd=work, env=env, stdin=subprocess.DEVNULL)
    try:
        until = time.time() + 90
        while not (os.path.exists(addr_file) and open(addr_file).read().strip()):
            assert time.time() < until, "composer dev did not start"
            assert dev.poll() is None, "composer dev exited"
            time.sleep(0.2)
        base = open(addr_file).read().strip()
        if not base.startswith("http"):
            base = "http://" + base

        api(base, "POST", "/v1/workflows", {"name": "greet", "nodes": [
            {"id": "hello", "type": "TRANSFORM", "config": {"output": "hello ${ .input.who }"}}]})
        api(base, "POST", "/v1/workflows", {"name": "checkout", "nodes": [
            {"id": "price", "type": "TRANSFORM", "config": {"output": {"amount": "${ .input.amount }"}}},
            {"id": "pay", "type": "HTTP", "retry": {"max_attempts": 1},
             "config": {"method": "POST", "url": pay_url, "body": "${ .nodes.price.output }"}},
            {"id": "receipt", "type": "TRANSFORM", "config": {"output": {"paid": "${ .nodes.pay.output.body.id }"}}}],
            "edges": [{"from": "price", "to": "pay"}, {"from": "pay", "to": "receipt"}]})
        for who in ["ada", "grace"]:
            api(base, "POST", "/v1/runs", {"workflow": "greet", "input": {"who": who}})
        failed = api(base, "POST", "/v1/runs", {"workflow": "checkout", "input": {"amount": 42}})
        wait_for_run(base, failed["id"], "FAILED")

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 860})

            # Not logged in: the login page, then the runs list.
            page.goto(base + "/ui/runs")
            expect(page).to_have_url(base + "/ui/login?next=%2Fui%2Fruns")
            page.fill("input[name=token]", "wrong")
            page.click("form.login button[type=submit]")
            expect(page.locator(".error")).to_contain_text("wrong token")
            page.fill("input[name=token]", TOKEN)
            page.click("form.login button[type=submit]")
            expect(page).to_have_url(base + "/ui/runs")
            expect(page.locator("header button.logout")).to_have_count(1)
            expect(page.locator("table.runs tbody tr")).to_have_count(3)
            page.screenshot(path=os.path.join(shots, "ui-runs.png"), full_page=True)

            # Filter to the failed runs and open the one there is.
            page.select_option("select[name=status]", "FAILED")
            page.click(".filters button[type=submit]")
            rows = page.locator("table.runs tbody tr")
            expect(rows).to_have_count(1)
            expect(rows.first).to_have_attribute("data-status", "FAILED")
            rows.first.locator("a").first.click()
            expect(page).to_have_url(base + f"/ui/runs/{failed['id']}")

            # The failed step, in the failure colour, and why.
            pay = page.locator("svg.dag g[data-node=pay]")
            expect(pay).to_have_class("node failed")
            fill = pay.locator("rect").evaluate("r => getComputedStyle(r).fill")
            assert fill == "rgb(255, 235, 233)", f"the failed node is drawn in {fill}"
            expect(page.locator("svg.dag g[data-node=price]")).to_have_class("node ok")
            expect(page.locator(".run-error")).to_contain_text('node "pay" failed')
            expect(page.locator("tr[data-node=pay] td.error")).to_contain_text("402")
            page.screenshot(path=os.path.join(shots, "ui-run-failed.png"), full_page=True)

            # The card works now: retry from the page, and watch it succeed.
            Payments.failing = False
            page.click("button.retry")
            expect(page.locator(".notice")).to_contain_text("retry: done")
            expect(page.locator("svg.dag g[data-node=receipt]")).to_have_class("node ok", timeout=30_000)
            expect(page.locator("p.status .badge")).to_have_text("SUCCEEDED", timeout=30_000)
            expect(page.locator("svg.dag g[data-node=pay]")).to_have_class("node ok")
            expect(page.locator("button.retry")).to_have_count(0)
            page.screenshot(path=os.path.join(shots, "ui-run-retried.png"), full_page=True)

            # The run's timeline: a row per step, a bar per attempt, in how it ended.
            expect(page.locator("svg.timeline g.bar")).to_have_count(3)
            expect(page.locator("svg.timeline g.bar[data-node=pay]")).to_have_class("bar ok")
            attempts = page.locator("svg.timeline g.bar[data-node=pay] g.attempt")
            expect(attempts).to_have_count(2)
            expect(attempts.first).to_have_class("attempt failed")
            expect(attempts.last).to_have_class("attempt ok")

            # Rerun it from the payment, saying why: the history keeps who and why.
            page.click("details.rerun summary")
            page.check("details.rerun input[name=from][value=pay]")
            page.fill("details.rerun input[name=reason]", "customer asked for a second charge")
            page.check("details.rerun input[name=allow_completed]")
            page.click("button.rerun")
            expect(page.locator(".notice")).to_contain_text("rerun: done")
            expect(page.locator("p.status .badge")).to_have_text("SUCCEEDED", timeout=30_000)
            page.reload()
            rerun = page.locator("table.history tr", has_text="RunRerun")
            expect(rerun.locator("td.actor")).to_have_text("api")
            expect(rerun.locator("td.reason")).to_have_text("customer asked for a second charge")

            # Runs that wait for an event, tagged by customer: why they wait,
            # one completed by hand, two cancelled from the list, the rest by a bulk job.
            api(base, "POST", "/v1/workflows", {"name": "awaits", "tags": {"customer": "${ .input.customer }"},
                "nodes": [{"id": "approval", "type": "WAIT_FOR_EVENT",
                           "config": {"event": "approved", "key": "${ .input.customer }"}}]})
            waiting = [api(base, "POST", "/v1/runs", {"workflow": "awaits", "input": {"customer": str(n)}})
                       for n in range(6)]
            for r in waiting:
                wait_for_run(base, r["id"], "RUNNING")
            page.goto(base + f"/ui/runs/{waiting[0]['id']}")
            expect(page.locator(".explain li[data-node=approval]")).to_contain_text("approved")
            expect(page.locator("p.status")).to_contain_text("started")
            expect(page.locator("p.status")).not_to_contain_text("finished")
            page.screenshot(path=os.path.join(shots, "ui-run-explain.png"), full_page=True)
            page.click("tr[data-node=approval] details.complete summary")
            page.fill("tr[data-node=approval] details.complete textarea[name=output]", '{"approved_by": "ops"}')
            page.fill("tr[data-node=approval] details.complete input[name=reason]", "approved on the phone")
            page.click("tr[data-node=approval] button.complete")
            expect(page.locator(".notice")).to_contain_text("complete: done")
            expect(page.locator("p.status .badge")).to_have_text("SUCCEEDED", timeout=30_000)

            page.goto(base + "/ui/runs?tag=customer%3D1")
            expect(page.locator("table.runs tbody tr")).to_have_count(1)
            expect(page.locator("table.runs tbody tr a.tag")).to_have_text("customer=1")
            page.goto(base + "/ui/runs?workflow=awaits&status=RUNNING")
            rows = page.locator("table.runs tbody tr")
            expect(rows).to_have_count(5)
            rows.nth(0).locator("input[type=checkbox]").check()
            rows.nth(1).locator("input[type=checkbox]").check()
            expect(page.locator("form.act button[value=selected]")).to_have_text("Apply to the checked runs")
            page.select_option("form.act select[name=action]", "cancel")
            page.fill("form.act input[name=reason]", "duplicates")
            page.screenshot(path=os.path.join(shots, "ui-runs-select.png"), full_page=True)
            page.click("form.act button[value=selected]")
            expect(page.locator(".notice")).to_contain_text("cancel: 2 run(s) acted on, 0 refused")
            page.goto(base + "/ui/runs?workflow=awaits&status=RUNNING")
            page.select_option("form.act select[name=action]", "cancel")
            page.click("form.act button[value=count]")
            expect(page.locator(".notice")).to_contain_text("cancel: 3 run(s) match")
            page.goto(base + "/ui/runs?workflow=awaits&status=RUNNING")
            page.select_option("form.act select[name=action]", "cancel")
            page.fill("form.act input[name=reason]", "customer left")
            page.click("form.act button[value=filter]")
            expect(page).to_have_url(re.compile(r".*/ui/bulk/[0-9a-f-]{36}$"))
            expect(page.locator("p.status .badge")).to_have_text("SUCCEEDED", timeout=30_000)
            expect(page.locator("p.status")).to_contain_text("3 acted on")
            page.screenshot(path=os.path.join(shots, "ui-bulk.png"), full_page=True)
            statuses = sorted(api(base, "GET", f"/v1/runs/{r['id']}")["status"] for r in waiting)
            assert statuses == ["CANCELLED"] * 5 + ["SUCCEEDED"], statuses

            # The overview and the queues, with the worker composer dev runs.
            page.goto(base + "/ui/overview")
            expect(page.locator("section.card")).to_have_count(4)
            expect(page.locator("section.card").first).to_contain_text("CANCELLED")
            expect(page.locator("svg.throughput rect").first).to_be_visible()
            page.screenshot(path=os.path.join(shots, "ui-overview.png"), full_page=True)
            page.goto(base + "/ui/queues")
            expect(page.locator("table.queues tr[data-queue=http]")).to_be_visible()
            expect(page.locator("table.workers tbody tr").first).to_contain_text("http")
            # composer dev's worker, long-polling: once per queue, waiting for work.
            http_rows = page.locator("table.workers tbody tr", has=page.locator("td", has_text=re.compile("^http$")))
            expect(http_rows).to_have_count(1)
            expect(http_rows.locator("td.poll")).to_have_text("waiting for work", timeout=15_000)
            page.screenshot(path=os.path.join(shots, "ui-queues.png"), full_page=True)

            # Labels fit their boxes, drawn in this browser's own font.
            api(base, "POST", "/v1/workflows", {"name": "wide", "nodes": [
                {"id": "W" * 40, "type": "WAIT_FOR_EVENT", "config": {"event": "e", "key": "k"}},
                {"id": "charge_the_customer_for_the_whole_order", "type": "TRANSFORM", "config": {"output": 1}}]})
            page.goto(base + "/ui/workflows/wide")
            expect(page.locator("svg.dag g.node")).to_have_count(2)
            overflows = page.evaluate("""() => [...document.querySelectorAll("svg.dag g.node")].flatMap(g => {
                const box = g.querySelector("rect").getBBox();
                return [...g.querySelectorAll("text")].filter(t => {
                    const b = t.getBBox();
                    return b.x < box.x || b.x + b.width > box.x + box.width - 4;
                }).map(t => t.textContent);
            })""")
            assert overflows == [], f"labels out of their boxes: {overflows}"
            expect(page.locator("svg.dag g.node title").first).to_contain_text("W" * 40)

            # Events whose trigger failed, replayed from the events page once
            # the trigger is fixed: the dry run says what it would start, the
            # replay starts it once per event, and its page shows the count.
            api(base, "POST", "/v1/workflows", {"name": "billing", "nodes": [
                {"id": "bill", "type": "TRANSFORM", "config": {"output": "${ .input }"}}],
                "triggers": [{"event": "invoice.paid", "input": "${ .event.payload.nope | error(\"not yet\") }"}]})
            for n in range(2):
                sent = api(base, "POST", "/v1/events", {"name": "invoice.paid", "id": f"inv-{n}", "payload": {"n": n}})
                assert len(sent["trigger_errors"]) == 1, sent
            api(base, "POST", "/v1/workflows", {"name": "billing", "nodes": [
                {"id": "bill", "type": "TRANSFORM", "config": {"output": "${ .input }"}}],
                "triggers": [{"event": "invoice.paid"}]})
            utc = time.gmtime
            fmt = "%Y-%m-%dT%H:%M"
            since, until = time.strftime(fmt, utc(time.time() - 3600)), time.strftime(fmt, utc(time.time() + 3600))

            def replay_form(button):
                page.goto(base + "/ui/events")
                page.fill("form#replay input[name=from]", since)
                page.fill("form#replay input[name=to]", until)
                page.fill("form#replay input[name=name]", "invoice.paid")
                page.check("form#replay input[name=failed_only]")
                page.fill("form#replay input[name=reason]", "billing's trigger fixed")
                page.click(f"form#replay button[value={button}]")

            replay_form("count")
            expect(page.locator("p.notice")).to_contain_text("2 event(s) match")
            expect(page.locator("table.preview td.would-start")).to_have_count(2)
            expect(page.locator("table.preview td.would-start").first).to_have_text("billing (trigger 0)")
            replay_form("start")
            expect(page).to_have_url(re.compile(r".*/ui/replays/[0-9a-f-]{36}$"))
            expect(page.locator("p.status .badge")).to_have_text("SUCCEEDED", timeout=30_000)
            expect(page.locator("p.status span.started")).to_have_text("2")
            expect(page.locator("p.meta")).to_contain_text("billing's trigger fixed")
            replay_id = page.url.rsplit("/", 1)[1]
            events = api(base, "GET", "/v1/events?name=invoice.paid")["events"]
            assert [e["started_runs"][0]["replayed_by"] for e in events] == [replay_id] * 2, events
            assert all(e["trigger_errors"] == [] for e in events), events

            # An approval from the inbox: listed under All (the API token's
            # holder is assigned nothing), opened, its form filled in (a
            # number over the form's maximum is refused by name), approved
            # for the person named, and the run goes on with the data.
            api(base, "POST", "/v1/workflows", {"name": "refund", "nodes": [
                {"id": "ok", "type": "APPROVAL", "config": {
                    "prompt": "Refund ${ .input.amount } to ${ .input.customer }?",
                    "assignees": {"people": ["ana"], "groups": ["finance"]},
                    "form": {"type": "object", "required": ["amount"], "properties": {
                        "amount": {"type": "integer", "maximum": 500},
                        "channel": {"enum": ["card", "bank"]}}}}},
                {"id": "pay", "type": "TRANSFORM", "config": {"output": "${ .nodes.ok.output.data }"}}],
                "edges": [{"from": "ok", "to": "pay"}]})
            refund = api(base, "POST", "/v1/runs", {"workflow": "refund", "input": {"amount": 120, "customer": "c-7"}})
            page.goto(base + "/ui/approvals")
            expect(page.locator("table.approvals")).to_contain_text("No approval waits here.")
            page.click("nav.tabs a:has-text('All')")
            expect(page.locator("table.approvals tbody tr")).to_have_count(1, timeout=30_000)
            page.click("table.approvals a:has-text('Refund 120 to c-7?')")
            expect(page.locator("blockquote.prompt")).to_have_text("Refund 120 to c-7?")
            page.screenshot(path=os.path.join(shots, "ui-approval.png"), full_page=True)
            page.fill("form#decide input[name='data.amount']", "900")
            page.fill("form#decide input[name=as]", "ana")
            page.click("form#decide button.approve")
            expect(page.locator("main")).to_contain_text("does not match the form")
            page.go_back()
            page.fill("form#decide input[name='data.amount']", "120")
            page.select_option("form#decide select[name='data.channel']", label="bank")
            page.fill("form#decide input[name=as]", "ana")
            page.fill("form#decide textarea[name=comment]", "receipt checked")
            page.click("form#decide button.approve")
            expect(page.locator("p.notice.approved")).to_have_text("Approved by ana.")
            expect(page.locator("table.votes td.approve")).to_have_count(1)
            expect(page.locator("table.votes")).to_contain_text("receipt checked")
            done = wait_for_run(base, refund["id"], "SUCCEEDED")
            assert done["output"]["pay"] == {"amount": 120, "channel": "bank"}, done
            page.goto(base + f"/ui/runs/{refund['id']}")
            page.click("tr[data-node=ok] a.approval")
            expect(page.locator("p.notice.approved")).to_have_text("Approved by ana.")

            # Logging out ends the session.
            page.click("header button.logout")
            expect(page).to_have_url(base + "/ui/login")
            page.goto(base + "/ui/runs")
            expect(page).to_have_url(base + "/ui/login?next=%2Fui%2Fruns")
            browser.close()
        run = api(base, "GET", f"/v1/runs/{failed['id']}")
        assert run["status"] == "SUCCEEDED", run
        print("ui: browser test passed" + (f"; screenshots in {shots}" if keep_shots else ""))
    finally:
        dev.send_signal(signal.SIGTERM)
        try:
            dev.wait(timeout=30)
        except subprocess.TimeoutExpired:
            dev.kill()
            dev.wait()
        payments.shutdown()
        shutil.rmtree(work, ignore_errors=True)
        if not keep_shots:
            shutil.rmtree(shots, ignore_errors=True)


if __name__ == "__main__":
    main()
