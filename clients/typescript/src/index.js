// Client of shim's control API for Node (standard library only): HTTP/1.1 +
// JSON over the unix socket <runtime-dir>/shim.sock, under /v1/ (README.md,
// "API"; the wire types are Go's package api). Plain ES module; its
// TypeScript types are in index.d.ts beside it (Node runs no .ts by itself,
// and this package has no build step and no dependency).
//
// Request and result objects use the wire's field names (snake_case), so a
// field shim adds later can be given and read without a new release.

import http from "node:http";
import net from "node:net";
import path from "node:path";
import readline from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";

/** Stable error codes (api/api.go); each key is its wire value. */
export const Code = Object.freeze({
  BAD_REQUEST: "BAD_REQUEST",
  NOT_FOUND: "NOT_FOUND",
  STALE_GENERATION: "STALE_GENERATION",
  GENERATION_CONFLICT: "GENERATION_CONFLICT",
  FENCE_FAILED: "FENCE_FAILED",
  FREEZE_FAILED: "FREEZE_FAILED",
  CGROUP_ROOT_REFUSED: "CGROUP_ROOT_REFUSED",
  CUT_FAILED: "CUT_FAILED",
  AUDIT_FAILED: "AUDIT_FAILED",
  TOKEN_NOT_PERSISTED: "TOKEN_NOT_PERSISTED",
  RESTORE_FAILED: "RESTORE_FAILED",
  WORKTREE_REFUSED: "WORKTREE_REFUSED",
  START_FAILED: "START_FAILED",
  PEER_NOT_ALLOWED: "PEER_NOT_ALLOWED",
  NOT_RUNNING: "NOT_RUNNING",
  GENERATION_LIVE: "GENERATION_LIVE",
  CONTROLLER_MISSING: "CONTROLLER_MISSING",
  UNSUPPORTED: "UNSUPPORTED",
  SHUTTING_DOWN: "SHUTTING_DOWN",
  ISOLATION_UNAVAILABLE: "ISOLATION_UNAVAILABLE",
  NOT_CURRENT: "NOT_CURRENT",
  // an end of a generation above the highest announced, without force:
  // nothing was fenced
  NOT_ANNOUNCED: "NOT_ANNOUNCED",
  // HTTP 405: the path exists with other methods
  METHOD_NOT_ALLOWED: "METHOD_NOT_ALLOWED",
  INTERNAL: "INTERNAL",
  // the exec API (api/exec.go): an exec into a generation whose lease ran
  // out; a generation already running 256 tool calls; a write to a closed
  // stdin; a call that did not read its stdin in time
  GENERATION_SUSPENDED: "GENERATION_SUSPENDED",
  TOO_MANY_CALLS: "TOO_MANY_CALLS",
  STDIN_CLOSED: "STDIN_CLOSED",
  STDIN_FULL: "STDIN_FULL",
  // client side only: a tool call's output stream ended without its exit
  // or fenced frame: attach() again from the stream's offsets
  STREAM_LOST: "STREAM_LOST",
  // client side only: the shim could not be reached
  UNREACHABLE: "UNREACHABLE",
  // client side only: the call's timeout or abort ended it after it was
  // sent; shim may have carried it out: retry with the same generation and
  // spec (an identical retry is answered with the first outcome, replayed)
  OUTCOME_UNKNOWN: "OUTCOME_UNKNOWN",
  // wait()'s timeout or abort (shim ctl wait --timeout): the generation had
  // not exited yet and still runs; a wait changes nothing, so there is
  // nothing to retry but the wait
  WAIT_TIMEOUT: "WAIT_TIMEOUT",
});

/** Status.state. */
export const State = Object.freeze({
  IDLE: "idle",
  RUNNING: "running",
  EXITED: "exited",
  FENCING: "fencing",
  FAILED: "failed",
  // the current generation's lease ran out: frozen and cut (credentials
  // refused, connections aborted), not killed, until a renewal resumes it
  // or a newer announcement fences it; also a generation record's state
  SUSPENDED: "suspended",
});

/** Generation.state, besides running, suspended, exited, fencing and failed (State). */
export const GenState = Object.freeze({ ADOPTED: "adopted", FENCED: "fenced", GONE: "gone" });

/** Event.type. */
export const EventType = Object.freeze({
  STARTED: "started",
  EXITED: "exited",
  QUIESCED: "quiesced",
  FENCING: "fencing",
  FENCED: "fenced",
  FAILED: "failed",
  REMOTE_MOVED: "remote_moved",
  SHUTDOWN: "shutdown",
  // a lease ran out: the generation was suspended (data.killed: it could
  // not be, and was killed instead)
  LEASE_EXPIRED: "lease_expired",
  // a renewal resumed a suspended generation
  RESUMED: "resumed",
  // this reader missed the events from..to (lost of them): it fell behind
  // the events shim keeps, or asked for a since older than them
  GAP: "gap",
});

/** Frame.type: the frames of a byte stream (api/stream.go): logs, exec. */
export const FrameType = Object.freeze({
  STARTED: "started",
  STDOUT: "stdout",
  STDERR: "stderr",
  // bytes of stream not kept; offset: where it resumes
  DROPPED: "dropped",
  EXIT: "exit",
  FENCED: "fenced",
  // a read that does not follow reached what is kept
  END: "end",
});

/** StartRequest.network. */
export const Network = Object.freeze({ HOST: "host", NONE: "none", ISOLATED: "isolated" });

/**
 * A failed call: the API's stable code (Code), its message (detail; the
 * Error's message is "CODE: detail"), and for a failed announcement the
 * fence reports of what was fenced before it failed. status is the HTTP
 * status (undefined for UNREACHABLE and OUTCOME_UNKNOWN).
 */
export class ShimError extends Error {
  constructor(code, message, fenced, status, cause) {
    super(`${code}: ${message}`, cause === undefined ? undefined : { cause });
    this.name = "ShimError";
    this.code = code;
    this.detail = message;
    this.fenced = fenced ?? [];
    this.status = status;
  }
}

/** The stable code of an error this client threw (INTERNAL for any other). */
export function codeOf(err) {
  return err instanceof ShimError ? err.code : Code.INTERNAL;
}

function gen(n) {
  if (!Number.isSafeInteger(n) || n < 0) {
    throw new ShimError(Code.BAD_REQUEST, `generation ${String(n)} is not a non-negative integer`);
  }
  return String(n);
}

// undefined and null mean "not given": shim decodes strictly and treats an
// absent field as its zero value.
function clean(obj) {
  const out = {};
  for (const [k, v] of Object.entries(obj ?? {})) if (v !== undefined && v !== null) out[k] = v;
  return out;
}

function decode(status, raw) {
  if (status >= 300) {
    let body;
    try {
      body = JSON.parse(raw);
    } catch {
      body = undefined;
    }
    if (!body || typeof body !== "object" || !body.code) {
      throw new ShimError(Code.INTERNAL, `HTTP ${status}: ${raw.trim()}`, undefined, status);
    }
    throw new ShimError(body.code, body.message ?? "", body.fenced, status);
  }
  return raw.trim() === "" ? undefined : JSON.parse(raw);
}

// maxHybridReply bounds the hybrid vsock's answer line, as Go's
// internal/vmchan does.
const maxHybridReply = 128;

// hybridTimeoutMs bounds the wait for that line (a VMM that accepts and
// never answers); the call's own timeoutMs bounds the rest.
const hybridTimeoutMs = 10_000;

/**
 * A createConnection for node:http that reaches a guest's vsock port
 * through a hybrid vsock (Firecracker, Cloud Hypervisor): the VMM's unix
 * socket at udsPath, "CONNECT <port>\n", an "OK ...\n" line, then the
 * stream is the guest's port (Go's vmchan.DialHybrid).
 */
function hybridConnection(udsPath, port) {
  return (_opts, oncreate) => {
    const sock = net.connect(udsPath);
    let line = Buffer.alloc(0);
    let done = false;
    const stop = () => {
      done = true;
      sock.setTimeout(0);
      sock.removeListener("timeout", onTimeout);
      sock.removeListener("readable", onReadable);
      sock.removeListener("error", onError);
      sock.removeListener("end", onEnd);
    };
    const fail = (why) => {
      if (done) return;
      stop();
      sock.destroy();
      oncreate(new Error(`hybrid vsock ${udsPath}: ${why}`));
    };
    // Paused mode ("readable", read()), never pause(): once this listener
    // is gone, node:http's "data" listener makes the stream flow.
    const onReadable = () => {
      let chunk;
      while (!done && (chunk = sock.read()) !== null) {
        line = Buffer.concat([line, chunk]);
        const nl = line.indexOf(0x0a);
        if (nl < 0) {
          if (line.length >= maxHybridReply) fail(`no answer to CONNECT ${port}: line too long`);
          continue;
        }
        stop();
        const answer = line.subarray(0, nl).toString("latin1");
        if (!answer.startsWith("OK ")) {
          sock.destroy();
          oncreate(new Error(`hybrid vsock ${udsPath}: CONNECT ${port} answered ${JSON.stringify(answer)}`));
          return;
        }
        if (nl + 1 < line.length) sock.unshift(line.subarray(nl + 1)); // the guest's first bytes
        oncreate(null, sock);
      }
    };
    const onError = (err) => fail(err.message);
    const onEnd = () => fail(`no answer to CONNECT ${port}: the socket closed`);
    const onTimeout = () => fail(`no answer to CONNECT ${port} in ${hybridTimeoutMs} ms`);
    sock.setTimeout(hybridTimeoutMs, onTimeout);
    sock.on("error", onError);
    sock.on("end", onEnd);
    sock.on("readable", onReadable);
    sock.once("connect", () => sock.write(`CONNECT ${port}\n`));
  };
}

/**
 * A Client for the shim that spec names, where the unix socket in its
 * runtime dir is out of reach (docs/microvm.md; Go's client.Connect):
 *
 *   unix:PATH            a control socket (as new Client({socketPath}))
 *   vsock-uds:PATH:PORT  a hybrid vsock (Firecracker, Cloud Hypervisor):
 *                        the VMM's unix socket, then CONNECT PORT, to a
 *                        guest whose shim runs --listen vsock:PORT
 *
 * vsock:CID:PORT (AF_VSOCK) and serial:PATH are not offered: Node's
 * standard library has no AF_VSOCK, and a serial port carries one
 * connection at a time, which this client's one connection per call does
 * not keep to. A bad spec throws BAD_REQUEST.
 */
export function connect(spec, opts = {}) {
  const [kind, ...rest] = String(spec).split(":");
  const tail = rest.join(":");
  if (kind === "unix" && tail !== "") return new Client({ ...opts, socketPath: tail });
  if (kind === "vsock-uds") {
    const i = tail.lastIndexOf(":");
    const port = i > 0 ? Number(tail.slice(i + 1)) : NaN;
    if (i <= 0 || !/^[0-9]+$/.test(tail.slice(i + 1)) || port < 1 || port > 0xffffffff) {
      throw new ShimError(Code.BAD_REQUEST, `connect ${JSON.stringify(spec)}: want vsock-uds:PATH:PORT (PORT 1 to 4294967295)`);
    }
    const c = new Client(opts);
    c.socketPath = String(spec);
    c._connect = { createConnection: hybridConnection(tail.slice(0, i), port) };
    return c;
  }
  throw new ShimError(Code.BAD_REQUEST,
    `connect ${JSON.stringify(spec)}: want unix:PATH or vsock-uds:PATH:PORT (vsock: and serial: are Go's and shim ctl's)`);
}

export class Client {
  /**
   * runtimeDir defaults to $SHIM_RUNTIME_DIR, else /run/shim (as shim ctl);
   * socketPath overrides <runtimeDir>/shim.sock. timeoutMs bounds every call
   * not given its own (undefined: no bound). connect() gives a Client of
   * another channel.
   */
  constructor(opts = {}) {
    const dir = opts.runtimeDir ?? (process.env.SHIM_RUNTIME_DIR || "/run/shim");
    this.socketPath = opts.socketPath ?? path.join(dir, "shim.sock");
    this.timeoutMs = opts.timeoutMs;
  }

  // The node:http options that reach shim: its unix socket, one
  // connection per call (agent: false), closed after the answer; or the
  // channel connect() chose (no agent: one connection per call too).
  _reach() {
    return this._connect ?? { socketPath: this.socketPath, agent: false };
  }

  _call(method, urlPath, body, opts = {}) {
    const timeoutMs = "timeoutMs" in opts ? opts.timeoutMs : this.timeoutMs;
    const signal = opts.signal;
    return new Promise((resolve, reject) => {
      let settled = false;
      let timer;
      const finish = (fn, v) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        fn(v);
      };
      const unknown = (why, cause) =>
        new ShimError(
          Code.OUTCOME_UNKNOWN,
          `${method} ${urlPath}: ${why} before shim answered; the outcome is unknown: retry with the same generation and spec`,
          undefined, undefined, cause);
      const data = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
      const headers = data ? { "Content-Type": "application/json", "Content-Length": data.length } : {};
      const req = http.request({ ...this._reach(), path: urlPath, method, headers });
      const onAbort = () => {
        const e = unknown("aborted", signal.reason);
        finish(reject, e);
        req.destroy(e);
      };
      if (signal?.aborted) {
        onAbort();
        return;
      }
      signal?.addEventListener("abort", onAbort, { once: true });
      if (timeoutMs !== undefined) {
        timer = setTimeout(() => {
          const e = unknown(`timed out after ${timeoutMs} ms`);
          finish(reject, e);
          req.destroy(e);
        }, timeoutMs);
      }
      req.on("error", (err) => {
        finish(reject, new ShimError(Code.UNREACHABLE,
          `${method} ${urlPath}: cannot reach shim at ${this.socketPath}: ${err.message}`,
          undefined, undefined, err));
      });
      req.on("response", (res) => {
        const chunks = [];
        res.on("data", (c) => chunks.push(c));
        res.on("error", (err) =>
          finish(reject, new ShimError(Code.UNREACHABLE, `${method} ${urlPath}: reading the answer: ${err.message}`,
            undefined, undefined, err)));
        res.on("end", () => {
          try {
            finish(resolve, decode(res.statusCode, Buffer.concat(chunks).toString("utf8")));
          } catch (e) {
            finish(reject, e);
          }
        });
      });
      req.end(data);
    });
  }

  /** GET /v1/health: {ok: true}. */
  health(opts) {
    return this._call("GET", "/v1/health", undefined, opts);
  }

  /** GET /v1/status. */
  status(opts) {
    return this._call("GET", "/v1/status", undefined, opts);
  }

  /**
   * POST /v1/generations: announce req.generation and start req.command;
   * older ones are fenced first. With req.lease_ms the generation is
   * suspended (frozen and cut, not killed) unless renew() or keepLease()
   * renews it in time; an identical retry renews it too (lease_ms is not
   * part of the announcement's identity).
   */
  start(req, opts) {
    const body = clean(req);
    gen(body.generation);
    return this._call("POST", "/v1/generations", body, opts);
  }

  /** POST /v1/fence: fence every generation older than req.generation, start nothing. */
  fence(req, opts) {
    const body = clean(req);
    gen(body.generation);
    return this._call("POST", "/v1/fence", body, opts);
  }

  /**
   * POST /v1/generations/{n}/end: fence generation n itself, start nothing;
   * n never starts again. n above the highest announced rejects with
   * NOT_ANNOUNCED (nothing fenced) unless req.force.
   */
  end(n, req, opts) {
    return this._call("POST", `/v1/generations/${gen(n)}/end`, clean(req), opts);
  }

  /**
   * POST /v1/generations/{n}/lease: renew generation n's lease for
   * req.lease_ms from now (absent: the one in force, as announced or last
   * renewed). A suspended generation resumes (resumed: true, state
   * running). STALE_GENERATION: a newer generation was announced, this
   * supervisor is superseded (stop); NOT_RUNNING: it is being fenced or
   * gone; NOT_FOUND: never announced; BAD_REQUEST: no lease given and none
   * announced, or lease_ms out of range (50 ms to a week).
   */
  renew(n, req, opts) {
    return this._call("POST", `/v1/generations/${gen(n)}/lease`, clean(req), opts);
  }

  /**
   * Renews generation n's lease (leaseMs each time) every third of leaseMs
   * until opts.signal aborts (it then resolves) or a renewal is refused (it
   * rejects with that ShimError: STALE_GENERATION, NOT_RUNNING, ...). A
   * renewal that did not reach shim or was not answered (UNREACHABLE,
   * OUTCOME_UNKNOWN; each is bounded by a third of the lease) is tried
   * again at the next tick: the lease runs out only if that lasts a whole
   * lease. Run it beside the wait for the generation (Go's
   * client.KeepLease).
   */
  async keepLease(n, leaseMs, opts = {}) {
    gen(n);
    if (!Number.isSafeInteger(leaseMs) || leaseMs <= 0) {
      throw new ShimError(Code.BAD_REQUEST, `leaseMs ${String(leaseMs)} is not a positive integer`);
    }
    const { signal } = opts;
    const every = leaseMs / 3;
    let next = performance.now() + every;
    while (!signal?.aborted) {
      try {
        await sleep(Math.max(0, next - performance.now()), undefined, { signal });
      } catch {
        return; // aborted
      }
      // After a renewal that took longer than a tick, the next one comes
      // at once, and only one (as with a Go ticker).
      next = Math.max(next + every, performance.now());
      try {
        await this.renew(n, { lease_ms: leaseMs }, { timeoutMs: every, signal });
      } catch (e) {
        if (signal?.aborted) return;
        if (e instanceof ShimError && (e.code === Code.UNREACHABLE || e.code === Code.OUTCOME_UNKNOWN)) continue;
        throw e;
      }
    }
  }

  /** POST /v1/worktrees: register a worktree before any harness runs there. */
  register(req, opts) {
    return this._call("POST", "/v1/worktrees", clean(req), opts);
  }

  /** GET /v1/generations?label=k=v...: the kept records whose labels hold every k=v (none: all), oldest first. */
  async generations(labels, opts) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(labels ?? {})) q.append("label", `${k}=${v}`);
    const s = q.toString();
    return (await this._call("GET", "/v1/generations" + (s ? "?" + s : ""), undefined, opts)) ?? [];
  }

  /** GET /v1/generations/{n}: one generation's record. */
  generation(n, opts) {
    return this._call("GET", `/v1/generations/${gen(n)}`, undefined, opts);
  }

  /**
   * GET /v1/generations/{n}/wait: resolves when generation n's harness has
   * exited (and the rest of it is gone) with its exit record. A timeout or
   * abort rejects with WAIT_TIMEOUT (it still runs; a wait changes nothing,
   * waiting again is all there is to do).
   */
  async wait(n, opts) {
    try {
      return await this._call("GET", `/v1/generations/${gen(n)}/wait`, undefined, opts);
    } catch (e) {
      if (!(e instanceof ShimError) || e.code !== Code.OUTCOME_UNKNOWN) throw e;
      throw new ShimError(Code.WAIT_TIMEOUT, `generation ${n} had not exited when the wait ended (${e.message}); it still runs`,
        undefined, undefined, e);
    }
  }

  /** POST /v1/generations/{n}/signal: signal ("TERM", "SIGKILL", "9") to n's harness, or with all to all of its processes. */
  signal(n, signal, opts = {}) {
    const { all, ...call } = opts;
    return this._call("POST", `/v1/generations/${gen(n)}/signal`, clean({ signal, all: all || undefined }), call);
  }

  /** GET /v1/snapshots?worktree=: the abandoned-edit snapshots of a worktree ("" = the only one), newest first. */
  snapshots(worktree = "", opts) {
    return this._call("GET", "/v1/snapshots?worktree=" + encodeURIComponent(worktree), undefined, opts);
  }

  /** GET /v1/snapshots/{n}?worktree=: generation n's snapshot. */
  snapshot(n, worktree = "", opts) {
    return this._call("GET", `/v1/snapshots/${gen(n)}?worktree=` + encodeURIComponent(worktree), undefined, opts);
  }

  /**
   * GET /v1/events[?since=SEQ]: resolves once shim has subscribed (every
   * event after that is in the stream) with an async iterable of events; it
   * ends when shim closes the stream (shutdown), at close(), or at
   * opts.signal's abort. With opts.since, the events shim kept after that
   * seq (0: all it kept) come first. Every event has a seq; a reader that
   * fell behind what shim keeps gets an event of type gap (from, to, lost)
   * for the events it missed, never a silent loss. Pass opts.instance, the
   * instance of the event whose seq is since: a since of another shim (it
   * restarted, and numbers its events from 1 again) rejects with
   * BAD_REQUEST (so does one ahead of the newest event): read again from 0.
   */
  async events(opts = {}) {
    let p = "/v1/events";
    if (opts.since !== undefined) {
      const q = new URLSearchParams({ since: gen(opts.since) });
      if (opts.instance !== undefined) q.set("instance", opts.instance);
      p += `?${q}`;
    } else if (opts.instance !== undefined) {
      throw new ShimError(Code.BAD_REQUEST, "instance goes with since");
    }
    const { lines, close } = await this._stream(p, opts.signal);
    return {
      close,
      async *[Symbol.asyncIterator]() {
        try {
          for (;;) {
            const { value: line, done } = await lines.next();
            if (done) return;
            if (line.trim() !== "") yield JSON.parse(line);
          }
        } finally {
          close();
        }
      },
    };
  }

  /** events({ ...opts, since }) (opts.instance: the shim that numbered since). */
  eventsSince(since, opts = {}) {
    return this.events({ ...opts, since });
  }

  /**
   * GET /v1/generations/{n}/logs: generation n's kept output from
   * opts.stdoutOffset and opts.stderrOffset, as an async iterable of
   * frames (data decoded to a Buffer). Without opts.follow it ends with an
   * end frame at what is kept so far; with it, it waits for more and ends,
   * once the generation is over, with an exit or fenced frame (its exit
   * record in exit). A dropped frame says how many bytes of a stream were
   * not kept (past shim's --log-max) and where it resumes. The stream's
   * stdoutOffset and stderrOffset are where it stopped, last its last frame
   * (undefined when it was cut off: read again from the offsets).
   */
  async logs(n, opts = {}) {
    const q = new URLSearchParams({
      stdout_offset: String(opts.stdoutOffset ?? 0),
      stderr_offset: String(opts.stderrOffset ?? 0),
      follow: opts.follow ? "1" : "0",
    });
    const { lines, close } = await this._stream(`/v1/generations/${gen(n)}/logs?${q}`, opts.signal);
    return frameStream(lines, close, opts.stdoutOffset ?? 0, opts.stderrOffset ?? 0);
  }

  // -- tool calls (docs/exec.md)

  /**
   * POST /v1/generations/{n}/processes: runs req.command as a tool call
   * inside generation n (its namespaces, layers, user and environment plus
   * req.env; its own child cgroup) and streams its output: an async
   * iterable of frames (first started, with id and pid, kept on the
   * stream; then stdout, stderr, dropped; last exit or fenced, whose
   * process is the call's record), or wait() for the record. req is
   * api.ExecRequest by its wire names: command, env (["K=V"]), cwd, user,
   * stdin (true: keep it open for writeStdin), stdin_data (a Buffer or
   * string, sent whole then closed), tty, rows, cols, timeout_ms, labels.
   */
  async exec(n, req, opts = {}) {
    const body = execBody(req, false);
    const { lines, close } = await this._stream(`/v1/generations/${gen(n)}/processes`, opts.signal, "POST", body);
    return frameStream(lines, close, 0, 0);
  }

  /** exec() with detach: resolves with the call's record at once; read its output with attach(). */
  execDetached(n, req, opts) {
    return this._call("POST", `/v1/generations/${gen(n)}/processes`, execBody(req, true), opts);
  }

  /**
   * GET .../processes/{id}/output: a call's kept output again from
   * opts.stdoutOffset and opts.stderrOffset (a supervisor that restarted
   * finds its calls again); follows until it ends unless opts.follow is false.
   */
  async attach(n, id, opts = {}) {
    const q = new URLSearchParams({
      stdout_offset: String(opts.stdoutOffset ?? 0),
      stderr_offset: String(opts.stderrOffset ?? 0),
      follow: opts.follow === false ? "0" : "1",
    });
    const p = `/v1/generations/${gen(n)}/processes/${encodeURIComponent(id)}/output?${q}`;
    const { lines, close } = await this._stream(p, opts.signal);
    const s = frameStream(lines, close, opts.stdoutOffset ?? 0, opts.stderrOffset ?? 0);
    s.id = String(id);
    return s;
  }

  /** GET /v1/generations/{n}/processes: its tool calls' records. */
  async processes(n, opts) {
    return (await this._call("GET", `/v1/generations/${gen(n)}/processes`, undefined, opts)) ?? [];
  }

  /** GET /v1/generations/{n}/processes/{id}: one call's record. */
  process(n, id, opts) {
    return this._call("GET", `/v1/generations/${gen(n)}/processes/${encodeURIComponent(id)}`, undefined, opts);
  }

  /** Signals a call's leader, or with opts.all every process of its cgroup. */
  signalProcess(n, id, signal, opts = {}) {
    return this._call("POST", `/v1/generations/${gen(n)}/processes/${encodeURIComponent(id)}/signal`,
      clean({ signal, all: opts.all || undefined }), opts);
  }

  /** Writes data (a Buffer or string) to a call's stdin and/or closes it (opts.close): {written, closed}. */
  writeStdin(n, id, data, opts = {}) {
    const b = data === undefined || data === null ? undefined : Buffer.from(data);
    return this._call("POST", `/v1/generations/${gen(n)}/processes/${encodeURIComponent(id)}/stdin`,
      clean({ data: b && b.length ? b.toString("base64") : undefined, close: opts.close || undefined }), opts);
  }

  /** Sets a TTY call's window size. */
  resize(n, id, rows, cols, opts) {
    return this._call("POST", `/v1/generations/${gen(n)}/processes/${encodeURIComponent(id)}/resize`,
      { rows, cols }, opts);
  }

  /**
   * GET path as a stream of NDJSON lines: resolves with an async iterator of
   * its lines and close() once shim answered 200; rejects with the API's
   * error otherwise.
   */
  _stream(p, signal, method = "GET", body = undefined) {
    return new Promise((resolve, reject) => {
      const data = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
      const headers = data ? { "Content-Type": "application/json", "Content-Length": data.length } : {};
      const req = http.request({ ...this._reach(), path: p, method, headers });
      const what = `${method} ${p.split("?")[0]}`;
      const onAbort = () => req.destroy();
      if (signal?.aborted) {
        reject(new ShimError(Code.OUTCOME_UNKNOWN, `${what}: aborted before shim answered`));
        return;
      }
      signal?.addEventListener("abort", onAbort, { once: true });
      let answered = false;
      req.on("error", (err) => {
        if (answered) return;
        signal?.removeEventListener("abort", onAbort);
        reject(signal?.aborted
          ? new ShimError(Code.OUTCOME_UNKNOWN, `${what}: aborted before shim answered`)
          : new ShimError(Code.UNREACHABLE, `${what}: cannot reach shim at ${this.socketPath}: ${err.message}`,
            undefined, undefined, err));
      });
      req.on("response", (res) => {
        answered = true;
        if (res.statusCode !== 200) {
          const chunks = [];
          res.on("data", (c) => chunks.push(c));
          res.on("end", () => {
            signal?.removeEventListener("abort", onAbort);
            try {
              decode(res.statusCode, Buffer.concat(chunks).toString("utf8"));
              reject(new ShimError(Code.INTERNAL, `${what}: HTTP ${res.statusCode}`));
            } catch (e) {
              reject(e);
            }
          });
          return;
        }
        res.on("error", () => {}); // a close() or abort ends the iteration
        const rl = readline.createInterface({ input: res, crlfDelay: Infinity });
        // Made now, not at the first for-await: readline drops the lines
        // read before its iterator exists.
        const lines = rl[Symbol.asyncIterator]();
        const close = () => {
          signal?.removeEventListener("abort", onAbort);
          rl.close();
          req.destroy();
        };
        resolve({ lines, close });
      });
      req.end(data);
    });
  }
}

// execBody is an ExecRequest on the wire (stdin_data in base64).
function execBody(req, detach) {
  const b = { ...req };
  if (b.stdin_data !== undefined && b.stdin_data !== null) b.stdin_data = Buffer.from(b.stdin_data).toString("base64");
  if (detach) b.detach = true;
  return clean(b);
}

// frameStream is a byte stream's frames (logs, a tool call's output) as an
// async iterable, data decoded to Buffers, the offsets where it stopped
// kept, and for a tool call its id, pid and record.
function frameStream(lines, close, stdoutOffset, stderrOffset) {
  const stream = {
    stdoutOffset,
    stderrOffset,
    last: undefined,
    id: undefined,
    pid: undefined,
    process: undefined,
    close,
    async *[Symbol.asyncIterator]() {
      try {
        while (stream.last === undefined) {
          const { value: line, done } = await lines.next();
          if (done) return;
          if (line.trim() === "") continue;
          const f = JSON.parse(line);
          f.data = f.data ? Buffer.from(f.data, "base64") : Buffer.alloc(0);
          switch (f.type) {
            case FrameType.STARTED: stream.id = f.id; stream.pid = f.pid; break;
            case FrameType.STDOUT: stream.stdoutOffset = (f.offset ?? 0) + f.data.length; break;
            case FrameType.STDERR: stream.stderrOffset = (f.offset ?? 0) + f.data.length; break;
            case FrameType.DROPPED:
              if (f.stream === "stderr") stream.stderrOffset = f.offset ?? 0;
              else stream.stdoutOffset = f.offset ?? 0;
              break;
            case FrameType.EXIT: case FrameType.FENCED:
              stream.process = f.process;
              stream.last = f;
              break;
            case FrameType.END:
              stream.last = f;
              break;
          }
          yield f;
        }
      } finally {
        close();
      }
    },
    /** Reads the stream to its end: { stdout, stderr } as Buffers. */
    async readAll() {
      const out = [], err = [];
      for await (const f of stream) {
        if (f.type === FrameType.STDOUT) out.push(f.data);
        else if (f.type === FrameType.STDERR) err.push(f.data);
      }
      return { stdout: Buffer.concat(out), stderr: Buffer.concat(err) };
    },
    /**
     * A tool call's stream: reads it to its exit or fenced frame and
     * resolves with { process, stdout, stderr }; a stream cut before it
     * rejects with STREAM_LOST (attach() again from the offsets).
     */
    async wait() {
      const { stdout, stderr } = await stream.readAll();
      if (stream.process === undefined) {
        throw new ShimError(Code.STREAM_LOST, `tool call ${stream.id}: its output stream ended without its exit ` +
          `(stdout at ${stream.stdoutOffset}, stderr at ${stream.stderrOffset}): attach again`);
      }
      return { process: stream.process, stdout, stderr };
    },
  };
  return stream;
}
