/**
 * An example worker: serves the custom node type `resize-image` on the
 * queue `images`. Run it beside `composer dev` (after `npm run build`):
 *
 *     COMPOSER_URL=http://127.0.0.1:8080 node build/examples/resize_worker.js
 *
 * and start runs of a workflow with a node
 * `{"id": "thumb", "type": "resize-image", "queue": "images", "config": {"width": 128}}`
 * (examples/start_run.ts does). SIGTERM or ctrl-c stops it once its running
 * tasks have reported.
 */

import { setTimeout as sleep } from "node:timers/promises";

import { TaskError, Worker } from "@composer/client";

interface ResizeInput {
  width?: unknown;
}

const worker = new Worker({
  url: process.env["COMPOSER_URL"] ?? "http://127.0.0.1:8080",
  token: process.env["COMPOSER_WORKER_TOKEN"],
  namespace: process.env["COMPOSER_NAMESPACE"],
  queues: ["images"],
  concurrency: Number(process.env["CONCURRENCY"] ?? "4"),
});

worker.handle<ResizeInput>("resize-image", async (task) => {
  const width = task.input.width;
  if (typeof width !== "number" || !Number.isInteger(width) || width <= 0) {
    throw new TaskError(`width must be a positive integer, got ${JSON.stringify(width)}`, { retryable: false });
  }
  // Stands in for real work; long enough for the heartbeat to matter. It
  // stops early if the lease is lost (the result would be dropped anyway).
  await sleep(Number(process.env["RESIZE_MS"] ?? "100"), undefined, { signal: task.signal });
  return { width, resized_by: process.pid };
});

await worker.run({ handleSignals: true });
