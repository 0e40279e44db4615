#!/usr/bin/env python3
"""Signing in to the UI with OpenID Connect, end to end in Chromium.

Starts a real OpenID Provider (oidc-provider from npm, OpenID certified:
tests/oidc/provider.mjs) and `composer dev` configured to use it, then signs
in as three people: an administrator (`composer-admins`: every page, the
audit log, a form that changes a limit, recorded under their name), a
reader (`composer-readers`: pages yes; the audit log and forms, 403), a
member of a team with a role in one namespace alone (`billing-team`: lands
in it, sees it alone, is refused in `default`) and a person in no group
with a role (`interns`), who is refused and gets no session.

Usage: sso_test.py COMPOSER_BINARY   (run `npm ci` in tests/oidc first)
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from playwright.sync_api import expect, sync_playwright

TOKEN = "sso-test-api-token-0123456789"
# A `+` and a `%`, as `openssl rand -base64` makes: form-encoded before Basic.
SECRET = "sso-test-client+secret%0123456789"
CHROMIUM = os.environ.get("COMPOSER_CHROMIUM", "/usr/bin/chromium")
HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(base, method, path, body=None):
    req = urllib.request.Request(
        base + path,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"authorization": "Bearer " + TOKEN, "content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read() or b"null")


def wait_until(what, ok, timeout=90):
    until = time.time() + timeout
    while not ok():
        assert time.time() < until, what
        time.sleep(0.2)


def sign_in(browser, base, login):
    """A new browser (no cookies) signs in as `login` through the provider's own pages."""
    context = browser.new_context()
    page = context.new_page()
    page.goto(base + "/ui/runs")
    expect(page).to_have_url(base + "/ui/login?next=%2Fui%2Fruns")
    page.click("a.sso")
    page.fill("input[name=login]", login)
    page.fill("input[name=password]", "any password")
    page.click("button[type=submit]")
    page.click("button[type=submit]")  # the provider's consent: Continue
    return context, page


def main():
    binary = os.path.abspath(sys.argv[1])
    work = tempfile.mkdtemp(prefix="composer-sso-")
    os.chmod(work, 0o755)  # run as root, the embedded PostgreSQL runs as postgres
    composer_port, issuer_port = free_port(), free_port()
    base = f"http://127.0.0.1:{composer_port}"
    issuer = f"http://127.0.0.1:{issuer_port}"
    provider = subprocess.Popen(
        ["node", os.path.join(HERE, "..", "oidc", "provider.mjs"), str(issuer_port),
         base + "/ui/sso/callback", SECRET],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSER_")}
    env.update(COMPOSER_LISTEN=f"127.0.0.1:{composer_port}", COMPOSER_API_TOKEN=TOKEN, COMPOSER_LOG="warn",
               COMPOSER_OIDC_ISSUER=issuer, COMPOSER_OIDC_CLIENT_ID="composer",
               COMPOSER_OIDC_CLIENT_SECRET=SECRET, COMPOSER_OIDC_SCOPES="openid email groups",
               COMPOSER_OIDC_ROLES="composer-admins=admin;composer-readers=read;billing-team@billing=read,runs:control")
    dev = subprocess.Popen([binary, "dev"], cwd=work, env=env, stdin=subprocess.DEVNULL)
    try:
        assert provider.stdout.readline().strip() == "ready", "the provider did not start"

        def up():
            assert dev.poll() is None, "composer dev exited"
            try:
                return urllib.request.urlopen(base + "/readyz", timeout=2).status == 200
            except OSError:
                return False

        wait_until("composer dev did not start", up)
        api(base, "POST", "/v1/workflows", {"name": "greet", "nodes": [
            {"id": "hello", "type": "TRANSFORM", "config": {"output": "hello ${ .input.who }"}}]})
        api(base, "POST", "/v1/runs", {"workflow": "greet", "input": {"who": "ada"}})
        api(base, "POST", "/v1/namespaces", {"name": "billing"})
        api(base, "POST", "/v1/workflows?namespace=billing", {"name": "invoice", "nodes": [
            {"id": "bill", "type": "TRANSFORM", "config": {"output": "billed"}}]})
        api(base, "POST", "/v1/runs?namespace=billing", {"workflow": "invoice", "input": {}})

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])

            # An administrator: in, every page, a change recorded under their name.
            context, page = sign_in(browser, base, "admin-ada")
            expect(page).to_have_url(base + "/ui/runs")
            expect(page.locator("body")).to_contain_text("greet")
            page.goto(base + "/ui/limits")
            page.fill("form.set-limit input[name=key]", "partner:sso")
            page.fill("form.set-limit input[name=concurrency]", "2")
            page.click("form.set-limit button[type=submit]")
            expect(page).to_have_url(base + "/ui/limits?msg=limit-done")
            page.goto(base + "/ui/audit")
            expect(page.locator("body")).to_contain_text("admin-ada@example.com")
            entries = api(base, "GET", "/v1/audit?actor=admin-ada%40example.com")["entries"]
            assert [e["route"] for e in entries] == ["/ui/limits"], entries
            assert entries[0]["request"]["key"] == "partner:sso", entries
            context.close()

            # A reader: pages, but neither the audit log nor a form.
            context, page = sign_in(browser, base, "reader-bob")
            expect(page).to_have_url(base + "/ui/runs")
            answer = page.goto(base + "/ui/audit")
            assert answer.status == 403, answer.status
            expect(page.locator("body")).to_contain_text("lacks the scope admin")
            page.goto(base + "/ui/limits")
            page.fill("form.set-limit input[name=key]", "partner:reader")
            page.fill("form.set-limit input[name=concurrency]", "3")
            page.click("form.set-limit button[type=submit]")
            expect(page.locator("body")).to_contain_text("lacks the scope limits:write")
            context.close()

            # A team with a role in one namespace: lands there, sees it alone, is refused elsewhere.
            context, page = sign_in(browser, base, "billing-dana")
            expect(page).to_have_url(base + "/ui/runs")
            expect(page.locator("header a.namespace")).to_have_text("billing")
            expect(page.locator("main")).to_contain_text("invoice")
            expect(page.locator("main")).not_to_contain_text("greet")
            page.goto(base + "/ui/namespaces")
            expect(page.locator("tr[data-namespace=billing]")).to_have_count(1)
            expect(page.locator("tr[data-namespace=default]")).to_have_count(0)
            expect(page.locator("body")).not_to_contain_text("Create a namespace")
            answer = page.goto(base + "/ui/runs?namespace=default")
            assert answer.status == 403, answer.status
            expect(page.locator("body")).to_contain_text("holds no scope in namespace default")
            answer = page.goto(base + "/ui/audit")
            assert answer.status == 403, answer.status
            expect(page.locator("body")).to_contain_text("lacks the scope admin in namespace billing")
            context.close()

            # A person no group of whose has a role: refused, and no session.
            context, page = sign_in(browser, base, "intern-carl")
            expect(page.locator("body")).to_contain_text("none of your groups (interns)")
            page.goto(base + "/ui/runs")
            expect(page).to_have_url(base + "/ui/login?next=%2Fui%2Fruns")
            context.close()
            browser.close()
        print("ui: sign-in with OpenID Connect passed")
    finally:
        for proc in (dev, provider):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
