/**
 * An example client: registers a workflow with one `resize-image` step,
 * starts a run and waits for it (run examples/resize_worker.ts beside it):
 *
 *     COMPOSER_URL=http://127.0.0.1:8080 node build/examples/start_run.js 640
 */

import { Client, ComposerError } from "@composer/client";

const client = new Client({
  url: process.env["COMPOSER_URL"] ?? "http://127.0.0.1:8080",
  token: process.env["COMPOSER_API_TOKEN"],
  namespace: process.env["COMPOSER_NAMESPACE"],
});

try {
  const wf = await client.registerWorkflow({
    name: "thumbnail",
    nodes: [
      {
        id: "thumb",
        type: "resize-image",
        queue: "images",
        config: { width: "${ .input.width }" },
        retry: { max_attempts: 3, initial_backoff: "1s" },
      },
    ],
    output: { thumbnail: "${ .nodes.thumb.output }" },
  });
  console.log(`workflow ${wf.name} v${wf.version}${wf.created ? " (new)" : ""}`);

  const run = await client.startRun({ workflow: "thumbnail", input: { width: Number(process.argv[2] ?? "128") } });
  console.log(`run ${run.id} ${run.status}`);
  const done = await client.waitForRun(run.id, { timeoutMs: 60_000 });
  console.log(`run ${done.id} ${done.status}`, done.status === "SUCCEEDED" ? JSON.stringify(done.output) : done.error);
  process.exitCode = done.status === "SUCCEEDED" ? 0 : 1;
} catch (e) {
  if (!(e instanceof ComposerError)) throw e;
  console.error(`${e.name} (${e.status} ${e.code}): ${e.message}`);
  process.exitCode = 2;
}
