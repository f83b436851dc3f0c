// Package runtime orchestrates generations: it admits announcements, fences
// the older generations through the ordered pipeline of fence.go (freeze,
// cut, kill, persist, restore) and starts the new one (step 5), persists the
// fencing token, writes the audit log, and serves the control API. The other
// internal packages each do one step; this one decides.
package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/errs"
	"github.com/shimdev/shim/internal/layers"
	"github.com/shimdev/shim/internal/reaper"
)

// Config is everything the runtime needs from shim init.
type Config struct {
	RuntimeDir     string
	Cgroups        *cgroup.Manager
	Reaper         *reaper.Reaper
	Log            hclog.Logger
	ShimPath       string        // this binary: the placement stub and the credential helper
	AllowUIDs      []int         // control-socket peers allowed besides root
	FreezeTimeout  time.Duration // how long the kernel may take to confirm a freeze
	KillTimeout    time.Duration // how long a killed generation may take to empty
	RestoreTimeout time.Duration // how long save+restore of a worktree may take
	GitTimeout     time.Duration // how long any one git shim runs may take
	Subnet         string        // link-local range for isolated networks
	KeepSnapshots  int           // abandoned refs kept per worktree (pruned in batches of a tenth); 0 = all
	// KeepGenerations and KeepBytes bound the per-generation records
	// (gen/<N>/) by count and bytes (retention.go); 0 = no bound.
	KeepGenerations int
	KeepBytes       int64
	// AuditMaxBytes rotates audit.jsonl past this size (0 is
	// DefaultAuditMaxBytes, negative never); AuditKeep rotated files are
	// kept (0 is DefaultAuditKeep).
	AuditMaxBytes int64
	AuditKeep     int
	Placement     string // "auto" (default), "clone" or "stub": how a child enters its cgroup
	Version       string
	// ExitGrace is how long what a harness left running may go on after
	// the harness exited before it is killed (credentials and network are
	// cut at the exit). 0 is DefaultExitGrace.
	ExitGrace time.Duration
	// LogMax caps each generation's stdout and stderr files (bytes); the
	// rest is dropped and counted. 0 is DefaultLogMax, negative unlimited.
	LogMax int64
	// ExecOutputMax caps each tool call's stdout and stderr files
	// (gen/<N>/proc/<K>/); the rest is dropped and counted. 0 is
	// DefaultExecOutputMax, negative unlimited.
	ExecOutputMax int64
	// DefaultLimits apply to every generation whose announcement sets no
	// limit of that kind, where the controller is available (silently
	// skipped where it is not, and reported in the generation's record).
	DefaultLimits cgroup.Limits
	// Reserve is the space (bytes) kept in the runtime dir's filesystem
	// for state.json and the audit log. 0 is DefaultReserve, negative none.
	Reserve int64
	// LayersReserve is the space (bytes) kept in the layers dir's
	// filesystem for the fences' own writes (a snapshot's objects, a
	// layer's marker) that no harness can take, given up at a fence when
	// a harness left less room than that. 0 is DefaultLayersReserve,
	// negative none.
	LayersReserve int64
	// Layers gives every generation its own copy-on-write layers where the
	// sandbox allows (probed at start); nil is isolation "scan".
	Layers *layers.Layers
	// RequireIsolation refuses every announcement when generations cannot
	// get layers (as StartRequest.RequireIsolation does for one).
	RequireIsolation bool
	// EventsKept is how many events are kept for GET /v1/events?since=
	// (0 is DefaultEventsKept).
	EventsKept int
	// CopyOutput, when set, gets a copy of every harness's output, each
	// line prefixed with its generation (shim init --copy-output: shim's
	// stdout, for docker logs). Bounded: see copyout.go.
	CopyOutput *CopyOutput
}

// Defaults of Config.
const (
	DefaultExitGrace = 2 * time.Second
	DefaultLogMax    = 64 << 20
	// DefaultExecOutputMax caps each tool call's stdout and stderr.
	DefaultExecOutputMax = 16 << 20
	DefaultReserve       = 8 << 20
	// DefaultLayersReserve is room for a snapshot of a few thousand
	// changed files (their objects compressed) and the layers' markers.
	DefaultLayersReserve = 64 << 20
	// DefaultAuditMaxBytes and DefaultAuditKeep bound the audit log to
	// 64 MiB: a fence writes about 2 KiB, so that is tens of thousands of
	// fences, and reading it all for the token's floor at start takes a
	// fraction of a second.
	DefaultAuditMaxBytes = 16 << 20
	DefaultAuditKeep     = 3
)

// Runtime is the generation state machine.
type Runtime struct {
	cfg     Config
	log     hclog.Logger
	audit   *auditLog
	events  *events
	groups  groups
	launch  starter
	layers  layerSet // nil: isolation scan (Config.Layers)
	reserve *reserve
	// layersReserve is the layers dir's (Config.LayersReserve): taken at
	// the first layered start, once the layers dir is laid out.
	layersReserve *reserve

	// announce serialises announcements (start, fence): exactly one fences
	// and starts at a time; the others then see its outcome. Every wait
	// under it is bounded (freeze, kill and git deadlines), and Shutdown
	// cancels the one in flight.
	announce sync.Mutex
	// released: the mount namespaces answered announcements let go of,
	// still being let go of in the background (heldMounts); a restore
	// that moves a lower waits for all of them first.
	released releasing
	// maint: the background maintenance between fences (maintain.go).
	maint maintenance

	mu sync.Mutex // guards every field below, and the guarded fields of each generation
	// highest is the fencing token as the runtime enforces it: raised at
	// admission, before anything is frozen. st.Highest is its durable
	// copy, written once the old generations are dead.
	highest uint64
	st      persisted
	broker  credBroker             // nil until SetBroker
	iso     api.Isolation          // decided by the launcher's probe
	weak    []api.Weakness         // decided by the launcher's probe, before iso
	gens    map[uint64]*generation // every generation not yet fenced
	current *generation            // the latest started one (nil after it is fenced)
	// starting is the generation being launched: its harness may ask the
	// broker before Start has made it current.
	starting       uint64
	fencing        bool               // a fence is freezing, cutting, killing or restoring
	shuttingDown   bool               // Shutdown began: nothing new is admitted
	cancelAnnounce context.CancelFunc // ends the announcement in flight
	worktrees      map[string]worktree
	worktreeOpts   map[string]worktreeOpts
	baselines      map[string]string // worktree -> the baseline its latest generation started from
	sealed         map[string]bool   // layered worktrees whose packs this shim sealed before a start (SealPacks)
	peers          map[int]int       // pids of connected control peers (spared by a pidns sweep)
	gitSeq         uint64            // names the throwaway git-<n> cgroups
	gitGrants      map[string]uint64 // git cgroup name -> broker key of shim's own fetch
	fetchKey       uint64            // the broker key of the latest fetch still in progress (0: none); each git is bound by its own (envFetchGrant)
	fetchSeq       uint64
	history        bool // the runtime dir held generations when shim started
}

// New loads state.json, opens the audit log, and adopts generation cgroups a
// previous shim left behind, so the next announcement fences them too.
func New(cfg Config) (*Runtime, error) {
	cfg = withDefaults(cfg)
	if err := os.MkdirAll(filepath.Join(cfg.RuntimeDir, "gen"), 0o700); err != nil {
		return nil, fmt.Errorf("runtime dir: %w", err)
	}
	// cred.sock must be reachable by harness uids: the dir is traversable.
	// A dir the user made is left as it is (a start whose harness cannot
	// reach cred.sock is refused with a message naming it).
	if st, err := os.Stat(cfg.RuntimeDir); err == nil && st.Mode().Perm()&0o011 == 0 {
		if err := os.Chmod(cfg.RuntimeDir, st.Mode().Perm()|0o711); err != nil {
			return nil, fmt.Errorf("runtime dir: %w", err)
		}
	}
	st, err := loadState(filepath.Join(cfg.RuntimeDir, "state.json"))
	if err != nil {
		return nil, err
	}
	if st, err = withHistoryFloor(cfg.RuntimeDir, st); err != nil {
		return nil, err
	}
	res, err := newReserve(filepath.Join(cfg.RuntimeDir, "reserve"), cfg.Reserve)
	if err != nil {
		return nil, fmt.Errorf("cannot keep %d bytes free in the runtime dir %s for the fencing token (%w): free space there, or lower --reserve", cfg.Reserve, cfg.RuntimeDir, err)
	}
	audit, err := openAudit(filepath.Join(cfg.RuntimeDir, "audit.jsonl"), res)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	audit.rotateAt(cfg.AuditMaxBytes, cfg.AuditKeep, st.Highest)
	rt := newRuntime(cfg, st, audit, cfg.Cgroups, nil)
	rt.reserve = res
	if rt.layers != nil {
		rt.layersReserve = &reserve{path: filepath.Join(rt.layers.Dir(), "reserve"), size: cfg.LayersReserve}
	}
	rt.launch = newLauncher(rt)
	if err := rt.adoptLeftovers(); err != nil {
		audit.Close()
		return nil, err
	}
	if err := rt.audit.Record("shim_started", 0, map[string]any{
		"highest": st.Highest, "mode": string(cfg.Cgroups.Mode()), "pid": os.Getpid(), "version": cfg.Version,
	}, true); err != nil {
		audit.Close()
		return nil, err
	}
	return rt, nil
}

func withDefaults(cfg Config) Config {
	if cfg.Log == nil {
		cfg.Log = hclog.NewNullLogger()
	}
	if cfg.FreezeTimeout == 0 {
		cfg.FreezeTimeout = 5 * time.Second
	}
	if cfg.KillTimeout == 0 {
		cfg.KillTimeout = 10 * time.Second
	}
	if cfg.RestoreTimeout == 0 {
		cfg.RestoreTimeout = 5 * time.Minute
	}
	if cfg.GitTimeout == 0 {
		cfg.GitTimeout = 60 * time.Second
	}
	if cfg.ExitGrace == 0 {
		cfg.ExitGrace = DefaultExitGrace
	}
	if cfg.ExecOutputMax == 0 {
		cfg.ExecOutputMax = DefaultExecOutputMax
	}
	if cfg.LogMax == 0 {
		cfg.LogMax = DefaultLogMax
	}
	if cfg.Reserve == 0 {
		cfg.Reserve = DefaultReserve
	}
	if cfg.LayersReserve == 0 {
		cfg.LayersReserve = DefaultLayersReserve
	}
	if cfg.AuditMaxBytes == 0 {
		cfg.AuditMaxBytes = DefaultAuditMaxBytes
	}
	if cfg.AuditKeep <= 0 {
		cfg.AuditKeep = DefaultAuditKeep
	}
	cfg.AuditKeep = min(cfg.AuditKeep, maxRotated)
	return cfg
}

// newRuntime builds the state machine around its parts (New with the real
// ones, the unit tests with fakes).
func newRuntime(cfg Config, st persisted, audit *auditLog, g groups, launch starter) *Runtime {
	rt := &Runtime{
		cfg: cfg, log: cfg.Log, audit: audit, events: newEvents(cfg.EventsKept), groups: g, launch: launch,
		st: st, highest: st.Highest,
		gens: map[uint64]*generation{}, worktrees: map[string]worktree{}, worktreeOpts: map[string]worktreeOpts{}, baselines: map[string]string{}, sealed: map[string]bool{},
		peers: map[int]int{}, gitGrants: map[string]uint64{},
	}
	if cfg.Layers != nil { // a nil *layers.Layers in the interface would not be nil
		rt.layers = cfg.Layers
	}
	if ents, err := os.ReadDir(filepath.Join(cfg.RuntimeDir, "gen")); err == nil && len(ents) > 0 {
		rt.history = true
	}
	return rt
}

// adoptLeftovers turns gen-N cgroups found at start into live generations.
// A shim restarted outside a fresh pid namespace may find the old harness
// still running there; it must not be forgotten.
func (rt *Runtime) adoptLeftovers() error {
	names, err := rt.groups.List()
	if err != nil {
		return fmt.Errorf("list generation cgroups: %w", err)
	}
	for _, name := range names {
		switch {
		case strings.HasPrefix(name, "gen-"):
			n, err := strconv.ParseUint(strings.TrimPrefix(name, "gen-"), 10, 64)
			if err != nil {
				continue
			}
			grp, err := rt.groups.Open(name)
			if err != nil {
				return err
			}
			if p, perr := grp.Populated(); perr == nil && !p && grp.Remove() == nil {
				// Nothing of it runs (it died with the previous shim, PID 1
				// of its pid namespace, or with the sandbox): it is not
				// taken for running. Its cgroup is gone now (one that cannot
				// be removed is adopted as before, and the fence removes
				// it); a worktree it had is restored at the next
				// announcement (below).
				if live, ok := rt.st.Live[n]; ok && live.Worktree != "" {
					rt.adopted(n, stEmptied).lost = true
				}
				rt.log.Warn("a generation left by a previous shim has no process left", "generation", n)
				if err := rt.audit.Record("generation_adopted", n, map[string]any{"gone": true}, true); err != nil {
					return err
				}
				continue
			}
			g := rt.adopted(n, stAdopted)
			g.group = grp
			rt.log.Warn("adopted a generation left by a previous shim; it is fenced at the next announcement", "generation", n)
			if err := rt.audit.Record("generation_adopted", n, map[string]any{"cgroup": grp.Path()}, true); err != nil {
				return err
			}
		case strings.HasPrefix(name, "git-"), strings.HasPrefix(name, "tmp-"):
			// A throwaway cgroup of a previous shim: nothing of value runs there.
			if grp, err := rt.groups.Open(name); err == nil {
				ctx, cancel := context.WithTimeout(context.Background(), rt.cfg.KillTimeout)
				_, kerr := grp.Kill(ctx)
				cancel()
				if kerr == nil {
					grp.Remove()
				}
			}
		}
	}
	// A generation whose cgroup is gone but which state.json still lists was
	// killed (by this shim before a crash, or with the sandbox) and never
	// restored: its worktree still holds its edits. The next fence saves
	// and restores them.
	for n, live := range rt.st.Live {
		if _, ok := rt.gens[n]; ok || live.Worktree == "" {
			continue
		}
		rt.adopted(n, stEmptied).lost = true
		rt.log.Warn("a generation was ended without its worktree restored; the next fence restores it", "generation", n)
		if err := rt.audit.Record("generation_adopted", n, map[string]any{"restore_pending": true}, true); err != nil {
			return err
		}
	}
	return nil
}

// adopted records generation n, known only from what a previous shim left.
func (rt *Runtime) adopted(n uint64, state genState) *generation {
	live := rt.st.Live[n]
	g := &generation{n: n, pid: live.Pid, baseline: live.Baseline, state: state, dir: rt.genDir(n),
		exited: make(chan struct{}), quiet: make(chan struct{})}
	g.spec.Worktree, g.spec.Generation = live.Worktree, n
	if d, err := leaseOf(live.LeaseMS); err == nil && d > 0 && state == stAdopted {
		// Whoever supervised it must renew it with this shim, or it is
		// suspended like any other; one the previous shim suspended (still
		// frozen) stays so until a renewal.
		rt.armLeaseLocked(g, d)
		if live.Suspended {
			g.state = stSuspended
			g.lease.resumeTo, g.lease.rec.Suspended = stAdopted, true
		}
	}
	rt.gens[n] = g
	if n > rt.highest {
		rt.highest = n
	}
	return g
}

// SetBroker attaches the credential broker (created by shim init on cred.sock).
func (rt *Runtime) SetBroker(b credBroker) {
	rt.mu.Lock()
	rt.broker = b
	rt.mu.Unlock()
}

// credBroker is the broker, nil before SetBroker.
func (rt *Runtime) credBroker() credBroker {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.broker
}

// Close releases the audit log.
func (rt *Runtime) Close() error { return rt.audit.Close() }

func (rt *Runtime) genDir(n uint64) string {
	return filepath.Join(rt.cfg.RuntimeDir, "gen", strconv.FormatUint(n, 10))
}

func (rt *Runtime) statePath() string { return filepath.Join(rt.cfg.RuntimeDir, "state.json") }

// saveLocked persists state; rt.mu held. Out of space, it gives up the
// reserve and tries once more: the fencing token must not depend on what a
// harness left on the runtime dir's filesystem.
func (rt *Runtime) saveLocked() error { return rt.saveWithLocked(nil) }

// saveWithLocked writes state.json and the records put in records (nil:
// none) in one fsync batch (durableBatch): they depend on nothing in one
// another, and what depends on them (an audit record) is written after it
// returns. It fails (TOKEN_NOT_PERSISTED) only when state.json is not
// durable; a record of the batch that is not is logged. rt.mu held.
func (rt *Runtime) saveWithLocked(records *durableBatch) error {
	rt.st.Live = map[uint64]liveRecord{}
	for n, g := range rt.gens {
		rec := liveRecord{Worktree: g.spec.Worktree, Baseline: g.baseline, Pid: g.pid}
		if g.lease != nil {
			rec.LeaseMS = g.lease.dur.Milliseconds()
			rec.Suspended = g.state == stSuspended
		}
		rt.st.Live[n] = rec
	}
	b, err := json.MarshalIndent(&rt.st, "", "  ")
	if err != nil {
		return errs.New(api.CodeTokenNotPersisted, "persist state.json: %v", err)
	}
	if records == nil {
		records = &durableBatch{}
	}
	records.put(rt.statePath(), b, 0o600)
	// Only state.json may spend the reserve: the records beside it are
	// not the token.
	if err := rt.reserve.retry(func() error {
		if err := records.commit(); err != nil {
			rt.log.Warn("records not written", "error", err)
		}
		return records.errorOf(rt.statePath())
	}); err != nil {
		return errs.New(api.CodeTokenNotPersisted, "persist state.json: %v", err)
	}
	return nil
}

// specHash identifies an announcement for retries. Secrets are left out, so
// state.json holds nothing derived from one; a retry that differs only in a
// secret counts as the same announcement.
func specHash(req api.StartRequest) string {
	req.Credentials = append([]api.Credential(nil), req.Credentials...)
	req.RequireIsolation = false // a precondition, not what runs
	req.IfCurrent = nil
	req.LeaseMS = 0 // supervision, not what runs: a retry renews it
	for i := range req.Credentials {
		req.Credentials[i].Password = ""
	}
	b, _ := json.Marshal(req)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// writeJSON writes a small record file atomically.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	// A generation's records are what a restarted shim (and a person)
	// learns what happened from: synced like state.json.
	return writeDurable(path, append(b, '\n'), 0o644)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
