"""Runs every example in examples/ on `composer dev`, as shipped, to the end
tests/examples/runs.json gives it, through the CLI a user types.

    python3 tests/examples/run.py COMPOSER_BINARY [--url URL]

Without --url it starts `composer dev` on its embedded PostgreSQL and Redis
in a temp dir (the demo target at /demo included) and stops it at the end;
with --url it drives a dev already running there. A file in examples/ that
runs.json does not name, or a name without its file, is a failure: a new
example must say how it runs and where it ends. Prints one line per run and
ends with `tests: N passed, M failed`.
"""

import hashlib
import hmac
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
MANIFEST = json.loads((pathlib.Path(__file__).parent / "runs.json").read_text())
WRITTEN_FOR = "http://127.0.0.1:8080"
WEBHOOK_SECRET = "whsec_examples_only_0123456789"
ENDED = ("SUCCEEDED", "FAILED", "CANCELLED")
RUN_TIMEOUT = 90

passed = 0
failed = 0


def report(ok, what, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok    {what}")
    else:
        failed += 1
        print(f"FAIL  {what}: {detail}")


class Composer:
    def __init__(self, binary, url):
        self.binary, self.url = binary, url

    def __call__(self, *args, ok=True):
        env = {**os.environ, "COMPOSER_URL": self.url}
        out = subprocess.run(
            [self.binary, *args, "-o", "json"],
            check=False,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        if ok and out.returncode != 0:
            raise RuntimeError(
                f"composer {' '.join(args)}: exit {out.returncode}: {out.stderr.strip()}"
            )
        return json.loads(out.stdout) if out.stdout.strip() else None

    def wait(self, run_id):
        give_up = time.monotonic() + RUN_TIMEOUT
        while True:
            run = self("run", "get", run_id)
            if run["status"] in ENDED or time.monotonic() > give_up:
                return run
            time.sleep(0.2)

    def runs_of(self, workflow):
        return self("run", "list", "--workflow", workflow, "--limit", "100")["runs"]


def here(value, url):
    """The manifest's value with this dev's address for 127.0.0.1:8080."""
    return json.loads(json.dumps(value).replace(WRITTEN_FOR, url))


def contains(whole, part):
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(
            k in whole and contains(whole[k], v) for k, v in part.items()
        )
    return whole == part


def every_file_is_named():
    files = sorted(
        str(p.relative_to(EXAMPLES))
        for p in EXAMPLES.rglob("*")
        if p.is_file() and p.suffix in (".json", ".yaml", ".yml")
    )
    named = [e["file"] for e in MANIFEST["examples"]]
    for f in files:
        report(
            f in named,
            f"{f} is in tests/examples/runs.json",
            "add how it runs and where it ends",
        )
    for f in named:
        report(
            f in files,
            f"runs.json's {f} exists in examples/",
            "remove it or add the file",
        )
    readme = (EXAMPLES / "README.md").read_text()
    for f in files:
        report(
            f"`{f}`" in readme, f"examples/README.md shows {f}", "add it to the table"
        )


def check_run(c, what, run, spec, handlers_before=()):
    ok = run["status"] == spec["end"]
    if ok and "output" in spec:
        ok = contains(run.get("output"), spec["output"])
    if ok and "error" in spec:
        ok = spec["error"] in (run.get("error") or "")
    detail = json.dumps({k: run.get(k) for k in ("status", "error", "output")})[:600]
    report(ok, f"{what} ended {spec['end']}", detail)
    if ok and "handler" in spec:
        handler = spec["handler"]
        deadline = time.monotonic() + RUN_TIMEOUT
        while True:
            runs = [
                r
                for r in c.runs_of(handler["workflow"])
                if r["status"] == handler["end"] and r["id"] not in handlers_before
            ]
            if runs or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        report(
            bool(runs),
            f"{what}: its failure handler {handler['workflow']} ended {handler['end']}",
            "no such run",
        )


def apply(c, path):
    c("workflow", "apply", "-f", str(EXAMPLES / path))


def workflow_example(c, url, example):
    apply(c, example["file"])
    workflow = workflow_name(example["file"])
    if "started_by" in example:
        event = example["started_by"]
        c("event", "send", event["name"], "--payload", json.dumps(event["payload"]))
        deadline = time.monotonic() + RUN_TIMEOUT
        while not c.runs_of(workflow) and time.monotonic() < deadline:
            time.sleep(0.2)
        runs = c.runs_of(workflow)
        if not runs:
            report(
                False,
                f"{example['file']}: event {event['name']} starts a run",
                "no run started",
            )
            return
        check_run(
            c,
            f"{example['file']} (started by {event['name']})",
            c.wait(runs[0]["id"]),
            example["runs"][0],
        )
        return
    for i, spec in enumerate(example["runs"]):
        handler = spec.get("handler")
        before = {r["id"] for r in c.runs_of(handler["workflow"])} if handler else set()
        started = c(
            "run", "start", workflow, "--input", json.dumps(here(spec["input"], url))
        )
        for event in spec.get("events", []):
            c(
                "event",
                "send",
                event["name"],
                event["key"],
                "--payload",
                json.dumps(event["payload"]),
            )
        check_run(
            c, f"{example['file']} run {i + 1}", c.wait(started["id"]), spec, before
        )


def workflow_name(file):
    text = (EXAMPLES / file).read_text()
    if file.endswith(".json"):
        return json.loads(text)["name"]
    return next(
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("name:")
    )


def schedule_example(c, example):
    spec = json.loads((EXAMPLES / example["file"]).read_text())
    c("schedule", "create", "-f", str(EXAMPLES / example["file"]))
    started = c("schedule", "trigger", spec["id"])
    check_run(
        c, f"{example['file']} (triggered)", c.wait(started["id"]), example["runs"][0]
    )
    c("schedule", "delete", spec["id"])


def webhook_example(c, url, example):
    spec = json.loads((EXAMPLES / example["file"]).read_text())
    c("webhook", "create", "-f", str(EXAMPLES / example["file"]))
    body = json.dumps(example["delivery"]).encode()
    stamp = str(int(time.time()))
    signature = hmac.new(
        WEBHOOK_SECRET.encode(), stamp.encode() + b"." + body, hashlib.sha256
    ).hexdigest()
    request = urllib.request.Request(
        f"{url}/v1/webhooks/{spec['name']}",
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Stripe-Signature": f"t={stamp},v1={signature}",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            status = answer.status
    except urllib.error.HTTPError as e:
        status = e.code
    report(
        200 <= status < 300,
        f"{example['file']}: a signed delivery is taken",
        f"HTTP {status}",
    )
    events = c("event", "list")["events"]
    name = example["delivery"]["type"]
    report(
        any(e["name"] == name for e in events),
        f"{example['file']}: event {name} recorded",
        json.dumps(events)[:300],
    )


def start_dev(binary, work):
    addr = work / "addr"
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSER_")}
    env.update(
        COMPOSER_LISTEN="127.0.0.1:0",
        COMPOSER_ADDR_FILE=str(addr),
        COMPOSER_DATA_DIR=str(work / "data"),
        COMPOSER_LOG="warn",
        COMPOSER_WEBHOOK_SECRET_STRIPE_SIGNING=WEBHOOK_SECRET,
    )
    dev = subprocess.Popen([binary, "dev"], cwd=work, env=env, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not addr.exists():
        if dev.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"composer dev did not start (exit {dev.poll()})")
        time.sleep(0.1)
    return dev, addr.read_text().strip()


def main():
    binary = str(pathlib.Path(sys.argv[1]).resolve())
    url = sys.argv[sys.argv.index("--url") + 1] if "--url" in sys.argv else None
    every_file_is_named()
    dev = None
    work = pathlib.Path(tempfile.mkdtemp(prefix="composer-examples-"))
    os.chmod(
        work, 0o711
    )  # as root, the embedded PostgreSQL (user postgres) must enter it
    try:
        if url is None:
            dev, url = start_dev(binary, work)
        c = Composer(binary, url)
        for example in MANIFEST["examples"]:
            try:
                for need in example.get("needs", []):
                    apply(c, need)
                kind = example.get("kind", "workflow")
                if kind == "schedule":
                    schedule_example(c, example)
                elif kind == "webhook":
                    webhook_example(c, url, example)
                else:
                    workflow_example(c, url, example)
            # One example's failure is counted; the others still run.
            except (
                RuntimeError,
                KeyError,
                ValueError,
                OSError,
                subprocess.TimeoutExpired,
            ) as e:
                report(False, example["file"], str(e)[:600])
    finally:
        if dev is not None:
            dev.send_signal(signal.SIGTERM)
            try:
                status = dev.wait(timeout=60)
            except subprocess.TimeoutExpired:
                dev.kill()
                status = "killed after 60 s"
            report(status == 0, "composer dev stops cleanly", f"exit {status}")
        subprocess.run(["rm", "-rf", str(work)], check=False)
    print(f"tests: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
