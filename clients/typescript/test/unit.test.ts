/** Tests that need no server: the secret rules (against the Python worker's own), error mapping, timeouts, paging loops, namespaces. */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";

import {
  Client,
  ComposerError,
  ConflictError,
  InvalidRequestError,
  NotFoundError,
  TaskError,
  UnauthorizedError,
  UnavailableError,
  Worker,
  type JsonValue,
} from "../src/index.js";
import { resolveSecrets, scrubSecrets } from "../src/secrets.js";
import { defaultQueue, echoedStages, priorityOf } from "../src/worker.js";
import { PACKAGE_DIR } from "./dev.js";
import { eventually, fakeServer, json, memoryLogger } from "./helpers.js";

const ENV = { COMPOSER_SECRET_API_KEY: "s3cr3t-value", COMPOSER_SECRET_A: "alpha", COMPOSER_SECRET_B: "bravo-2", COMPOSER_SECRET_EMPTY: "", COMPOSER_SECRET_SHORT: "ab", COMPOSER_SECRET_SAME: "alpha" };

type Resolved = { ok: JsonValue; used: string[] } | { error: string; retryable: boolean };

function resolveJs(input: JsonValue): Resolved {
  const used: string[] = [];
  try {
    return { ok: resolveSecrets(input, used, ENV), used };
  } catch (e) {
    assert.ok(e instanceof TaskError);
    return { error: e.message, retryable: e.retryable };
  }
}

const RESOLVE_CASES: JsonValue[] = [
  { h: "Bearer ${ .secrets.API_KEY }", data: "$${ .input.x }", n: 1, "$${k}": ["${.secrets.API_KEY}"] },
  "${.secrets.A}${ .secrets.B }-${  .secrets.A  }",
  "${\t.secrets.A\n}",
  "${ \u3000.secrets.A\u00a0}",
  "${ \u001c.secrets.A \u0085}",
  "${ \ufeff.secrets.A }",
  "${ .secrets.A.b }",
  "${ .secrets.1A }",
  "${ .secrets.A | ascii }",
  "${ .secrets. A }",
  "${ .secret.A }",
  "$$${ .secrets.A }",
  "$${{ .secrets.A }}",
  "no reference: $ { .secrets.A } and $A",
  { "${ .secrets.A }": "key stays", "$${x}": "${ .secrets.B }", nested: [[{ deep: "${ .secrets.A }" }], true, null, 2.5] },
  { empty: "${ .secrets.EMPTY }", same: "${ .secrets.SAME } ${ .secrets.A }" },
  "${ .secrets.MISSING }",
  ["ok", "${ .secrets.A }", "${ .secrets.NOPE_2 }"],
  [],
  {},
  42,
  null,
];

const SCRUB_CASES: Array<{ value: JsonValue; secrets: string[] }> = [
  { value: { echo: "got s3cr3t-value" }, secrets: ["s3cr3t-value"] },
  { value: "ab and abc", secrets: ["ab"] },
  { value: "ab and abc", secrets: ["abc"] },
  { value: { "key alpha": ["alpha", "alphaalpha", { alpha: 1 }], n: 3, t: true, z: null }, secrets: ["alpha"] },
  { value: "xabcdefx", secrets: ["abcdef", "cde"] },
  { value: "xabcdefx", secrets: ["cde", "abcdef"] },
  { value: "a.b*c$& and $$ a.b*c$&", secrets: ["a.b*c$&"] },
  { value: "пароль: пароль", secrets: ["пароль"] },
  { value: "\u{1F600}\u{1F600} and \u{1F600}\u{1F600}\u{1F600}", secrets: ["\u{1F600}\u{1F600}", "\u{1F600}\u{1F600}\u{1F600}"] },
  { value: "nothing to hide", secrets: [] },
  { value: "empty", secrets: [""] },
  { value: 'PASSWORD1, %70assWord1, pass+word1, "pass\\u0077ord1", cGFzc3dvcmQx', secrets: ["password1", "pass word1"] },
  { value: "Basic dXNlcjpTdXAzciJTZWNy4oKsdC8rPT8meA==", secrets: ['Sup3r"Secr€t/+=?&x'] },
  { value: "Sup3r%22Secr%E2%82%ACt/%2B%3D%3F%26x and Sup3r\\\"Secr\\u20act\\/+=?&x", secrets: ['Sup3r"Secr€t/+=?&x'] },
  { value: "zq and ZQ and \u{1F600}\u{1F600}\u{1F600}\u{1F600} \\ud83d\\ude00", secrets: ["zq", "\u{1F600}"] },
];

describe("secrets", () => {
  it("resolves references, unescapes $${, and scrubs the values used (the Python worker's own test)", () => {
    const used: string[] = [];
    const got = resolveSecrets(
      { h: "Bearer ${ .secrets.API_KEY }", data: "$${ .input.x }", n: 1, "$${k}": ["${.secrets.API_KEY}"] },
      used,
      ENV,
    );
    assert.deepEqual(got, { h: "Bearer s3cr3t-value", data: "${ .input.x }", n: 1, "${k}": ["s3cr3t-value"] });
    assert.deepEqual(used, ["s3cr3t-value"]);
    assert.deepEqual(scrubSecrets({ echo: "got s3cr3t-value" }, used), { echo: "got [secret]" });
    assert.throws(
      () => resolveSecrets("${ .secrets.MISSING }", [], ENV),
      (e: unknown) => e instanceof TaskError && !e.retryable && /unknown secret MISSING: set COMPOSER_SECRET_MISSING/.test(e.message),
    );
  });

  it("reads process.env by default and leaves text without a reference alone", () => {
    process.env["COMPOSER_SECRET_TS_UNIT"] = "from-the-env";
    try {
      const used: string[] = [];
      assert.equal(resolveSecrets("x ${ .secrets.TS_UNIT }", used), "x from-the-env");
      assert.deepEqual(used, ["from-the-env"]);
      const plain = { a: "$ {", b: ["no"] };
      assert.deepEqual(resolveSecrets(plain, []), plain);
    } finally {
      delete process.env["COMPOSER_SECRET_TS_UNIT"];
    }
  });

  it("keeps a __proto__ key as data", () => {
    const input = JSON.parse('{"__proto__": {"x": "${ .secrets.A }"}}') as JsonValue;
    const used: string[] = [];
    const got = resolveSecrets(input, used, ENV) as Record<string, JsonValue>;
    assert.deepEqual(Object.getPrototypeOf(got), Object.prototype);
    assert.equal(JSON.stringify(got), '{"__proto__":{"x":"alpha"}}');
    assert.equal(JSON.stringify(scrubSecrets(got, used)), '{"__proto__":{"x":"[secret]"}}');
  });

  it("follows the Python worker's rules exactly, case by case", (t) => {
    const python = spawnSync("python3", ["--version"]);
    const modules = ["composer_client/worker.py", "composer_worker.py"].map((m) => join(PACKAGE_DIR, "..", "python", m));
    if (!modules.some((m) => existsSync(m)) || python.status !== 0) {
      t.skip("python3 or the Python worker (clients/python) is missing");
      return;
    }
    const script = `
import json, os, sys
sys.path.insert(0, ${JSON.stringify(join(PACKAGE_DIR, "..", "python"))})
try:
    from composer_client import worker as w
except ImportError:
    import composer_worker as w
cases = json.load(sys.stdin)
os.environ.update(cases["env"])
out = {"resolve": [], "scrub": []}
for c in cases["resolve"]:
    used = []
    try:
        out["resolve"].append({"ok": w._resolve(c, used), "used": used})
    except w.TaskError as e:
        out["resolve"].append({"error": e.message, "retryable": e.retryable})
for c in cases["scrub"]:
    out["scrub"].append(w._scrub(c["value"], c["secrets"]))
json.dump(out, sys.stdout)
`;
    const run = spawnSync("python3", ["-c", script], {
      input: JSON.stringify({ env: ENV, resolve: RESOLVE_CASES, scrub: SCRUB_CASES }),
      encoding: "utf8",
    });
    assert.equal(run.status, 0, run.stderr);
    const py = JSON.parse(run.stdout) as { resolve: Resolved[]; scrub: JsonValue[] };
    RESOLVE_CASES.forEach((c, i) => assert.deepEqual(resolveJs(c), py.resolve[i], `resolve ${JSON.stringify(c)}`));
    SCRUB_CASES.forEach((c, i) =>
      assert.deepEqual(scrubSecrets(c.value, c.secrets), py.scrub[i], `scrub ${JSON.stringify(c)}`),
    );
  });
});

describe("errors", () => {
  it("maps each error answer to its class, with the server's status, code and message", async () => {
    const server = await fakeServer((req, _body, res) => {
      const status = Number(req.url?.split("/")[3]);
      if (status === 502) {
        res.writeHead(502, { "content-type": "text/html" });
        res.end("<html>bad gateway</html>");
      } else {
        json(res, status, { error: { code: `code_${status}`, message: `message ${status}` } }, status === 503 ? { "retry-after": "2" } : {});
      }
    });
    try {
      const client = new Client({ url: server.url });
      const cases: Array<[number, typeof ComposerError]> = [
        [400, InvalidRequestError],
        [413, InvalidRequestError],
        [415, InvalidRequestError],
        [401, UnauthorizedError],
        [403, UnauthorizedError],
        [404, NotFoundError],
        [405, InvalidRequestError],
        [409, ConflictError],
        [422, InvalidRequestError],
        [421, ComposerError],
        [429, UnavailableError],
        [500, UnavailableError],
        [503, UnavailableError],
      ];
      for (const [status, Class] of cases) {
        const err = await client.getRun(`${status}`).then(
          () => assert.fail(`${status} did not throw`),
          (e: unknown) => e,
        );
        assert.ok(err instanceof Class, `${status}: ${String(err)}`);
        assert.ok(err instanceof ComposerError && err instanceof Error);
        assert.equal(err.constructor, Class, `${status} is exactly ${Class.name}`);
        assert.equal(err.name, Class.name);
        assert.equal(err.status, status);
        assert.equal(err.code, `code_${status}`);
        assert.equal(err.message, `message ${status}`);
        assert.equal(err.retryAfterMs, status === 503 ? 2000 : undefined);
      }
      const html = await client.getRun("502").catch((e: unknown) => e);
      assert.ok(html instanceof UnavailableError);
      assert.equal(html.status, 502);
      assert.equal(html.code, "http_error");
      assert.match(html.message, /bad gateway/);
    } finally {
      await server.close();
    }
  });

  it("refuses an answer without composer-version: another server is not taken for a coordinator", async () => {
    for (const status of [200, 404]) {
      const server = await fakeServer((_req, _body, res) => {
        res.writeHead(status, { "content-type": "application/json" });
        res.end(JSON.stringify({ workflows: [] }));
      });
      try {
        const err = await new Client({ url: server.url }).listWorkflows().catch((e: unknown) => e);
        assert.ok(err instanceof ComposerError, String(err));
        assert.equal(err.constructor, ComposerError);
        assert.equal(err.status, status);
        assert.equal(err.code, "not_composer");
        assert.match(err.message, /not a Composer coordinator/);
      } finally {
        await server.close();
      }
    }
  });

  it("sends the token and JSON, and refuses an answer that is not JSON", async () => {
    const server = await fakeServer((_req, _body, res) => {
      res.writeHead(200, { "content-type": "text/plain", "composer-version": "0.0.0-fake" });
      res.end("hello");
    });
    try {
      const client = new Client({ url: `${server.url}///`, token: "tok-1" });
      const err = await client.sendEvent("e", "k", { a: 1 }).catch((e: unknown) => e);
      assert.ok(err instanceof UnavailableError, String(err));
      assert.equal(err.code, "invalid_answer");
      const [req] = server.requests;
      assert.ok(req);
      assert.equal(req.method, "POST");
      assert.equal(req.url, "/v1/events");
      assert.equal(req.headers["authorization"], "Bearer tok-1");
      assert.equal(req.headers["content-type"], "application/json");
      assert.deepEqual(JSON.parse(req.body), { name: "e", key: "k", payload: { a: 1 } });
    } finally {
      await server.close();
    }
  });

  it("sends a start's and an event's traceparent as its header, only when given", async () => {
    const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    const server = await fakeServer((req, _body, res) => {
      if (req.url === "/v1/events") return json(res, 200, { matched: 0, buffered: true });
      return json(res, 201, { id: "r", workflow: "w", version: 1, status: "RUNNING" });
    });
    try {
      const client = new Client({ url: server.url, token: "tok-1" });
      assert.equal((await client.startRun({ workflow: "w", traceparent: tp })).created, true);
      await client.startRun({ workflow: "w" });
      await client.sendEvent("e", "k", null, { traceparent: tp });
      await client.sendEvent("e", "k");
      assert.deepEqual(
        server.requests.map((r) => [r.url, r.headers["traceparent"], r.headers["authorization"], JSON.parse(r.body)]),
        [
          ["/v1/runs", tp, "Bearer tok-1", { workflow: "w" }],
          ["/v1/runs", undefined, "Bearer tok-1", { workflow: "w" }],
          ["/v1/events", tp, "Bearer tok-1", { name: "e", key: "k", payload: null }],
          ["/v1/events", undefined, "Bearer tok-1", { name: "e", key: "k", payload: null }],
        ],
      );
    } finally {
      await server.close();
    }
  });

  it("sends a start's priority only when given, and setRunPriority's as the API takes it", async () => {
    const run = { id: "r/1", workflow: "w", version: 1, status: "RUNNING", priority: 2 };
    const server = await fakeServer((req, _body, res) => json(res, req.method === "PUT" ? 200 : 201, run));
    try {
      const client = new Client({ url: server.url });
      assert.equal((await client.startRun({ workflow: "w", priority: 2, idempotencyKey: "k" })).priority, 2);
      await client.startRun({ workflow: "w", priority: undefined });
      assert.equal((await client.setRunPriority("r/1", 5)).priority, 2, "the run as answered");
      assert.deepEqual(
        server.requests.map((r) => [r.method, r.url, JSON.parse(r.body), r.headers["content-type"]]),
        [
          ["POST", "/v1/runs", { workflow: "w", idempotency_key: "k", priority: 2 }, "application/json"],
          ["POST", "/v1/runs", { workflow: "w" }, "application/json"],
          ["PUT", "/v1/runs/r%2F1/priority", { priority: 5 }, "application/json"],
        ],
      );
    } finally {
      await server.close();
    }
  });

  it("sends the requests of events, backfills and webhooks as the API takes them", async () => {
    const hook = { name: "h", scheme: "github", secret: "GH", url: "/v1/webhooks/h", secret_set: false };
    const server = await fakeServer((req, body, res) => {
      const u = new URL(req.url ?? "", "http://x");
      if (u.pathname === "/v1/events" && req.method === "GET") return json(res, 200, { events: [], next_before: null });
      if (u.pathname === "/v1/events") return json(res, 200, { matched: 0, buffered: true, id: "x", duplicate: false });
      if (u.pathname.endsWith("/backfill")) return json(res, 202, { schedule: "s", fire_times: 2, queued: 2, already: 0 });
      if (u.pathname === "/v1/webhooks" && req.method === "GET") return json(res, 200, { webhooks: [hook] });
      if (u.pathname === "/v1/webhooks") return json(res, body.includes("tolerance") ? 201 : 200, hook);
      if (req.method === "DELETE") return json(res, 200, { deleted: "h" });
      return json(res, 200, hook);
    });
    try {
      const client = new Client({ url: server.url });
      await client.sendEvent("e");
      await client.sendEvent("e", "k", { a: 1 }, { id: "evt-1" });
      await client.listEvents();
      await client.listEvents({ name: "a b", source: "webhook:gh", before: 7, limit: 2 });
      const when = new Date(Date.UTC(2026, 11, 1, 10));
      assert.equal((await client.backfillSchedule("nightly/x", { from: "2026-12-01T00:00:00Z", to: when, overlap: "skip" })).queued, 2);
      const spec = { name: "h", scheme: "github", secret: "GH" } as const;
      assert.equal((await client.createWebhook(spec)).created, false, "200: replaced");
      assert.equal((await client.createWebhook({ ...spec, tolerance: "5m" })).created, true, "201: new");
      assert.deepEqual(await client.listWebhooks(), [hook]);
      await client.getWebhook("a/b");
      assert.deepEqual(await client.deleteWebhook("h"), { deleted: "h" });
      assert.deepEqual(
        server.requests.map((r) => [r.method, r.url, r.body === "" ? undefined : JSON.parse(r.body)]),
        [
          ["POST", "/v1/events", { name: "e", key: "", payload: null }],
          ["POST", "/v1/events", { name: "e", key: "k", payload: { a: 1 }, id: "evt-1" }],
          ["GET", "/v1/events", undefined],
          ["GET", "/v1/events?name=a+b&source=webhook%3Agh&before=7&limit=2", undefined],
          ["POST", "/v1/schedules/nightly%2Fx/backfill", { from: "2026-12-01T00:00:00Z", to: "2026-12-01T10:00:00.000Z", overlap: "skip" }],
          ["POST", "/v1/webhooks", spec],
          ["POST", "/v1/webhooks", { ...spec, tolerance: "5m" }],
          ["GET", "/v1/webhooks", undefined],
          ["GET", "/v1/webhooks/a%2Fb", undefined],
          ["DELETE", "/v1/webhooks/h", undefined],
        ],
      );
    } finally {
      await server.close();
    }
  });

  it("refuses a name . or .. before sending anything: a URL cannot carry it", async () => {
    let calls = 0;
    const server = await fakeServer((_req, _body, res) => {
      calls += 1;
      return json(res, 200, {});
    });
    try {
      const client = new Client({ url: server.url });
      for (const name of [".", ".."]) {
        await assert.rejects(async () => client.getWorkflow(name), (e: unknown) => e instanceof RangeError && /cannot carry/.test(e.message));
        await assert.rejects(async () => client.getLimit(name), RangeError);
      }
      assert.equal(calls, 0, "nothing was sent");
    } finally {
      await server.close();
    }
  });

  it("sends the requests of limits as the API takes them, the key one path segment", async () => {
    const view = { key: "k", set_by: "api", in_use: 0, waiting: 0, updated_at: "2026-12-01T00:00:00Z" };
    const server = await fakeServer((req, _body, res) => {
      const u = new URL(req.url ?? "", "http://x");
      if (u.pathname === "/v1/limits") {
        const after = u.searchParams.get("after") ?? "";
        const keys = ["a", "b", "c"].filter((k) => k > after).slice(0, 2);
        return json(res, 200, { limits: keys.map((key) => ({ ...view, key })), next_after: keys.at(-1) ?? null });
      }
      if (req.method === "DELETE") return json(res, 200, { deleted: "stripe:acct_1/x" });
      return json(res, 200, view);
    });
    try {
      const client = new Client({ url: server.url });
      assert.equal((await client.listLimits()).next_after, "b");
      await client.listLimits({ after: "stripe:a", limit: 2 });
      const keys: string[] = [];
      for await (const l of client.iterateLimits({ limit: 2 })) keys.push(l.key);
      assert.deepEqual(keys, ["a", "b", "c"]);
      await client.getLimit("stripe:acct_1/x");
      await client.setLimit("stripe:acct_1/x", { rate: "25/1s", burst: 5, concurrency: 2 });
      await client.setLimit("a b?#%&=+.~!'()*", { concurrency: 1, rate: null });
      await client.setLimit("named");
      assert.deepEqual(await client.deleteLimit("stripe:acct_1/x"), { deleted: "stripe:acct_1/x" });
      assert.deepEqual(
        server.requests.map((r) => [r.method, r.url, r.body === "" ? undefined : JSON.parse(r.body)]),
        [
          ["GET", "/v1/limits", undefined],
          ["GET", "/v1/limits?after=stripe%3Aa&limit=2", undefined],
          ["GET", "/v1/limits?limit=2", undefined],
          ["GET", "/v1/limits?after=b&limit=2", undefined],
          ["GET", "/v1/limits?after=c&limit=2", undefined],
          ["GET", "/v1/limits/stripe%3Aacct_1%2Fx", undefined],
          ["PUT", "/v1/limits/stripe%3Aacct_1%2Fx", { rate: "25/1s", burst: 5, concurrency: 2 }],
          ["PUT", "/v1/limits/a%20b%3F%23%25%26%3D%2B.~%21%27%28%29%2A", { concurrency: 1 }],
          ["PUT", "/v1/limits/named", {}],
          ["DELETE", "/v1/limits/stripe%3Aacct_1%2Fx", undefined],
        ],
      );
      assert.equal(server.requests[7]?.headers["content-type"], "application/json");
    } finally {
      await server.close();
    }
  });

  it("is an UnavailableError when nothing listens or nothing answers in time", async () => {
    const closed = await fakeServer(() => {});
    await closed.close();
    const refused = await new Client({ url: closed.url }).listWorkflows().catch((e: unknown) => e);
    assert.ok(refused instanceof UnavailableError, String(refused));
    assert.equal(refused.status, 0);
    assert.equal(refused.code, "unreachable");
    assert.match(refused.message, /ECONNREFUSED/);

    const silent = await fakeServer(() => {}); // never answers
    try {
      const started = Date.now();
      const late = await new Client({ url: silent.url, timeoutMs: 300 }).getRun("x").catch((e: unknown) => e);
      assert.ok(late instanceof UnavailableError, String(late));
      assert.equal(late.code, "timeout");
      assert.ok(Date.now() - started < 5_000);
    } finally {
      await silent.close();
    }
  });

  it("refuses a URL that is not http(s), and bad worker options", () => {
    assert.throws(() => new Client({ url: "not a url" }), TypeError);
    assert.throws(() => new Client({ url: "ftp://example.com" }), TypeError);
    const url = "http://127.0.0.1:1";
    assert.throws(() => new Worker({ url, queues: [] }), RangeError);
    assert.throws(() => new Worker({ url, queues: ["has space"] }), TypeError);
    assert.throws(() => new Worker({ url, queues: ["q"], concurrency: 0 }), RangeError);
    assert.throws(() => new Worker({ url, queues: ["q"], concurrency: 10_001 }), /concurrency: expected a whole number from 1 to 10000/);
    assert.throws(() => new Worker({ url, queues: ["q"], urgentSlots: -1 }), /urgentSlots/);
    assert.throws(() => new Worker({ url, queues: ["q"], urgentSlots: 10_001 }), /urgentSlots/);
    assert.throws(() => new Worker({ url, queues: ["q"], urgentSlots: 1.5 }), /urgentSlots/);
    assert.equal(new Worker({ url, queues: ["q"] }).urgentSlots, 0);
    assert.throws(() => new Worker({ url, queues: ["q"], workerId: "a/b" }), TypeError);
    assert.match(new Worker({ url, queues: ["q"] }).workerId, /^ts-[A-Za-z0-9_.-]+-\d+$/);
    assert.throws(() => new Worker({ url, queues: [".."] }), TypeError);
    assert.throws(() => new Worker({ url, queues: Array.from({ length: 33 }, (_, i) => `q${i}`) }), RangeError);
  });

  it("polls by default the queue each handler's type goes to (its name in lower case), each once, checked at start", async () => {
    const url = "http://127.0.0.1:1";
    const noop = () => null;
    assert.deepEqual(new Worker({ url }).queues, []);
    const w = new Worker({ url }).handle("Thumb", noop).handle("thumb", noop).handle("Resize-Image.v2", noop);
    assert.deepEqual(w.queues, ["resize-image.v2", "thumb"]);
    assert.deepEqual(new Worker({ url, queues: ["a", "b"] }).handle("Thumb", noop).queues, ["a", "b"]);
    // Only ASCII letters are lowered, as the coordinator does.
    assert.equal(defaultQueue("ÀB"), "Àb");
    // What the task API would refuse in every poll is refused by run(), before any.
    await assert.rejects(new Worker({ url }).run(), /no handlers/);
    await assert.rejects(new Worker({ url }).handle("has space", noop).run(), /handler for type 'has space'.*pass queues/);
    const many = new Worker({ url });
    for (let i = 0; i < 33; i++) many.handle(`t${i}`, noop);
    await assert.rejects(many.run(), /queues: 33 \(one per handler type\): a worker may poll at most 32/);
  });
});

describe("namespaces", () => {
  it("names the client's namespace in every call, and none without one", async () => {
    const server = await fakeServer((req, _body, res) => {
      if (req.url === "/v1/workflows") return json(res, 200, { workflows: [] });
      return json(res, req.method === "POST" && req.url === "/v1/runs" ? 201 : 200, { id: "r", workflow: "w", version: 1, status: "RUNNING" });
    });
    try {
      const team = new Client({ url: server.url, token: "tok-1", namespace: "team-a" });
      assert.equal(team.namespace, "team-a");
      await team.listWorkflows();
      await team.startRun({ workflow: "w" });
      await team.getRun("r");
      await team.cancelRun("r");
      for (const plain of [new Client({ url: server.url }), new Client({ url: server.url, namespace: "" })]) {
        assert.equal(plain.namespace, undefined);
        await plain.listWorkflows();
      }
      assert.deepEqual(
        server.requests.map((r) => [r.method, r.url, r.headers["composer-namespace"]]),
        [
          ["GET", "/v1/workflows", "team-a"],
          ["POST", "/v1/runs", "team-a"],
          ["GET", "/v1/runs/r", "team-a"],
          ["POST", "/v1/runs/r/cancel", "team-a"],
          ["GET", "/v1/workflows", undefined],
          ["GET", "/v1/workflows", undefined],
        ],
      );
    } finally {
      await server.close();
    }
  });

  it("refuses a name the server would refuse, in the client and the worker, before anything is sent", async () => {
    let calls = 0;
    const server = await fakeServer((_req, _body, res) => {
      calls += 1;
      return json(res, 200, { workflows: [] });
    });
    try {
      for (const bad of ["Team-a", "1team", "-team", "team_a", "team.a", "a".repeat(64), "tëam", "team\n", " team"]) {
        const named = (e: unknown) => e instanceof TypeError && e.message.startsWith("namespace: expected 1 to 63 lowercase letters");
        assert.throws(() => new Client({ url: server.url, namespace: bad }), named, JSON.stringify(bad));
        assert.throws(() => new Worker({ url: server.url, queues: ["q"], namespace: bad }), named, JSON.stringify(bad));
      }
      assert.equal(calls, 0, "nothing was sent");
      await new Client({ url: server.url, namespace: `a${"-".repeat(62)}` }).listWorkflows(); // 63 characters: the longest
      assert.equal(calls, 1);
    } finally {
      await server.close();
    }
  });

  it("sends the requests of namespaces as the API takes them", async () => {
    const view = { name: "team-a", description: "", state: "active", created_by: "dev", created_at: "2026-12-01T00:00:00Z" };
    const server = await fakeServer((req, body, res) => {
      if (req.url === "/v1/namespaces" && req.method === "POST") {
        const { description } = JSON.parse(body) as { description: string };
        return json(res, description === "" ? 200 : 201, { ...view, description });
      }
      if (req.url === "/v1/namespaces") return json(res, 200, { namespaces: [{ ...view, name: "default" }, view] });
      if (req.method === "DELETE") return json(res, 202, { ...view, state: "deleting" });
      return json(res, 200, view);
    });
    try {
      const client = new Client({ url: server.url });
      const made = await client.createNamespace("team-a", "the a team");
      assert.deepEqual([made.created, made.description], [true, "the a team"]);
      assert.equal((await client.createNamespace("team-a")).created, false, "200: it existed");
      assert.deepEqual((await client.listNamespaces()).map((n) => n.name), ["default", "team-a"]);
      assert.deepEqual(await client.getNamespace("team-a"), view);
      assert.equal((await client.deleteNamespace("team-a")).state, "deleting");
      assert.deepEqual(
        server.requests.map((r) => [r.method, r.url, r.body === "" ? undefined : JSON.parse(r.body)]),
        [
          ["POST", "/v1/namespaces", { name: "team-a", description: "the a team" }],
          ["POST", "/v1/namespaces", { name: "team-a", description: "" }],
          ["GET", "/v1/namespaces", undefined],
          ["GET", "/v1/namespaces/team-a", undefined],
          ["DELETE", "/v1/namespaces/team-a", undefined],
        ],
      );
    } finally {
      await server.close();
    }
  });

  it("names the worker's namespace in every call of the task API", async () => {
    // t-1 outlives a third of its lease (a heartbeat) and completes; t-2 fails.
    const leased = (id: string, leaseTtlMs: number) => ({
      id, run_id: "r-1", attempt: 1, node_id: `n-${id}`, node_type: "step", queue: "q", input: { id }, lease_ttl_ms: leaseTtlMs,
    });
    let polls = 0;
    const server = await fakeServer((req, _body, res) => {
      if (req.url === "/v1/tasks/poll") return json(res, 200, { tasks: ++polls === 1 ? [leased("t-1", 300), leased("t-2", 10_000)] : [] });
      if (req.url?.endsWith("/heartbeat")) return json(res, 200, { lease_ttl_ms: 300 });
      return json(res, 200, { applied: true });
    });
    try {
      const logger = memoryLogger();
      const w = new Worker({ url: server.url, queues: ["q"], namespace: "team-a", pollWaitMs: 50, eager: false, logger }).handle(
        "step",
        async (task) => {
          if (task.id === "t-2") throw new TaskError("no", { retryable: false });
          await new Promise((r) => setTimeout(r, 250));
          return { done: task.id };
        },
      );
      assert.equal(w.namespace, "team-a");
      const running = w.run();
      const reported = () => ["/v1/tasks/t-1/complete", "/v1/tasks/t-2/fail"].every((u) => server.requests.some((r) => r.url === u));
      await eventually("the reports", () => (reported() ? true : undefined), 20_000);
      await w.stop();
      await running;
      assert.equal(new Worker({ url: server.url, queues: ["q"], namespace: "" }).namespace, undefined);
    } finally {
      await server.close();
    }
    const kinds = new Set(server.requests.map((r) => r.url.split("/").at(-1)));
    assert.deepEqual([...kinds].sort(), ["complete", "fail", "heartbeat", "poll"]);
    assert.deepEqual([...new Set(server.requests.map((r) => r.headers["composer-namespace"]))], ["team-a"]);
  });
});

describe("TaskError", () => {
  it("takes a code of 1 to 64 of a-z 0-9 _ . - and an HTTP status, and refuses others where it is made", () => {
    const made = new TaskError("no", { code: "a.b-c_9", status: 599 });
    assert.deepEqual([made.code, made.status, made.retryable], ["a.b-c_9", 599, true]);
    assert.deepEqual([new TaskError("no").code, new TaskError("no").status], [undefined, undefined]);
    for (const code of ["", "Card", "a b", "x".repeat(65), "é"]) {
      assert.throws(() => new TaskError("no", { code }), RangeError, code);
    }
    for (const status of [99, 600, 402.5, Number.NaN]) {
      assert.throws(() => new TaskError("no", { status }), RangeError, String(status));
    }
    for (const retryAfterMs of [-1, 1.5, Number.NaN, Infinity, 2 ** 53]) {
      assert.throws(() => new TaskError("slow down", { status: 429, retryAfterMs }), RangeError, String(retryAfterMs));
    }
    assert.equal(new TaskError("slow down", { status: 429, retryAfterMs: 0 }).retryAfterMs, 0);
    assert.equal(new TaskError("no").retryAfterMs, undefined);
  });

  it("is sent with retry_after_ms with a 429 only", async () => {
    const leased = (n: number) => ({
      id: `t-${n}`, run_id: "r-1", attempt: 1, node_id: `n${n}`, node_type: "call", queue: "q",
      input: { status: [429, 503, 429][n] ?? 0 }, lease_ttl_ms: 10_000,
    });
    let polls = 0;
    const fails: Record<string, unknown> = {};
    const server = await fakeServer((req, body, res) => {
      if (req.url === "/v1/tasks/poll") {
        polls++;
        return json(res, 200, { tasks: polls === 1 ? [0, 1, 2].map(leased) : [] });
      }
      if (req.url?.endsWith("/fail")) fails[req.url.split("/")[3] ?? ""] = JSON.parse(body);
      return json(res, 200, { applied: true });
    });
    const w = new Worker({ url: server.url, queues: ["q"], workerId: "ts-stub", pollWaitMs: 100 }).handle<{ status: number }>(
      "call",
      (task) => {
        throw new TaskError("throttled", { status: task.input.status, retryAfterMs: task.node_id === "n2" ? undefined : 1500 });
      },
    );
    try {
      const running = w.run();
      const until = Date.now() + 20_000;
      while (Object.keys(fails).length < 3 && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
      await w.stop();
      await running;
    } finally {
      await server.close();
    }
    // Each asks for the next task too (eager dispatch, on by default).
    const lease = { worker_id: "ts-stub", run_id: "r-1", attempt: 1, error: "throttled", retryable: true, next: { queues: ["q"], max: 1 } };
    assert.deepEqual(fails, {
      "t-0": { ...lease, status: 429, retry_after_ms: 1500 },
      "t-1": { ...lease, status: 503 },
      "t-2": { ...lease, status: 429 },
    });
  });
});

describe("paging and waiting loops", () => {
  it("waitForRun long-polls with ?wait= until the run ends, and stops at its timeout or signal", async () => {
    let calls = 0;
    const server = await fakeServer((req, _body, res) => {
      calls++;
      const ended = req.url?.startsWith("/v1/runs/done") && calls >= 3;
      json(res, 200, { id: "r", status: ended ? "SUCCEEDED" : "RUNNING" });
    });
    try {
      const client = new Client({ url: server.url });
      const run = await client.waitForRun("done");
      assert.equal(run.status, "SUCCEEDED");
      assert.deepEqual(
        server.requests.map((r) => r.url),
        ["/v1/runs/done?wait=30s", "/v1/runs/done?wait=30s", "/v1/runs/done?wait=30s"],
      );
      const started = Date.now();
      const err = await client.waitForRun("never", { timeoutMs: 1200 }).catch((e: unknown) => e);
      assert.ok(err instanceof ComposerError && err.code === "wait_timeout", String(err));
      assert.ok(Date.now() - started >= 1100);
      const waits = server.requests.slice(3).map((r) => r.url);
      assert.equal(waits[0], "/v1/runs/never?wait=1s");
      assert.ok(waits.every((u) => /^\/v1\/runs\/never\?wait=(1s|\d{1,3}ms)$/.test(u)), waits.join(" "));
      assert.ok(waits.length >= 3 && waits.length <= 10, `paced, not a busy loop: ${waits.length} polls`);
      const aborted = new AbortController();
      aborted.abort(new Error("enough"));
      await assert.rejects(client.waitForRun("never", { signal: aborted.signal }), /enough/);
    } finally {
      await server.close();
    }
  });

  it("iterateEvents fetches page after page with before until next_before is null", async () => {
    const server = await fakeServer((req, _body, res) => {
      const u = new URL(req.url ?? "", "http://x");
      const seq = Number(u.searchParams.get("before") ?? 7) - 1;
      const events = [seq, seq - 1, seq - 2].filter((s) => s > 0).map((s) => ({ seq: s }));
      json(res, 200, { events, next_before: seq > 3 ? seq - 2 : null });
    });
    try {
      const seqs: number[] = [];
      for await (const e of new Client({ url: server.url }).iterateEvents({ name: "n", limit: 3 })) seqs.push(e.seq);
      assert.deepEqual(seqs, [6, 5, 4, 3, 2, 1]);
      assert.deepEqual(server.requests.map((r) => r.url), ["/v1/events?name=n&limit=3", "/v1/events?name=n&before=4&limit=3"]);
    } finally {
      await server.close();
    }
  });

  it("runEvents and iterateRuns fetch every page", async () => {
    const server = await fakeServer((req, _body, res) => {
      const u = new URL(req.url ?? "", "http://x");
      if (u.pathname === "/v1/runs/r/events") {
        const after = Number(u.searchParams.get("after") ?? 0);
        const events = after < 2000 ? [{ seq: after + 1 }, { seq: after + 1000 }] : [{ seq: after + 1 }];
        json(res, 200, { events, next_after: after < 2000 ? after + 1000 : null });
      } else {
        const cursor = u.searchParams.get("cursor");
        const page = cursor === null ? 1 : Number(cursor);
        json(res, 200, { runs: [{ id: `p${page}` }], next_cursor: page < 3 ? String(page + 1) : null });
      }
    });
    try {
      const client = new Client({ url: server.url });
      const events = await client.runEvents("r");
      assert.deepEqual(events.map((e) => e.seq), [1, 1000, 1001, 2000, 2001]);
      const ids: string[] = [];
      for await (const run of client.iterateRuns({ workflow: "w", status: "FAILED", limit: 1 })) ids.push(run.id);
      assert.deepEqual(ids, ["p1", "p2", "p3"]);
      const lists = server.requests.filter((r) => r.url.startsWith("/v1/runs?"));
      assert.deepEqual(lists.map((r) => r.url), [
        "/v1/runs?workflow=w&status=FAILED&limit=1",
        "/v1/runs?workflow=w&status=FAILED&limit=1&cursor=2",
        "/v1/runs?workflow=w&status=FAILED&limit=1&cursor=3",
      ]);
    } finally {
      await server.close();
    }
  });
});

describe("what a result sends back", () => {
  it("echoes the lease's known stages with the handler's, and none without any", () => {
    const leased = { leased_at_us: 100, read_at_us: 90.5, a_newer_stage_us: 5, published_at_us: "80" };
    assert.deepEqual(echoedStages(leased, 200, 300), { leased_at_us: 100, started_at_us: 200, finished_at_us: 300 });
    for (const none of [undefined, null, {}, [], "stages", { a_newer_stage_us: 5 }]) {
      assert.equal(echoedStages(none, 200, 300), undefined, JSON.stringify(none));
    }
  });

  it("names a priority from 1 to 5, the default 3 for anything else", () => {
    assert.deepEqual([1, 5, 0, 6, 2.5, "1", undefined].map(priorityOf), [1, 5, 3, 3, 3, 3, 3]);
  });
});

describe("eager dispatch", () => {
  const leased = (id: string, leaseTtlMs = 10_000) => ({
    id, run_id: "r-1", attempt: 1, node_id: `n-${id}`, node_type: "step", queue: "q", input: { id }, lease_ttl_ms: leaseTtlMs,
  });
  const lease = { worker_id: "ts-eager", run_id: "r-1", attempt: 1 };
  const tookNext = { queues: ["q", "q2"], max: 1 };

  /** Runs a worker of queues q and q2 against `server` until `done()`, then stops it. */
  async function serve(server: { url: string }, handler: Parameters<Worker["handle"]>[1], done: () => boolean, options: { eager?: boolean } = {}) {
    const logger = memoryLogger();
    const w = new Worker({ url: server.url, queues: ["q", "q2"], workerId: "ts-eager", concurrency: 1, pollWaitMs: 50, logger, ...options })
      .handle("step", handler);
    const running = w.run();
    await eventually("the reports", () => (done() ? true : undefined), 20_000);
    await w.stop();
    await running;
    return logger;
  }

  it("runs the task a report took on the slot it freed, with heartbeats and its own report, without a poll", async () => {
    let polls = 0;
    const server = await fakeServer((req, _body, res) => {
      if (req.url === "/v1/tasks/poll") return json(res, 200, { tasks: ++polls === 1 ? [leased("t-1")] : [] });
      if (req.url === "/v1/tasks/t-1/complete") return json(res, 200, { applied: true, next: [leased("t-2", 300)] });
      if (req.url?.endsWith("/heartbeat")) return json(res, 200, { lease_ttl_ms: 300 });
      return json(res, 200, { applied: true });
    });
    const ran: string[] = [];
    try {
      await serve(
        server,
        async (task) => {
          ran.push(task.id);
          if (task.id === "t-1") return { first: true };
          await new Promise((r) => setTimeout(r, 250)); // past a third of its lease: a heartbeat
          throw new TaskError("second fails", { retryable: false });
        },
        () => server.requests.some((r) => r.url === "/v1/tasks/t-2/fail"),
      );
    } finally {
      await server.close();
    }
    assert.deepEqual(ran, ["t-1", "t-2"]);
    const sent = server.requests.map((r) => [r.url, JSON.parse(r.body) as unknown] as const);
    const first = sent.findIndex(([u]) => u === "/v1/tasks/t-1/complete");
    const second = sent.findIndex(([u]) => u === "/v1/tasks/t-2/fail");
    assert.deepEqual(sent[first]?.[1], { ...lease, output: { first: true }, next: tookNext });
    assert.deepEqual(sent[second]?.[1], { ...lease, error: "second fails", retryable: false, next: tookNext });
    const between = sent.slice(first + 1, second).map(([u]) => u);
    assert.ok(between.length > 0 && between.every((u) => u === "/v1/tasks/t-2/heartbeat"), between.join(" "));
    assert.deepEqual(sent[first + 1]?.[1], lease);
  });

  it("sends a result again without next once, when the coordinator refuses next with 400, and never asks again", async () => {
    let polls = 0;
    const server = await fakeServer((req, body, res) => {
      if (req.url === "/v1/tasks/poll") {
        polls++;
        return json(res, 200, { tasks: polls === 1 ? [leased("t-1")] : polls === 2 ? [leased("t-2")] : [] });
      }
      if ("next" in (JSON.parse(body) as object)) {
        return json(res, 400, { error: { code: "invalid_request", message: "invalid JSON body: unknown field `next`" } });
      }
      return json(res, 200, { applied: true });
    });
    let logger;
    try {
      logger = await serve(server, (task) => task.input, () => server.requests.some((r) => r.url === "/v1/tasks/t-2/complete"));
    } finally {
      await server.close();
    }
    const reports = server.requests.filter((r) => r.url !== "/v1/tasks/poll").map((r) => [r.url, JSON.parse(r.body) as unknown]);
    assert.deepEqual(reports, [
      ["/v1/tasks/t-1/complete", { ...lease, output: { id: "t-1" }, next: tookNext }],
      ["/v1/tasks/t-1/complete", { ...lease, output: { id: "t-1" } }],
      ["/v1/tasks/t-2/complete", { ...lease, output: { id: "t-2" } }],
    ]);
    const refused = logger.lines.filter((l) => l.includes("refused next"));
    assert.equal(refused.length, 1, logger.lines.join("\n"));
    assert.match(refused[0] ?? "", /^warn: .*unknown field `next`/);
    assert.ok(!logger.lines.some((l) => l.startsWith("error: ")), logger.lines.join("\n"));
  });

  it("asks for no next task with eager: false, nor while stopping", async () => {
    for (const eager of [false, true]) {
      let polls = 0;
      const server = await fakeServer((req, _body, res) => {
        if (req.url === "/v1/tasks/poll") return json(res, 200, { tasks: ++polls === 1 ? [leased("t-1")] : [] });
        return json(res, 200, { applied: true });
      });
      let stopping: Promise<void> | undefined;
      try {
        const logger = memoryLogger();
        const w = new Worker({ url: server.url, queues: ["q"], workerId: "ts-eager", pollWaitMs: 50, logger, eager }).handle(
          "step",
          (task) => {
            // Eager on: stopped before the report, which so asks for nothing.
            if (eager) stopping = w.stop();
            return task.input;
          },
        );
        const running = w.run();
        await eventually("the report", () => (server.requests.some((r) => r.url.endsWith("/complete")) ? true : undefined), 20_000);
        await w.stop();
        await running;
        await stopping;
      } finally {
        await server.close();
      }
      const reports = server.requests.filter((r) => r.url.endsWith("/complete")).map((r) => JSON.parse(r.body) as unknown);
      assert.deepEqual(reports, [{ ...lease, output: { id: "t-1" } }], `eager: ${eager}`);
    }
  });
});
