/** `npm pack` makes a tarball that installs into a fresh directory, imports, and type-checks. */

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { it } from "node:test";

import { PACKAGE_DIR } from "./dev.js";

/** The environment without what `npm test` set for itself (`npm_config_prefix` would redirect an install). */
function cleanEnv(): NodeJS.ProcessEnv {
  return Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^npm_/i.test(k)));
}

function npm(args: string[], cwd: string): string {
  return execFileSync("npm", args, { cwd, env: cleanEnv(), encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
}

it("packs a tarball that installs into a fresh directory, imports and type-checks", { timeout: 180_000 }, () => {
  const work = mkdtempSync(join(tmpdir(), "composer-ts-pack-"));
  try {
    // dist/ is built by `npm test` before this runs; no scripts here.
    const [packed] = JSON.parse(npm(["pack", "--json", "--ignore-scripts", "--pack-destination", work], PACKAGE_DIR)) as Array<{
      filename: string;
      files: Array<{ path: string }>;
    }>;
    assert.ok(packed);
    const files = packed.files.map((f) => f.path).sort();
    for (const f of ["package.json", "README.md", "dist/index.js", "dist/index.d.ts", "dist/worker.js", "dist/client.d.ts"]) {
      assert.ok(files.includes(f), `${f} is in the tarball: ${files.join(" ")}`);
    }
    const stray = files.filter((f) => !/^(dist|src)\//.test(f) && f !== "package.json" && f !== "README.md");
    assert.deepEqual(stray, [], "nothing but the build, its sources and the README");
    assert.ok(!files.some((f) => /test|examples|node_modules/.test(f)));

    const app = join(work, "app");
    mkdirSync(app);
    writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", version: "1.0.0", private: true, type: "module" }));
    npm(["install", "--offline", "--no-audit", "--no-fund", "--ignore-scripts", join(work, packed.filename)], app);
    const lock = JSON.parse(readFileSync(join(app, "package-lock.json"), "utf8")) as { packages: Record<string, unknown> };
    assert.deepEqual(Object.keys(lock.packages).sort(), ["", "node_modules/@composer/client"], "no runtime dependencies");

    const script = `
      import * as m from "@composer/client";
      const names = ["Client", "Worker", "ComposerError", "NotFoundError", "ConflictError", "InvalidRequestError",
        "UnauthorizedError", "UnavailableError", "WaitTimeoutError", "TaskError", "LeaseLostError", "isTerminal"];
      for (const n of names) if (typeof m[n] !== "function") throw new Error(n + " is not exported");
      const c = new m.Client({ url: "http://127.0.0.1:8080" });
      if (c.url !== "http://127.0.0.1:8080") throw new Error("url");
      const w = new m.Worker({ url: "http://127.0.0.1:8080", queues: ["q"] }).handle("t", () => 1);
      if (!(new m.NotFoundError("x", { status: 404, code: "not_found" }) instanceof m.ComposerError)) throw new Error("classes");
      if (!m.isTerminal("SUCCEEDED") || m.isTerminal("RUNNING")) throw new Error("isTerminal");
      console.log("imported", w.queues.join());
    `;
    assert.equal(execFileSync(process.execPath, ["--input-type=module", "-e", script], { cwd: app, encoding: "utf8" }).trim(), "imported q");

    // The declarations, as a strict TypeScript project that installed the tarball sees them.
    writeFileSync(
      join(app, "check.ts"),
      `import { Client, Worker, TaskError, type Run, type WorkerTask, type RunList, type JsonValue } from "@composer/client";
       const client = new Client({ url: "http://127.0.0.1:8080", token: "t", timeoutMs: 1000 });
       async function f(): Promise<RunList> {
         const run: Run = await client.getRun("id");
         const s: "QUEUED" | "RUNNING" | "PAUSED" | "SUCCEEDED" | "FAILED" | "CANCELLED" = run.status;
         void s;
         return client.listRuns({ workflow: "w", status: "FAILED", limit: 10 });
       }
       new Worker({ url: "http://x", queues: ["q"] }).handle<{ width: number }>("t", async (task: WorkerTask<{ width: number }>) => {
         if (task.signal.aborted) throw new TaskError("no", { retryable: false });
         const out: JsonValue = { width: task.input.width };
         return out;
       });
       // @ts-expect-error: a status that does not exist
       void client.listRuns({ status: "DONE" });
       void f;
      `,
    );
    const tsc = join(PACKAGE_DIR, "node_modules", "typescript", "bin", "tsc");
    try {
      execFileSync(
        process.execPath,
        [tsc, "--noEmit", "--strict", "--module", "nodenext", "--moduleResolution", "nodenext", "--target", "es2022",
          "--types", "node", "--typeRoots", join(PACKAGE_DIR, "node_modules", "@types"), "check.ts"],
        { cwd: app, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] },
      );
    } catch (e) {
      assert.fail(`the declarations do not type-check: ${String((e as { stdout?: string }).stdout)}`);
    }
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
});
