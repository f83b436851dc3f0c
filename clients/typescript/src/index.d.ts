// TypeScript types of the client in index.js (the wire types of Go's package
// api, api/types.go and api/reports.go; field names are the wire's). A test
// checks that every name index.js exports is declared here and the reverse.

export declare const Code: Readonly<{
  BAD_REQUEST: "BAD_REQUEST";
  NOT_FOUND: "NOT_FOUND";
  STALE_GENERATION: "STALE_GENERATION";
  GENERATION_CONFLICT: "GENERATION_CONFLICT";
  FENCE_FAILED: "FENCE_FAILED";
  FREEZE_FAILED: "FREEZE_FAILED";
  CGROUP_ROOT_REFUSED: "CGROUP_ROOT_REFUSED";
  CUT_FAILED: "CUT_FAILED";
  AUDIT_FAILED: "AUDIT_FAILED";
  TOKEN_NOT_PERSISTED: "TOKEN_NOT_PERSISTED";
  RESTORE_FAILED: "RESTORE_FAILED";
  WORKTREE_REFUSED: "WORKTREE_REFUSED";
  START_FAILED: "START_FAILED";
  PEER_NOT_ALLOWED: "PEER_NOT_ALLOWED";
  NOT_RUNNING: "NOT_RUNNING";
  GENERATION_LIVE: "GENERATION_LIVE";
  CONTROLLER_MISSING: "CONTROLLER_MISSING";
  UNSUPPORTED: "UNSUPPORTED";
  SHUTTING_DOWN: "SHUTTING_DOWN";
  ISOLATION_UNAVAILABLE: "ISOLATION_UNAVAILABLE";
  NOT_CURRENT: "NOT_CURRENT";
  NOT_ANNOUNCED: "NOT_ANNOUNCED";
  METHOD_NOT_ALLOWED: "METHOD_NOT_ALLOWED";
  INTERNAL: "INTERNAL";
  GENERATION_SUSPENDED: "GENERATION_SUSPENDED";
  TOO_MANY_CALLS: "TOO_MANY_CALLS";
  STDIN_CLOSED: "STDIN_CLOSED";
  STDIN_FULL: "STDIN_FULL";
  STREAM_LOST: "STREAM_LOST";
  UNREACHABLE: "UNREACHABLE";
  OUTCOME_UNKNOWN: "OUTCOME_UNKNOWN";
  WAIT_TIMEOUT: "WAIT_TIMEOUT";
}>;
export type ErrorCode = (typeof Code)[keyof typeof Code];

export declare const State: Readonly<{
  IDLE: "idle";
  RUNNING: "running";
  EXITED: "exited";
  FENCING: "fencing";
  FAILED: "failed";
  SUSPENDED: "suspended";
}>;
export declare const GenState: Readonly<{ ADOPTED: "adopted"; FENCED: "fenced"; GONE: "gone" }>;
export declare const EventType: Readonly<{
  STARTED: "started";
  EXITED: "exited";
  QUIESCED: "quiesced";
  FENCING: "fencing";
  FENCED: "fenced";
  FAILED: "failed";
  REMOTE_MOVED: "remote_moved";
  SHUTDOWN: "shutdown";
  LEASE_EXPIRED: "lease_expired";
  RESUMED: "resumed";
  GAP: "gap";
}>;
export declare const FrameType: Readonly<{
  STARTED: "started";
  STDOUT: "stdout";
  STDERR: "stderr";
  DROPPED: "dropped";
  EXIT: "exit";
  FENCED: "fenced";
  END: "end";
}>;
export declare const Network: Readonly<{ HOST: "host"; NONE: "none"; ISOLATED: "isolated" }>;

export declare class ShimError extends Error {
  constructor(code: string, message: string, fenced?: FenceReport[], status?: number, cause?: unknown);
  /** A stable code (Code); a newer shim may send codes this client does not list. */
  readonly code: ErrorCode | string;
  /** The API's message ("CODE: detail" is the Error's message). */
  readonly detail: string;
  /** For a failed announcement: what was fenced before it failed. */
  readonly fenced: FenceReport[];
  /** The HTTP status; undefined for UNREACHABLE and OUTCOME_UNKNOWN. */
  readonly status: number | undefined;
}
export declare function codeOf(err: unknown): string;

/** timeoutMs or an abort ending a call after it was sent rejects with OUTCOME_UNKNOWN. */
export interface CallOptions {
  timeoutMs?: number;
  signal?: AbortSignal;
}
export interface ClientOptions {
  runtimeDir?: string;
  socketPath?: string;
  timeoutMs?: number;
}

export interface Credential {
  protocol: string;
  host: string;
  path?: string;
  username: string;
  password: string;
}
export interface Limits {
  memory_max?: number;
  pids_max?: number;
  cpu_max?: string;
}
export interface FetchSpec {
  remote?: string;
  branch?: string;
  remote_url?: string;
  settle_ms?: number;
}
export interface StartRequest {
  generation: number;
  command: string[];
  cwd?: string;
  user?: string;
  env?: string[];
  worktree?: string;
  baseline?: string;
  /** The branch the worktree is put on, at the baseline. */
  branch?: string;
  keep_paths?: string[];
  include_ignored?: boolean;
  network?: "host" | "none" | "isolated";
  allow?: string[];
  credentials?: Credential[];
  limits?: Limits;
  labels?: Record<string, string>;
  fetch?: FetchSpec;
  linger?: boolean;
  require_isolation?: boolean;
  if_current?: number;
  /**
   * The generation's lease (50 ms to a week): unless renewed in time it is
   * suspended (frozen and cut, not killed). Not part of the announcement's
   * identity: an identical retry renews it.
   */
  lease_ms?: number;
  [field: string]: unknown;
}
export interface FenceRequest {
  generation: number;
  worktree?: string;
  baseline?: string;
  keep_paths?: string[];
  include_ignored?: boolean;
  fetch?: FetchSpec;
  credentials?: Credential[];
  if_current?: number;
  [field: string]: unknown;
}
export interface EndRequest {
  if_current?: number;
  /** End a generation never announced (above the highest): otherwise NOT_ANNOUNCED. */
  force?: boolean;
}
export interface RenewRequest {
  /** The new lease from now; absent or 0: the one in force. */
  lease_ms?: number;
}
export interface RegisterRequest {
  worktree: string;
  keep_paths?: string[];
  include_ignored?: boolean;
}

export interface Exit {
  generation: number;
  pid: number;
  exit_code: number;
  signal?: number;
  started_at: string;
  exited_at: string;
  fenced: boolean;
}
export interface Registration {
  worktree: string;
  registered_late: boolean;
  dropped?: string[];
  registered_at?: string;
}
export interface PathChange {
  path: string;
  change: "added" | "modified" | "deleted" | "type_changed" | string;
}
export interface FetchReport {
  remote: string;
  branch: string;
  url?: string;
  ref?: string;
  authenticated: boolean;
  fetched_commit?: string;
  baseline?: string;
  remote_moved: boolean;
  remote_commits?: { commit: string; subject: string }[];
  remote_commit_count: number;
  remote_commits_truncated?: boolean;
  error?: string;
  duration_ms: number;
  settled?: boolean;
}
export interface CutReport {
  credentials_revoked: number;
  tunnels_closed: number;
  connections_closed: number;
  sockets_destroyed: number;
  link_deleted: boolean;
  connections?: Record<string, unknown>[];
  in_flight: boolean;
  abort_unsupported?: string;
  durations_ms?: Record<string, number>;
}
export interface WorktreeReport {
  worktree: string;
  baseline: string;
  baseline_rev?: string;
  snapshot_ref: string;
  snapshot_commit: string;
  snapshot_reused: boolean;
  head_before: string;
  modified: number;
  added: number;
  deleted: number;
  paths: PathChange[];
  local_commits: number;
  fetch?: FetchReport;
  registration?: Registration;
  durations_ms: Record<string, number>;
  [field: string]: unknown;
}
export interface FenceReport {
  generation: number;
  state_before: string;
  killed: number;
  survivors: number;
  durations_ms: Record<string, number>;
  cut?: CutReport;
  worktree?: WorktreeReport;
  layer?: Record<string, unknown>;
  snapshot_ref?: string;
  snapshot_commit?: string;
  baseline?: string;
  exit?: Exit;
  error?: { code: string; message: string };
  records_pruned?: number[];
}
export interface Lease {
  duration_ms: number;
  expires_at: string;
  /** True while it has run out and the generation is frozen and cut; suspended_at: since when. */
  suspended?: boolean;
  suspended_at?: string;
  suspensions?: number;
  renewals?: number;
  /** What the last suspension cut. */
  cut?: CutReport;
  /** The suspension could not be confirmed and the generation was killed instead; error says why. */
  killed?: boolean;
  error?: { code: string; message: string };
}
export interface RenewResult {
  generation: number;
  /** running (resumed or still running), exited (the lease no longer matters) or adopted. */
  state: string;
  resumed?: boolean;
  lease: Lease;
}
export interface StartResult {
  replayed?: boolean;
  /** On a replayed answer only: what became of the generation since (a Generation state; "gone" when its harness died with a previous shim). */
  state?: string;
  /** On a replayed answer only: its exit record, when it exited. */
  exit?: Exit;
  generation: number;
  pid: number;
  cgroup: string;
  started_at: string;
  fenced: FenceReport[] | null;
  network?: Record<string, unknown>;
  baseline?: string;
  durations_ms: Record<string, number>;
  worktree?: Registration;
  worktree_cleaned?: string[];
}
export interface FenceResult {
  generation: number;
  fenced: FenceReport[] | null;
}
export interface Generation {
  generation: number;
  state: string;
  pid?: number;
  cgroup?: string;
  command?: string[];
  started_at: string;
  exit?: Exit;
  worktree?: string;
  network?: string;
  labels?: Record<string, string>;
  stdout?: string;
  stderr?: string;
  limits?: Limits;
  linger?: boolean;
  isolation?: string;
  push_check?: FetchReport;
  fence?: FenceReport;
  /** Its lease, when it was announced with one. */
  lease?: Lease;
  [field: string]: unknown;
}
export interface Status {
  generation: number;
  state: string;
  pid: number;
  mode: string;
  mode_reason?: string;
  shim_pid: number;
  subreaper: boolean;
  cgroup_root?: string;
  runtime_dir: string;
  current?: Generation;
  live?: Generation[];
  error?: { code: string; message: string };
  orphans_reaped: number;
  version: string;
  worktrees?: Registration[];
  isolation: { mode: string; reason?: string; [field: string]: unknown };
  retention?: Record<string, unknown>;
}
export interface Snapshot {
  generation: number;
  ref: string;
  commit: string;
  baseline: string;
  head_before?: string;
  created: string;
  paths?: PathChange[];
  paths_truncated?: boolean;
  modified: number;
  added: number;
  deleted: number;
}
export interface SnapshotList {
  worktree: string;
  snapshots: Snapshot[];
}
/** An event's data, by the event's type (api.*Data in Go). */
export type EventData =
  | { pid: number } // started
  | { exit_code: number; signal: number; fenced: boolean } // exited
  | { killed: number } // quiesced
  | { by: number } // fencing
  | { killed: number; survivors: number } // fenced
  | { error: { code: string; message: string } } // failed: a start's as a fence's
  | { remote: string; branch: string; at_fence: string; now: string } // remote_moved
  | { killed: boolean } // lease_expired
  | Record<string, unknown>; // a type this version does not know
export interface Event {
  /** 1, 2, ... for this shim; a gap event has none. */
  seq?: number;
  /** The shim that numbered it (new at each start of shim). */
  instance?: string;
  type: string;
  generation: number;
  time: string;
  /** What the event says: its type's data (see EventData). */
  data?: EventData;
  /** A gap event's: the events from..to (lost of them) never reach this reader. */
  from?: number;
  to?: number;
  lost?: number;
}
export interface EventStream extends AsyncIterable<Event> {
  close(): void;
}
/** A tool call's record (api.Process). */
export interface Process {
  id: string;
  generation: number;
  pid?: number;
  command: string[];
  cwd?: string;
  user?: string;
  tty?: boolean;
  labels?: Record<string, string>;
  cgroup?: string;
  /** "running" or "exited" */
  state: string;
  started_at: string;
  exited_at?: string;
  /** 128+signal when killed */
  exit_code?: number;
  signal?: number;
  timed_out?: boolean;
  timeout_ms?: number;
  /** its generation was fenced (or ended) while it ran */
  fenced?: boolean;
  stdout_bytes: number;
  stderr_bytes: number;
  stdout_kept: number;
  stderr_kept: number;
  stdout?: string;
  stderr?: string;
  leftover?: number;
}
/** api.ExecRequest by its wire names. */
export interface ExecRequest {
  command: string[];
  /** ["K=V"], added to the generation's environment */
  env?: string[];
  cwd?: string;
  user?: string;
  /** keep stdin open for writeStdin */
  stdin?: boolean;
  /** sent whole, then end of file */
  stdin_data?: Buffer | string;
  tty?: boolean;
  rows?: number;
  cols?: number;
  timeout_ms?: number;
  labels?: Record<string, string>;
}
/** One frame of a byte stream (logs, a tool call's output); data decoded from base64. */
export interface Frame {
  type: string;
  stream?: string;
  offset?: number;
  data: Buffer;
  bytes?: number;
  exit?: Exit;
  /** started: the tool call's id and pid */
  id?: string;
  pid?: number;
  /** exit, fenced: the tool call's record */
  process?: Process;
}
export interface LogsOptions {
  follow?: boolean;
  stdoutOffset?: number;
  stderrOffset?: number;
  signal?: AbortSignal;
}
export interface LogStream extends AsyncIterable<Frame> {
  /** Where the stream stopped: read again from these when last is undefined. */
  stdoutOffset: number;
  stderrOffset: number;
  /** The frame that ended it: end, exit or fenced. */
  last: Frame | undefined;
  close(): void;
  readAll(): Promise<{ stdout: Buffer; stderr: Buffer }>;
  /** A tool call's: its id and pid (from its started frame, or attach's id) and, once over, its record. */
  id: string | undefined;
  pid: number | undefined;
  process: Process | undefined;
  /** A tool call's: reads to its exit or fenced frame; rejects with STREAM_LOST when cut before it. */
  wait(): Promise<{ process: Process; stdout: Buffer; stderr: Buffer }>;
}
/** The hand-off file at $SHIM_ABANDONED_FILE (api.Abandoned). */
export interface Abandoned {
  generation: number;
  previous_generation: number;
  state_before?: string;
  exit?: Exit;
  worktree?: string;
  snapshot_ref?: string;
  snapshot_commit?: string;
  baseline?: string;
  modified: number;
  added: number;
  deleted: number;
  local_commits: number;
  paths?: PathChange[];
  paths_truncated?: boolean;
  outside_paths?: string[];
  outside_paths_truncated?: boolean;
  /** "true", "false" or "unknown" */
  pushed: string;
  remote?: string;
  branch?: string;
  remote_commits?: number;
}

/**
 * A Client for the shim that spec names (Go's client.Connect): "unix:PATH",
 * or "vsock-uds:PATH:PORT", a hybrid vsock (Firecracker, Cloud Hypervisor:
 * the VMM's unix socket, then CONNECT PORT) to a guest whose shim runs
 * --listen vsock:PORT. Throws BAD_REQUEST for another spec.
 */
export declare function connect(spec: string, opts?: Omit<ClientOptions, "socketPath" | "runtimeDir">): Client;

export declare class Client {
  constructor(opts?: ClientOptions);
  readonly socketPath: string;
  timeoutMs: number | undefined;
  health(opts?: CallOptions): Promise<{ ok: boolean }>;
  status(opts?: CallOptions): Promise<Status>;
  start(req: StartRequest, opts?: CallOptions): Promise<StartResult>;
  fence(req: FenceRequest, opts?: CallOptions): Promise<FenceResult>;
  end(n: number, req?: EndRequest, opts?: CallOptions): Promise<FenceResult>;
  renew(n: number, req?: RenewRequest, opts?: CallOptions): Promise<RenewResult>;
  /** Resolves when opts.signal aborts; rejects with the first refusal (STALE_GENERATION, NOT_RUNNING, ...). */
  keepLease(n: number, leaseMs: number, opts?: { signal?: AbortSignal }): Promise<void>;
  register(req: RegisterRequest, opts?: CallOptions): Promise<Registration>;
  generations(labels?: Record<string, string>, opts?: CallOptions): Promise<Generation[]>;
  generation(n: number, opts?: CallOptions): Promise<Generation>;
  wait(n: number, opts?: CallOptions): Promise<Exit>;
  signal(n: number, signal: string, opts?: CallOptions & { all?: boolean }): Promise<{ generation: number; signal: string }>;
  snapshots(worktree?: string, opts?: CallOptions): Promise<SnapshotList>;
  snapshot(n: number, worktree?: string, opts?: CallOptions): Promise<Snapshot>;
  events(opts?: { signal?: AbortSignal; since?: number; instance?: string }): Promise<EventStream>;
  eventsSince(since: number, opts?: { signal?: AbortSignal; instance?: string }): Promise<EventStream>;
  logs(n: number, opts?: LogsOptions): Promise<LogStream>;
  exec(n: number, req: ExecRequest, opts?: { signal?: AbortSignal }): Promise<LogStream>;
  execDetached(n: number, req: ExecRequest, opts?: CallOptions): Promise<Process>;
  attach(n: number, id: string, opts?: LogsOptions): Promise<LogStream>;
  processes(n: number, opts?: CallOptions): Promise<Process[]>;
  process(n: number, id: string, opts?: CallOptions): Promise<Process>;
  signalProcess(n: number, id: string, signal: string, opts?: CallOptions & { all?: boolean }): Promise<{ generation: number; id: string; signal: string; all: boolean }>;
  writeStdin(n: number, id: string, data?: Buffer | string | null, opts?: CallOptions & { close?: boolean }): Promise<{ written: number; closed: boolean }>;
  resize(n: number, id: string, rows: number, cols: number, opts?: CallOptions): Promise<{ rows: number; cols: number }>;
}
