// The TypeScript (JavaScript) client against the real shim binary.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import * as shimClient from "../src/index.js";
import { Client, Code, EventType, FrameType, GenState, Network, ShimError, State, codeOf } from "../src/index.js";
import { REPO, cannotRun, startShim, strict } from "../testutil/shim.js";

const SH = "/bin/sh";
const ENV = ["PATH=/usr/bin:/bin"];

async function rejects(code, p) {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof ShimError, `not a ShimError: ${e}`);
    assert.equal(e.code, code, e.message);
    assert.equal(codeOf(e), code);
    return e;
  }
  assert.fail(`no ${code}`);
}

function throwsCode(code, fn) {
  try {
    fn();
  } catch (e) {
    assert.equal(codeOf(e), code, String(e));
    return;
  }
  assert.fail(`no ${code}`);
}

async function waitForFile(file, text, ms = 30000) {
  const deadline = Date.now() + ms;
  while (!fs.readFileSync(file, "utf8").includes(text)) {
    assert.ok(Date.now() < deadline, `${file} never held ${text}`);
    await sleep(20); // polling for the harness's edit
  }
}

// Polls generation g's record until ok(record) holds; resolves with it.
async function waitForRecord(c, g, ok, what, ms = 60000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const rec = await c.generation(g);
    if (ok(rec)) return rec;
    assert.ok(Date.now() < deadline, `generation ${g} never ${what}: ${JSON.stringify(rec)}`);
    await sleep(20); // polling the record
  }
}

test("every code of api/api.go is in Code", () => {
  const src = fs.readFileSync(path.join(REPO, "api", "api.go"), "utf8");
  const go = [...src.matchAll(/\b(Code\w+)\s*=\s*"([A-Z_]+)"/g)];
  assert.ok(go.length >= 20);
  for (const [, name, value] of go) assert.equal(Code[value], value, `${name} = ${value} missing from Code`);
});

test("every state, event type and network of api/types.go and events.go is here", () => {
  const src = ["types.go", "events.go"].map((f) => fs.readFileSync(path.join(REPO, "api", f), "utf8")).join("\n");
  const go = [...src.matchAll(/^\s*(State|Gen|Event|Network)(\w+)\s*=\s*"([a-z_]+)"/gm)];
  assert.ok(go.length >= 20);
  const consts = { State, Gen: GenState, Event: EventType, Network };
  for (const [, prefix, name, value] of go) {
    const key = name.replace(/(?<!^)(?=[A-Z])/g, "_").toUpperCase();
    assert.equal(consts[prefix][key], value, `${prefix}${name} = ${value} missing`);
  }
});

test("index.d.ts declares exactly what index.js exports", () => {
  const dts = fs.readFileSync(new URL("../src/index.d.ts", import.meta.url), "utf8");
  const declared = new Set([...dts.matchAll(/^export declare (?:const|class|function) (\w+)/gm)].map((m) => m[1]));
  assert.deepEqual([...declared].sort(), Object.keys(shimClient).sort());
  for (const k of Object.keys(Code)) assert.match(dts, new RegExp(`\\b${k}: "${k}";`), `${k} not typed`);
  for (const c of [State, GenState, EventType, FrameType, Network]) {
    for (const [k, v] of Object.entries(c)) assert.ok(new RegExp(`\\b${k}: "${v}"[;\\s}]`).test(dts), `${k} not typed`);
  }
  const methods = Object.getOwnPropertyNames(Client.prototype).filter((m) => m !== "constructor" && !m.startsWith("_"));
  for (const m of methods) assert.ok(new RegExp(`^  ${m}\\(`, "m").test(dts), `Client.${m} not typed`);
});

test("UNREACHABLE when no shim listens", async () => {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), "shim-client-ts-none-"));
  try {
    const c = new Client({ runtimeDir: d });
    await rejects(Code.UNREACHABLE, c.health());
    await rejects(Code.UNREACHABLE, c.start({ generation: 1, command: ["true"] }));
    await rejects(Code.UNREACHABLE, c.events());
  } finally {
    fs.rmSync(d, { recursive: true, force: true });
  }
});

test("keepLease tries UNREACHABLE again at the next tick, resolves at the abort", async () => {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), "shim-client-ts-none-"));
  try {
    const c = new Client({ runtimeDir: d });
    const calls = [];
    const renew = c.renew.bind(c);
    c.renew = (...args) => {
      calls.push(args);
      return renew(...args);
    };
    const ac = new AbortController();
    let done = false;
    const kept = c.keepLease(1, 150, { signal: ac.signal }).finally(() => {
      done = true;
    });
    const deadline = Date.now() + 60000;
    while (calls.length < 3 && !done) {
      assert.ok(Date.now() < deadline, `${calls.length} renewals`);
      await sleep(20); // polling the renewals counted
    }
    ac.abort();
    assert.equal(await kept, undefined);
    assert.deepEqual(calls[0].slice(0, 2), [1, { lease_ms: 150 }]);
    await rejects(Code.BAD_REQUEST, c.keepLease(1, 0));
    await rejects(Code.BAD_REQUEST, c.keepLease(-1, 150));
  } finally {
    fs.rmSync(d, { recursive: true, force: true });
  }
});

const why = cannotRun();
if (why && strict) {
  test("integration", () => assert.fail(`cannot run (${why}) but SHIM_REQUIRE_INTEGRATION=1`));
}

describe("against the real shim", { skip: why || false, timeout: 300000 }, () => {
  let shim;
  let c;
  const harness = (g, script, extra = {}) =>
    c.start({ generation: g, command: [SH, "-c", script], cwd: shim.worktree, env: ENV, worktree: shim.worktree, ...extra });

  before(async () => {
    shim = await startShim();
    c = shim.client;
  });
  after(async () => {
    await shim?.stop();
  });

  test("health and status", async () => {
    assert.deepEqual(await c.health(), { ok: true });
    const st = await c.status();
    assert.equal(st.mode, "cgroup2");
    assert.equal(st.runtime_dir, shim.runtimeDir);
    assert.deepEqual((st.worktrees ?? []).map((w) => w.worktree), [shim.worktree]);
  });

  test("announce, replay, conflict, labels, fence, snapshot, events, signal, wait", async () => {
    const g = await shim.nextGen();
    const labels = { task: `ts-${g}` };
    const readme = path.join(shim.worktree, "README.md");
    const edit = "echo edited >> README.md; exec sleep 600";
    const events = await c.events();
    try {
      const first = await harness(g, edit, { labels });
      assert.equal(first.generation, g);
      assert.ok(first.pid > 0);
      assert.ok(!first.replayed);
      await waitForFile(readme, "edited");

      // An identical retry is answered with the first outcome, marked.
      const again = await harness(g, edit, { labels });
      assert.equal(again.replayed, true);
      assert.equal(again.pid, first.pid);
      // The same generation with another spec is a conflict.
      await rejects(Code.GENERATION_CONFLICT, harness(g, "exec sleep 601", { labels }));
      // Registering while a generation runs is refused.
      await rejects(Code.GENERATION_LIVE, c.register({ worktree: shim.worktree }));

      const rec = await c.generation(g);
      assert.equal(rec.state, "running");
      assert.deepEqual(rec.labels, labels);
      assert.deepEqual((await c.generations(labels)).map((r) => r.generation), [g]);
      assert.deepEqual(await c.generations({ task: "no-such-task" }), []);
      assert.ok((await c.generations()).some((r) => r.generation === g));

      // A wait's timeout or abort is WAIT_TIMEOUT (as shim ctl wait
      // --timeout): it still runs, and a wait has no outcome to be unknown.
      const e = await rejects(Code.WAIT_TIMEOUT, c.wait(g, { timeoutMs: 200 }));
      assert.equal(e.status, undefined);
      const ac = new AbortController();
      const waiting = c.wait(g, { signal: ac.signal });
      ac.abort();
      await rejects(Code.WAIT_TIMEOUT, waiting);
      assert.equal((await c.generation(g)).state, "running");

      // A precondition that does not hold fences nothing.
      await rejects(Code.NOT_CURRENT, harness(g + 1, "exec sleep 600", { if_current: g + 5 }));
      assert.equal((await c.generation(g)).state, "running");

      const res = await harness(g + 1, "exec sleep 600", { if_current: g });
      assert.equal(res.generation, g + 1);
      assert.equal(res.fenced.length, 1);
      const [rep] = res.fenced;
      assert.equal(rep.generation, g);
      assert.equal(rep.survivors, 0);
      assert.ok(rep.killed >= 1);
      assert.equal(rep.snapshot_ref, `refs/shim/abandoned/${g}`);
      assert.equal(fs.readFileSync(readme, "utf8"), "baseline\n");

      await rejects(Code.STALE_GENERATION, harness(g, "exec sleep 600"));

      const seen = [];
      for await (const ev of events) {
        seen.push(`${ev.type}:${ev.generation}`);
        if (ev.type === EventType.STARTED && ev.generation === g + 1) break;
      }
      assert.ok(seen.includes(`${EventType.STARTED}:${g}`), seen.join(" "));
      assert.ok(seen.includes(`${EventType.FENCED}:${g}`), seen.join(" "));
    } finally {
      events.close();
    }

    const snaps = await c.snapshots(shim.worktree);
    assert.ok(snaps.snapshots.some((s) => s.generation === g));
    const snap = await c.snapshot(g, shim.worktree);
    assert.equal(snap.ref, `refs/shim/abandoned/${g}`);
    assert.equal(snap.modified, 1);
    const listed = snaps.snapshots.find((s) => s.generation === g);
    assert.deepEqual([listed.modified, listed.added, listed.deleted], [snap.modified, snap.added, snap.deleted]);
    await rejects(Code.NOT_FOUND, c.snapshot(g + 1, shim.worktree));

    await c.signal(g + 1, "TERM");
    const ex = await c.wait(g + 1, { timeoutMs: 60000 });
    assert.equal(ex.generation, g + 1);
    assert.equal(ex.exit_code, 128 + 15);
    assert.ok(!ex.fenced);
    await rejects(Code.NOT_RUNNING, c.signal(g + 1, "TERM"));
  });

  test("fence and end, with if_current", async () => {
    const g = await shim.nextGen();
    await harness(g, "exec sleep 600");
    await rejects(Code.NOT_CURRENT, c.fence({ generation: g + 1, if_current: g + 3 }));
    let res = await c.fence({ generation: g + 1, worktree: shim.worktree, if_current: g });
    assert.equal(res.generation, g + 1);
    assert.deepEqual(res.fenced.map((r) => r.generation), [g]);
    assert.equal(res.fenced[0].survivors, 0);
    assert.equal((await c.generation(g)).state, "fenced");

    const h = g + 2;
    await harness(h, "exec sleep 600");
    await rejects(Code.NOT_CURRENT, c.end(h, { if_current: h - 1 }));
    res = await c.end(h, { if_current: h });
    assert.deepEqual(res.fenced.map((r) => r.generation), [h]);
    assert.equal((await c.generation(h)).state, "fenced");
    await rejects(Code.STALE_GENERATION, harness(h - 1, "exec sleep 600"));

    // A generation never announced is not ended unless the caller means it.
    const k = h + 1;
    await harness(k, "exec sleep 600");
    const e = await rejects(Code.NOT_ANNOUNCED, c.end(k + 1000));
    assert.equal(e.status, 409);
    assert.equal((await c.status()).generation, k);
    assert.equal((await c.generation(k)).state, "running");
    res = await c.end(k + 1, { force: true });
    assert.deepEqual(res.fenced.map((r) => r.generation), [k]);
    assert.equal((await c.status()).generation, k + 1);
  });

  test("bad requests", async () => {
    const g = await shim.nextGen();
    await rejects(Code.BAD_REQUEST, c.start({ generation: g, command: [""] }));
    await rejects(Code.BAD_REQUEST, c.start({ generation: g, command: ["/bin/true"], no_such_field: 1 }));
    await rejects(Code.BAD_REQUEST, c.signal(1, "NOSUCHSIGNAL"));
    throwsCode(Code.BAD_REQUEST, () => c.generation(-1)); // refused by the client, never sent
    throwsCode(Code.BAD_REQUEST, () => c.generation(2 ** 53)); // above 2^53-1: not held exactly
    // ... and by shim, whatever the client.
    await rejects(Code.BAD_REQUEST, c._call("POST", "/v1/generations", { generation: 2 ** 53, command: ["/bin/true"] }));
    const m = await rejects(Code.METHOD_NOT_ALLOWED, c._call("GET", "/v1/fence"));
    assert.equal(m.status, 405);
    const e = await rejects(Code.NOT_FOUND, c.generation(1e9));
    assert.equal(e.status, 404);
    // Nothing above consumed a generation.
    assert.equal(await shim.nextGen(), g);
  });
  test("lease: suspended when not renewed, resumed by a renewal, stale once superseded", async () => {
    const g = await shim.nextGen();
    const events = await c.events();
    let res;
    try {
      res = await harness(g, "exec sleep 1000", { lease_ms: 50 });
      assert.equal(res.generation, g);
      // Nobody renews: the lease runs out, the generation is suspended
      // (frozen and cut), not killed.
      const rec = await waitForRecord(c, g, (r) => r.state === State.SUSPENDED && r.lease?.suspended === true,
        "suspended");
      assert.equal(rec.lease.duration_ms, 50);
      assert.ok(rec.lease.suspensions >= 1);
      assert.ok(!rec.lease.killed);
      assert.ok(rec.lease.suspended_at && rec.lease.expires_at);
      assert.equal((await c.status()).state, State.SUSPENDED);

      // A renewal resumes it.
      let r = await c.renew(g);
      assert.equal(r.generation, g);
      assert.equal(r.resumed, true);
      assert.equal(r.state, State.RUNNING);
      assert.equal(r.lease.duration_ms, 50);
      assert.ok(!r.lease.suspended);
      assert.ok(r.lease.renewals >= 1);
      // A longer lease from now (it may have run out again meanwhile).
      r = await c.renew(g, { lease_ms: 600000 });
      assert.equal(r.state, State.RUNNING);
      assert.equal(r.lease.duration_ms, 600000);
      assert.equal((await c.generation(g)).state, State.RUNNING);
      // An identical retry of the start renews the lease.
      const again = await harness(g, "exec sleep 1000", { lease_ms: 600000 });
      assert.equal(again.replayed, true);
      assert.equal(again.pid, res.pid);
      assert.ok((await c.generation(g)).lease.renewals >= r.lease.renewals + 1);

      const seen = [];
      for await (const ev of events) {
        seen.push(`${ev.type}:${ev.generation}`);
        if (ev.type === EventType.RESUMED && ev.generation === g) break;
      }
      assert.ok(seen.includes(`${EventType.LEASE_EXPIRED}:${g}`), seen.join(" "));
    } finally {
      events.close();
    }

    // A newer generation fences it; its supervisor is superseded.
    await harness(g + 1, "exec sleep 1000");
    assert.equal((await c.generation(g)).state, GenState.FENCED);
    await rejects(Code.STALE_GENERATION, c.renew(g));
    await rejects(Code.STALE_GENERATION, c.keepLease(g, 150));
    // g + 1 was announced without a lease: a renewal must give one.
    await rejects(Code.BAD_REQUEST, c.renew(g + 1));
    await rejects(Code.BAD_REQUEST, c.renew(g + 1, { lease_ms: 10 }));
    await rejects(Code.BAD_REQUEST, c.renew(g + 1, { lease_ms: 8 * 24 * 3600 * 1000 }));
    await rejects(Code.NOT_FOUND, c.renew(g + 1000));
    await rejects(Code.BAD_REQUEST, harness(g + 2, "exec sleep 1000", { lease_ms: 10 }));
    await c.end(g + 1);
    await rejects(Code.NOT_RUNNING, c.renew(g + 1, { lease_ms: 1000 }));
  });

  test("keepLease renews until aborted, rejects once superseded", async () => {
    const g = await shim.nextGen();
    await harness(g, "exec sleep 1000", { lease_ms: 600 });
    const ac = new AbortController();
    const kept = c.keepLease(g, 600, { signal: ac.signal });
    await waitForRecord(c, g, (r) => (r.lease.renewals ?? 0) >= 3, "renewed 3 times");
    ac.abort();
    assert.equal(await kept, undefined);

    // Superseded: it rejects with STALE_GENERATION (NOT_RUNNING when its
    // renewal was already past the staleness check as the fence began).
    const superseded = c.keepLease(g, 600).then(() => assert.fail("keepLease resolved"), (e) => e);
    await harness(g + 1, "exec sleep 1000");
    const e = await superseded;
    assert.ok(e instanceof ShimError, String(e));
    assert.ok([Code.STALE_GENERATION, Code.NOT_RUNNING].includes(e.code), e.message);
    await c.end(g + 1);
  });

  test("logs: follow to the exit, again from an offset; events since a seq", async () => {
    const g = await shim.nextGen();
    await harness(g, "echo one; echo err >&2; echo two; exit 3");
    const stream = await c.logs(g, { follow: true });
    const { stdout, stderr } = await stream.readAll();
    assert.equal(stdout.toString(), "one\ntwo\n");
    assert.equal(stderr.toString(), "err\n");
    assert.equal(stream.last.type, FrameType.EXIT);
    assert.equal(stream.last.exit.exit_code, 3);
    assert.deepEqual([stream.stdoutOffset, stream.stderrOffset], [8, 4]);

    const again = await c.logs(g, { stdoutOffset: 4, stderrOffset: 4 });
    const frames = [];
    for await (const f of again) frames.push(f);
    assert.deepEqual(frames.map((f) => f.type), [FrameType.STDOUT, FrameType.END]);
    assert.equal(frames[0].offset, 4);
    assert.equal(frames[0].data.toString(), "two\n");
    await rejects(Code.NOT_FOUND, c.logs(g + 100));

    const seen = [];
    const events = await c.events({ since: 0 });
    try {
      for await (const ev of events) {
        assert.notEqual(ev.type, EventType.GAP); // the shim of these tests keeps 4096
        seen.push(ev);
        if (ev.type === EventType.EXITED && ev.generation === g) break;
      }
    } finally {
      events.close();
    }
    assert.deepEqual(seen.map((ev) => ev.seq), seen.map((_, i) => i + 1));
    const last = seen[seen.length - 1].seq;
    const tail = await c.eventsSince(last - 1, { instance: seen[seen.length - 2].instance });
    try {
      for await (const ev of tail) {
        assert.deepEqual(ev, seen[seen.length - 1]);
        break;
      }
    } finally {
      tail.close();
    }
    await rejects(Code.BAD_REQUEST, c.events({ since: last + 1000000 }));
    await rejects(Code.BAD_REQUEST, c.events({ since: last, instance: "another-shim" }));
  });
  test("exec: streamed, stdin, detach and attach, timeout, signal, fenced with its generation", async () => {
    const g = await shim.nextGen();
    const idle = await c.start({ generation: g, command: [], idle: true, cwd: shim.worktree, env: ENV, worktree: shim.worktree });
    assert.equal(idle.generation, g);

    const s = await c.exec(g, { command: [SH, "-c", "echo out; echo err >&2; exit 7"] });
    const r = await s.wait();
    assert.equal(r.stdout.toString(), "out\n");
    assert.equal(r.stderr.toString(), "err\n");
    assert.equal(r.process.exit_code, 7);
    assert.equal(r.process.id, s.id);
    assert.ok(s.pid > 0);

    const cat = await c.exec(g, { command: ["cat"], stdin_data: "hello" });
    assert.equal((await cat.wait()).stdout.toString(), "hello");
    const open = await c.execDetached(g, { command: ["cat"], stdin: true });
    assert.equal(open.state, "running");
    assert.equal((await c.writeStdin(g, open.id, "abc")).written, 3);
    await c.writeStdin(g, open.id, null, { close: true });
    const back = await (await c.attach(g, open.id)).wait();
    assert.equal(back.stdout.toString(), "abc");
    assert.equal(back.process.exit_code, 0);
    const tail = await (await c.attach(g, open.id, { stdoutOffset: 1 })).wait();
    assert.equal(tail.stdout.toString(), "bc");
    assert.ok((await c.processes(g)).some((p) => p.id === open.id));
    assert.equal((await c.process(g, open.id)).exit_code, 0);
    await rejects(Code.NOT_FOUND, c.process(g, "999999"));

    assert.equal((await (await c.exec(g, { command: ["sleep", "600"], timeout_ms: 200 })).wait()).process.timed_out, true);
    const hung = await c.execDetached(g, { command: ["sleep", "600"] });
    await c.signalProcess(g, hung.id, "TERM");
    assert.equal((await (await c.attach(g, hung.id)).wait()).process.exit_code, 128 + 15);

    // A running call is fenced with its generation: its stream's last
    // frame says so, and the fence report lists it.
    const running = await c.exec(g, { command: [SH, "-c", "echo started; exec sleep 600"] });
    const it = running[Symbol.asyncIterator]();
    assert.equal((await it.next()).value.type, FrameType.STARTED);
    assert.equal((await it.next()).value.data.toString(), "started\n");
    const next = await harness(await shim.nextGen(), "exec sleep 600");
    assert.equal(next.fenced[0].generation, g);
    assert.equal(next.fenced[0].survivors, 0);
    assert.ok((next.fenced[0].tool_calls ?? []).some((t) => t.id === running.id));
    for (;;) {
      const { done } = await it.next();
      if (done) break;
    }
    assert.equal(running.last.type, FrameType.FENCED);
    assert.equal(running.process.fenced, true);
    await rejects(Code.STALE_GENERATION, c.exec(g, { command: ["true"] }));
  });
});
