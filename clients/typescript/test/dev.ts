/** A throwaway `composer dev` (its embedded PostgreSQL and Redis) for the tests. */

import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmodSync, existsSync, mkdtempSync, openSync, closeSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, isAbsolute, join, resolve } from "node:path";
import { setTimeout as delay } from "node:timers/promises";
import { fileURLToPath } from "node:url";

/** The package's directory (this file is build/test/dev.js). */
export const PACKAGE_DIR = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");

/** COMPOSER_BIN (relative to where npm was started), else ../../target/debug/composer from the package. */
export function composerBin(): string {
  const env = process.env["COMPOSER_BIN"];
  if (env === undefined || env === "") return resolve(PACKAGE_DIR, "..", "..", "target", "debug", "composer");
  return isAbsolute(env) ? env : resolve(process.env["INIT_CWD"] ?? process.cwd(), env);
}

export interface Dev {
  url: string;
  /** The API token the server was started with (workers take it too). */
  token: string;
  /** The lease a worker gets, in ms. */
  leaseTtlMs: number;
  stop(): Promise<void>;
}

/** Starts `composer dev` on a free port in a fresh temporary directory, with a 2 s task lease. */
export async function startDev(): Promise<Dev> {
  const bin = composerBin();
  if (!existsSync(bin)) {
    throw new Error(`no composer binary at ${bin}: build it (cargo build) or set COMPOSER_BIN`);
  }
  const work = mkdtempSync(join(tmpdir(), "composer-ts-"));
  chmodSync(work, 0o755); // as root, the embedded PostgreSQL runs as postgres
  const addrFile = join(work, "addr");
  const token = randomBytes(16).toString("hex");
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    COMPOSER_LISTEN: "127.0.0.1:0",
    COMPOSER_ADDR_FILE: addrFile,
    COMPOSER_LOG: "error",
    COMPOSER_LEASE_TTL: "2s",
    COMPOSER_API_TOKEN: token,
  };
  delete env["COMPOSER_WORKER_TOKEN"];
  delete env["COMPOSER_DATABASE_URL"];
  delete env["COMPOSER_REDIS_URL"];
  delete env["COMPOSER_DATA_DIR"];
  const logPath = join(work, "dev.log");
  const log = openSync(logPath, "w");
  let child: ChildProcess;
  try {
    child = spawn(bin, ["dev"], { cwd: work, env, stdio: ["ignore", "ignore", log] });
  } finally {
    closeSync(log);
  }
  let exited = false;
  const exit = new Promise<void>((res) => child.once("exit", () => ((exited = true), res())));
  // A test process that dies anyway still stops the server (and so its PostgreSQL and Redis).
  const onExit = () => child.kill("SIGTERM");
  process.once("exit", onExit);

  const stop = async () => {
    process.off("exit", onExit);
    if (!exited) {
      child.kill("SIGTERM");
      const stopped = await Promise.race([exit.then(() => true), delay(30_000).then(() => false)]);
      if (!stopped) {
        child.kill("SIGKILL");
        await exit;
      }
    }
    rmSync(work, { recursive: true, force: true });
  };

  const until = Date.now() + 90_000;
  while (Date.now() < until) {
    if (existsSync(addrFile)) {
      const url = readFileSync(addrFile, "utf8").trim();
      if (url !== "") return { url, token, leaseTtlMs: 2_000, stop };
    }
    if (exited) break;
    await delay(100);
  }
  const text = existsSync(logPath) ? readFileSync(logPath, "utf8") : "";
  await stop();
  throw new Error(`composer dev did not start: ${text}`);
}
