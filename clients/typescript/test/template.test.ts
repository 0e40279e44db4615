/**
 * The starter project `composer init --lang typescript` copies
 * (`crates/composer/templates/typescript/`): copied to a fresh directory,
 * its `@composer/client` pointed at this package, it installs, builds and
 * passes its own tests (offline: simulate, with COMPOSER_BIN); and its
 * worker, run as a process against a real `composer dev`, runs its workflow.
 */

import assert from "node:assert/strict";
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { setTimeout as delay } from "node:timers/promises";
import { after, before, describe, it } from "node:test";

import { Client, InvalidRequestError, type WorkflowDefinition } from "../src/index.js";
import { composerBin, PACKAGE_DIR, startDev } from "./dev.js";
import { eventually } from "./helpers.js";

const TEMPLATE = resolve(PACKAGE_DIR, "..", "..", "crates", "composer", "templates", "typescript");

/** The environment without what `npm test` set for itself (`npm_config_prefix` would redirect an install). */
function cleanEnv(extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  // NODE_TEST_CONTEXT would make the project's own `node --test` report to this runner instead of printing.
  const env = Object.entries(process.env).filter(([k]) => !/^npm_/i.test(k) && k !== "NODE_TEST_CONTEXT");
  return { ...Object.fromEntries(env), ...extra };
}

function npm(args: string[], cwd: string, env: NodeJS.ProcessEnv = {}): string {
  try {
    return execFileSync("npm", args, { cwd, env: cleanEnv(env), encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  } catch (e) {
    const { stdout, stderr } = e as { stdout?: string; stderr?: string };
    throw new Error(`npm ${args.join(" ")} failed:\n${stdout ?? ""}\n${stderr ?? ""}`);
  }
}

it("has the files the starter project needs", () => {
  for (const f of ["package.json", "tsconfig.json", "src/workflow.ts", "test/workflow.test.ts", "README.md"]) {
    assert.ok(existsSync(join(TEMPLATE, f)), `${f} is in ${TEMPLATE}`);
  }
  const pkg = JSON.parse(readFileSync(join(TEMPLATE, "package.json"), "utf8")) as { dependencies: Record<string, string> };
  assert.deepEqual(Object.keys(pkg.dependencies), ["@composer/client"]);
});

describe(
  "copied, with the local package linked",
  { skip: !existsSync(composerBin()) && "no composer binary (COMPOSER_BIN)" },
  () => {
    let work: string | undefined;
    /** The copy, installed and built by its `npm test` (the first test). */
    let app = "";

    before(
      () => {
        work = mkdtempSync(join(tmpdir(), "composer-ts-template-"));
        app = join(work, "app");
        cpSync(TEMPLATE, app, { recursive: true });
        const pkgPath = join(app, "package.json");
        const pkg = JSON.parse(readFileSync(pkgPath, "utf8")) as {
          name: string;
          version: string;
          dependencies: Record<string, string>;
          devDependencies: Record<string, string>;
        };
        // What `composer init` does: {{COMPOSER_SDK}} becomes the checkout (this package's).
        assert.equal(pkg.dependencies["@composer/client"], "file:{{COMPOSER_SDK}}/clients/typescript");
        pkg.dependencies["@composer/client"] = `file:${resolve(PACKAGE_DIR, "..", "..")}/clients/typescript`;
        writeFileSync(pkgPath, JSON.stringify(pkg, null, 2));
        // The dev tools at the versions this package locks, so that the install
        // needs nothing but npm's cache (this package's `npm ci` filled it).
        const ours = JSON.parse(readFileSync(join(PACKAGE_DIR, "package-lock.json"), "utf8")) as { packages: Record<string, unknown> };
        for (const [name, version] of Object.entries(pkg.devDependencies)) {
          const locked = ours.packages[`node_modules/${name}`] as { version: string } | undefined;
          assert.equal(locked?.version, version, `the template's ${name} is the version clients/typescript locks`);
        }
        const lock = {
          name: pkg.name,
          version: pkg.version,
          lockfileVersion: 3,
          requires: true,
          packages: {
            "": { name: pkg.name, version: pkg.version, dependencies: pkg.dependencies, devDependencies: pkg.devDependencies },
            ...Object.fromEntries(Object.entries(ours.packages).filter(([k]) => k !== "")),
          },
        };
        writeFileSync(join(app, "package-lock.json"), JSON.stringify(lock, null, 2));
        npm(["install", "--offline", "--no-audit", "--no-fund"], app);
      },
      { timeout: 240_000 },
    );

    after(() => {
      if (work !== undefined) rmSync(work, { recursive: true, force: true });
    });

    it("builds and passes its tests (offline: simulate)", { timeout: 240_000 }, () => {
      const out = npm(["test"], app, { COMPOSER_BIN: composerBin() });
      assert.match(out, /# pass 4\b/);
      assert.match(out, /# fail 0\b/);
    });

    it(
      "runs live: its worker (what `npm start` runs) registers `greet` on a `composer dev` and runs its steps; starts are checked against its input_schema",
      { timeout: 240_000 },
      async () => {
        // `npm start` is `tsc && node dist/src/workflow.js`: the build, then the worker's main.
        const pkg = JSON.parse(readFileSync(join(app, "package.json"), "utf8")) as { scripts: Record<string, string> };
        assert.match(pkg.scripts["start"] ?? "", /node dist\/src\/workflow\.js$/);
        npm(["run", "build"], app);
        const main = join(app, "dist", "src", "workflow.js");
        assert.ok(existsSync(main), `${main} was built`);

        const dev = await startDev();
        let worker: ChildProcess | undefined;
        let workerExit: Promise<number | NodeJS.Signals | null> | undefined;
        let output = "";
        const killWorker = () => worker?.kill("SIGKILL");
        try {
          const client = new Client({ url: dev.url, token: dev.token });
          worker = spawn(process.execPath, [main], {
            cwd: app,
            env: cleanEnv({ COMPOSER_URL: dev.url, COMPOSER_API_TOKEN: dev.token, COMPOSER_WORKER_TOKEN: undefined }),
            stdio: ["ignore", "pipe", "pipe"],
          });
          process.once("exit", killWorker);
          const child = worker;
          workerExit = new Promise((res) => child.once("exit", (code, signal) => res(signal ?? code)));
          child.stdout?.setEncoding("utf8").on("data", (d: string) => (output += d));
          child.stderr?.setEncoding("utf8").on("data", (d: string) => (output += d));
          let exited = false;
          void workerExit.then(() => (exited = true));

          // Its main registers the definition built from src/workflow.ts, then polls.
          await eventually(
            "the worker's registration",
            () => {
              if (exited) throw new Error(`the worker exited: ${output}`);
              return /^registered greet version \d+$/m.test(output) ? true : undefined;
            },
            60_000,
          );
          // What it registered is the definition its module builds (the input_schema from `Person`).
          const built = (await import(pathToFileURL(main).href)) as { wf: { definition(): WorkflowDefinition } };
          const registered = await client.getWorkflow("greet");
          assert.deepEqual(registered.spec?.input_schema, built.wf.definition().input_schema);

          // The coordinator checks a start's input against the template's input_schema.
          const bad = await client.startRun({ workflow: "greet", input: { name: "" } }).then(
            () => assert.fail("a start with an empty name was taken"),
            (e: unknown) => e,
          );
          assert.ok(bad instanceof InvalidRequestError, String(bad));
          assert.equal(bad.status, 400);
          assert.match(bad.message, /input_schema at \/name\b/);
          const badLanguage = await client.startRun({ workflow: "greet", input: { name: "Ada", language: "de" } }).then(
            () => assert.fail("a start with a language outside the enum was taken"),
            (e: unknown) => e,
          );
          assert.ok(badLanguage instanceof InvalidRequestError, String(badLanguage));
          assert.equal(badLanguage.status, 400);
          assert.match(badLanguage.message, /input_schema at \/language\b/);

          // The steps run on the child worker; the TRANSFORM on the coordinator.
          for (const [input, said] of [
            [{ name: "Ada" }, "Hello, Ada!"],
            [{ name: "Ada", language: "fr" }, "Bonjour, Ada!"],
          ] as const) {
            const started = await client.startRun({ workflow: "greet", input });
            assert.equal(started.created, true);
            const run = await client.waitForRun(started.id, { timeoutMs: 60_000 }).catch((e: unknown) => {
              throw new Error(`${String(e)}; the worker said: ${output}`);
            });
            assert.equal(run.status, "SUCCEEDED", `${JSON.stringify(run.error)}; the worker said: ${output}`);
            assert.deepEqual(run.output, { for: "Ada", said, shouted: said.toUpperCase() });
          }

          // SIGTERM: its main (handleSignals) stops polling and exits cleanly.
          child.kill("SIGTERM");
          const how = await Promise.race([workerExit, delay(30_000).then(() => "timeout" as const)]);
          assert.equal(how, 0, `the worker's exit on SIGTERM; it said: ${output}`);
        } finally {
          process.off("exit", killWorker);
          if (worker !== undefined && worker.exitCode === null && worker.signalCode === null) {
            worker.kill("SIGKILL");
            await workerExit;
          }
          await dev.stop();
        }
      },
    );
  },
);
