// Starts the real shim binary for the client tests: shim init as PID 1 of
// fresh pid and mount namespaces (unshare), its own runtime dir, cgroup
// subtree and layers dir, and a tiny git worktree registered at setup.
// $SHIM_BIN names the binary; without it scripts/build builds one.
// (Outside test/: node --test runs every file under test/.)

import { execFileSync, spawn } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";

import { Client } from "../src/index.js";

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/** The cgroup2 mount (/sys/fs/cgroup pure, /sys/fs/cgroup/unified hybrid), or "". */
export function cgroup2Mount() {
  const types = new Map();
  for (const line of fs.readFileSync("/proc/self/mounts", "utf8").split("\n")) {
    const f = line.split(" ");
    if (f.length >= 3) types.set(f[1], f[2]);
  }
  for (const m of ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]) if (types.get(m) === "cgroup2") return m;
  return "";
}

function which(tool) {
  return PATH.split(":").some((d) => fs.existsSync(path.join(d, tool)));
}

/**
 * Why the integration tests cannot run here ("" when they can). The caller
 * skips with it, or fails when SHIM_REQUIRE_INTEGRATION=1.
 */
export function cannotRun() {
  if (process.geteuid() !== 0) return "needs root";
  if (cgroup2Mount() === "") return "no cgroup2 mount at /sys/fs/cgroup or /sys/fs/cgroup/unified";
  for (const t of ["unshare", "git"]) if (!which(t)) return `needs ${t}`;
  return "";
}

export const strict = process.env.SHIM_REQUIRE_INTEGRATION === "1";

function git(cwd, ...args) {
  execFileSync("git", args, {
    cwd,
    stdio: ["ignore", "pipe", "pipe"],
    env: { PATH, HOME: cwd, GIT_CONFIG_NOSYSTEM: "1", GIT_AUTHOR_NAME: "t", GIT_AUTHOR_EMAIL: "t@example.com",
      GIT_COMMITTER_NAME: "t", GIT_COMMITTER_EMAIL: "t@example.com" },
  });
}

/** Kills and removes root and every cgroup below it, deepest first (only the root startShim named). */
async function removeCgroupTree(root) {
  const dirs = [];
  const walk = (d) => {
    dirs.push(d);
    let ents = [];
    try {
      ents = fs.readdirSync(d, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of ents) if (e.isDirectory()) walk(path.join(d, e.name));
  };
  if (!fs.existsSync(root)) return;
  walk(root);
  for (const d of dirs.reverse()) {
    try {
      fs.writeFileSync(path.join(d, "cgroup.kill"), "1");
    } catch {}
    const deadline = Date.now() + 5000;
    for (;;) {
      try {
        fs.rmdirSync(d);
        break;
      } catch (e) {
        if (e.code === "ENOENT" || Date.now() > deadline) break;
        await sleep(10); // the kernel empties the cgroup
      }
    }
  }
}

export async function startShim() {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "shim-client-ts-"));
  const cgroot = path.join(cgroup2Mount(), "shim-client-ts-" + crypto.randomBytes(4).toString("hex"));
  const s = { tmp, cgroot, proc: undefined };
  s.stop = async () => {
    const p = s.proc;
    if (p && p.exitCode === null && p.signalCode === null) {
      const exited = new Promise((r) => p.once("exit", r));
      // SIGTERM to shim, the child of the unshare started here (unshare
      // does not forward it); SIGKILL to unshare (--kill-child takes shim
      // with it) if shim does not exit.
      let kids = [];
      try {
        kids = fs.readFileSync(`/proc/${p.pid}/task/${p.pid}/children`, "utf8").trim().split(/\s+/).filter(Boolean);
      } catch {}
      for (const k of kids) process.kill(Number(k), "SIGTERM");
      const t = setTimeout(() => p.kill("SIGKILL"), 30000);
      await exited;
      clearTimeout(t);
    }
    await removeCgroupTree(cgroot);
    fs.rmSync(tmp, { recursive: true, force: true });
  };
  try {
    let bin = process.env.SHIM_BIN;
    if (!bin) {
      bin = path.join(tmp, "shim");
      execFileSync(path.join(REPO, "scripts", "build"), [bin], { stdio: "inherit" });
    }
    s.runtimeDir = path.join(tmp, "run");
    s.worktree = path.join(tmp, "wt");
    fs.mkdirSync(s.runtimeDir);
    fs.mkdirSync(s.worktree);
    git(s.worktree, "init", "-q", "-b", "main");
    fs.writeFileSync(path.join(s.worktree, "README.md"), "baseline\n");
    git(s.worktree, "add", "README.md");
    git(s.worktree, "commit", "-q", "-m", "baseline");
    const log = fs.openSync(path.join(tmp, "shim.log"), "w");
    s.proc = spawn("unshare", ["--pid", "--fork", "--kill-child", "--mount", "--propagation", "private",
      bin, "init", "--runtime-dir", s.runtimeDir, "--cgroup-root", cgroot, "--layers", path.join(tmp, "layers"),
      "--mount-proc", "--isolation", "scan", "--log-level", "warn", "--grace", "2s"],
    { stdio: ["ignore", log, log], env: { PATH } });
    fs.closeSync(log);
    s.client = new Client({ runtimeDir: s.runtimeDir });
    const probe = new Client({ runtimeDir: s.runtimeDir, timeoutMs: 1000 });
    const deadline = Date.now() + 15000;
    for (;;) {
      try {
        await probe.health();
        break;
      } catch (e) {
        if (s.proc.exitCode !== null || s.proc.signalCode !== null || Date.now() > deadline) {
          throw new Error(`shim not ready (${e.message}); log:\n${fs.readFileSync(path.join(tmp, "shim.log"), "utf8")}`);
        }
        await sleep(20); // polling for a socket that is not there yet
      }
    }
    await s.client.register({ worktree: s.worktree });
    s.nextGen = async () => (await s.client.status()).generation + 1;
    return s;
  } catch (e) {
    await s.stop();
    throw e;
  }
}
