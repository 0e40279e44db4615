import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { setTimeout as delay } from "node:timers/promises";

import type { WorkerLogger } from "../src/index.js";

/** A local HTTP server answering with `handler`, for what a live coordinator will not do. */
export async function fakeServer(
  handler: (req: IncomingMessage, body: string, res: ServerResponse) => void | Promise<void>,
): Promise<{ url: string; requests: Array<{ method: string; url: string; headers: IncomingMessage["headers"]; body: string }>; close(): Promise<void> }> {
  const requests: Array<{ method: string; url: string; headers: IncomingMessage["headers"]; body: string }> = [];
  const server = createServer((req, res) => {
    let body = "";
    req.setEncoding("utf8");
    req.on("data", (c: string) => (body += c));
    req.on("end", () => {
      requests.push({ method: req.method ?? "", url: req.url ?? "", headers: req.headers, body });
      void handler(req, body, res);
    });
  });
  await new Promise<void>((res) => server.listen(0, "127.0.0.1", res));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    close: () =>
      new Promise<void>((res) => {
        server.closeAllConnections();
        server.close(() => res());
      }),
  };
}

export function json(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  res.writeHead(status, { "content-type": "application/json", "composer-version": "0.0.0-fake", ...headers });
  res.end(JSON.stringify(body));
}

/** A logger that keeps the lines, for tests that look at them. */
export function memoryLogger(): WorkerLogger & { lines: string[] } {
  const lines: string[] = [];
  return { lines, warn: (m) => void lines.push(`warn: ${m}`), error: (m) => void lines.push(`error: ${m}`) };
}

/** Polls `check` until it answers something other than undefined, or fails after `timeoutMs`. */
export async function eventually<T>(what: string, check: () => Promise<T | undefined> | T | undefined, timeoutMs = 30_000): Promise<T> {
  const until = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await check();
      if (v !== undefined) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}${last ? `: ${String(last)}` : ""}`);
    await delay(50);
  }
}

/** A fetch that records the calls and lets a test change answers (`intercept` returns a Response or throws to stand for the network). */
export function spyFetch(intercept?: (url: string, init: RequestInit | undefined) => Response | Promise<Response> | undefined): {
  fetch: typeof fetch;
  calls: Array<{ url: string; at: number; body: unknown }>;
} {
  const calls: Array<{ url: string; at: number; body: unknown }> = [];
  const f = async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const url = String(input instanceof Request ? input.url : input);
    calls.push({ url, at: Date.now(), body: typeof init?.body === "string" ? JSON.parse(init.body) : undefined });
    const answer = intercept?.(url, init);
    if (answer !== undefined) return answer;
    return fetch(input, init);
  };
  return { fetch: f as typeof fetch, calls };
}
