// connect("vsock-uds:PATH:PORT"): the hybrid vsock of Firecracker and
// Cloud Hypervisor, against a fake VMM socket that answers CONNECT as they
// do and then carries the stream to the real shim's control socket.
import assert from "node:assert/strict";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";

import { Code, ShimError, connect } from "../src/index.js";
import { cannotRun, startShim, strict } from "../testutil/shim.js";

// fakeHybrid listens on a unix socket like a VMM's hybrid vsock: it reads
// one "CONNECT <port>\n" line, records it, and answers with answer(port);
// when that starts "OK " it pipes the connection to target (a unix socket).
function fakeHybrid(dir, target, answer) {
  const sockPath = path.join(dir, "vsock.sock");
  const seen = [];
  const server = net.createServer((c) => {
    let buf = Buffer.alloc(0);
    const onData = (chunk) => {
      buf = Buffer.concat([buf, chunk]);
      const nl = buf.indexOf(0x0a);
      if (nl < 0) return;
      c.removeListener("data", onData);
      const line = buf.subarray(0, nl).toString();
      seen.push(line);
      const port = Number(line.replace(/^CONNECT /, ""));
      const a = answer(port);
      c.write(a + "\n");
      if (!a.startsWith("OK ")) {
        c.end();
        return;
      }
      const up = net.connect(target);
      if (nl + 1 < buf.length) up.write(buf.subarray(nl + 1));
      c.pipe(up).pipe(c);
      up.on("error", () => c.destroy());
      c.on("error", () => up.destroy());
    };
    c.on("data", onData);
  });
  return new Promise((resolve) => server.listen(sockPath, () => resolve({ sockPath, seen, server })));
}

async function rejects(code, p) {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof ShimError, `not a ShimError: ${e}`);
    assert.equal(e.code, code, e.message);
    return e;
  }
  assert.fail(`no ${code}`);
}

test("connect refuses a spec it cannot serve", () => {
  for (const spec of ["vsock:3:1024", "serial:/x", "vsock-uds:/x", "vsock-uds:/x:0", "vsock-uds:/x:port", "nope", "unix:"]) {
    assert.throws(() => connect(spec), (e) => e instanceof ShimError && e.code === Code.BAD_REQUEST, spec);
  }
  assert.equal(connect("unix:/run/x/shim.sock").socketPath, "/run/x/shim.sock");
  assert.equal(connect("vsock-uds:/run/fc:1/v.sock:1024").socketPath, "vsock-uds:/run/fc:1/v.sock:1024");
});

describe("a hybrid vsock without shim behind it", () => {
  let dir;
  before(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), "shim-hybrid-"));
  });
  after(() => fs.rmSync(dir, { recursive: true, force: true }));

  test("no VMM socket: UNREACHABLE", async () => {
    const e = await rejects(Code.UNREACHABLE, connect(`vsock-uds:${path.join(dir, "none.sock")}:1024`).status());
    assert.match(e.message, /hybrid vsock .*none\.sock/);
  });

  test("a VMM that refuses the port: UNREACHABLE, with its answer", async () => {
    const f = await fakeHybrid(dir, "/nonexistent", () => "ERR no listener");
    try {
      const e = await rejects(Code.UNREACHABLE, connect(`vsock-uds:${f.sockPath}:1024`).health());
      assert.match(e.message, /CONNECT 1024 answered "ERR no listener"/);
      assert.deepEqual(f.seen, ["CONNECT 1024"]);
    } finally {
      f.server.close();
    }
  });
});

const why = cannotRun();
if (why && strict) {
  test("hybrid vsock integration", () => assert.fail(`cannot run (${why}) but SHIM_REQUIRE_INTEGRATION=1`));
}

describe("a hybrid vsock to the real shim", { skip: why || false, timeout: 120000 }, () => {
  let s;
  let f;
  before(async () => {
    s = await startShim();
    f = await fakeHybrid(s.tmp, path.join(s.runtimeDir, "shim.sock"), () => "OK 1073741824");
  });
  after(async () => {
    f?.server.close();
    await s?.stop();
  });

  test("status, a generation's start, wait and logs (a stream) go through CONNECT <port>", async () => {
    const c = connect(`vsock-uds:${f.sockPath}:1024`, { timeoutMs: 30000 });
    const st = await c.status();
    assert.equal(typeof st.generation, "number");
    const n = st.generation + 1;
    const r = await c.start({ generation: n, command: ["/bin/sh", "-c", "echo through-vsock; exit 7"], env: ["PATH=/usr/bin:/bin"] });
    assert.equal(r.generation, n);
    const ex = await c.wait(n);
    assert.equal(ex.exit_code, 7);
    const { stdout } = await (await c.logs(n)).readAll();
    assert.equal(stdout.toString(), "through-vsock\n");
    assert.ok(f.seen.length >= 4 && f.seen.every((l) => l === "CONNECT 1024"), JSON.stringify(f.seen));
    // the control: the same shim through its own socket answers the same
    assert.equal((await s.client.status()).generation, n);
  });
});
