/**
 * The starter project `composer init --lang typescript` copies
 * (`crates/composer/templates/typescript/`): copied to a fresh directory,
 * its `@composer/client` pointed at this package, it installs, builds and
 * passes its own tests (offline: simulate, with COMPOSER_BIN).
 */

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { it } from "node:test";

import { composerBin, PACKAGE_DIR } from "./dev.js";

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

it(
  "copied, with the local package linked, builds and passes its tests",
  { timeout: 240_000, skip: !existsSync(composerBin()) && "no composer binary (COMPOSER_BIN)" },
  () => {
    const work = mkdtempSync(join(tmpdir(), "composer-ts-template-"));
    try {
      const app = join(work, "app");
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
      const out = npm(["test"], app, { COMPOSER_BIN: composerBin() });
      assert.match(out, /# pass 4\b/);
      assert.match(out, /# fail 0\b/);
    } finally {
      rmSync(work, { recursive: true, force: true });
    }
  },
);
