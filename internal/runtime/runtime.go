// Package runtime orchestrates generations: it announces them, fences the
// older ones through an ordered pipeline (freeze, cut, kill, restore, start),
// persists the fencing token, writes the audit log, and serves the control
// API. The other internal packages each do one step; this one decides.
package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/creds"
	"github.com/shimdev/shim/internal/gitguard"
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
	Subnet         string        // link-local range for isolated networks
	KeepSnapshots  int           // abandoned refs kept per worktree; 0 = all
	Placement      string        // "auto" (default), "clone" or "stub": how a child enters its cgroup
	Version        string
}

// Runtime is the generation state machine.
type Runtime struct {
	cfg    Config
	log    hclog.Logger
	audit  *auditLog
	events *events
	broker *creds.Broker
	launch launcher

	// announce serialises announcements (start and fence): exactly one
	// fences and starts at a time; the others then see its outcome.
	announce sync.Mutex

	mu           sync.Mutex // guards everything below
	st           persisted
	gens         map[uint64]*generation // started and not yet fenced
	current      *generation
	starting     uint64 // the generation being launched: current in all but name
	fencing      bool
	shuttingDown bool
	guards       map[string]*gitguard.Guard
	guardOpts    map[string]guardOpts
	peers        map[int]int // pids of connected control peers (spared by a pidns sweep)
	gitSeq       uint64
}

// generation is one live generation.
type generation struct {
	n       uint64
	spec    api.StartRequest
	group   cgroup.Group
	net     *creds.Network
	proc    *reaper.Process // nil for a generation recovered after a restart
	pid     int
	started time.Time
	dir     string

	baseline string        // resolved baseline of its worktree
	fenced   bool          // set before the kill, so the exit record says so
	emptied  bool          // its cgroup was confirmed empty and removed (a retried fence skips to restore)
	exit     *api.Exit     // set once the harness is reaped
	exited   chan struct{} // closed when exit is set
}

func (g *generation) running() bool { return g.proc != nil && g.exit == nil }

// New loads state.json, opens the audit log, and adopts generation cgroups a
// previous shim left behind, so the next announcement fences them too.
func New(cfg Config) (*Runtime, error) {
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
	audit, err := openAudit(filepath.Join(cfg.RuntimeDir, "audit.jsonl"))
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	rt := &Runtime{
		cfg: cfg, log: cfg.Log, audit: audit, events: newEvents(), st: st,
		gens: map[uint64]*generation{}, guards: map[string]*gitguard.Guard{}, guardOpts: map[string]guardOpts{}, peers: map[int]int{},
	}
	rt.launch = newLauncher(cfg, rt.log)
	if err := rt.adoptLeftovers(); err != nil {
		audit.Close()
		return nil, err
	}
	rt.audit.Record("shim_started", 0, map[string]any{
		"highest": st.Highest, "mode": string(cfg.Cgroups.Mode()), "pid": os.Getpid(), "version": cfg.Version,
	}, true)
	return rt, nil
}

// adoptLeftovers turns gen-N cgroups found at start into live generations.
// A shim restarted outside a fresh pid namespace may find the old harness
// still running there; it must not be forgotten.
func (rt *Runtime) adoptLeftovers() error {
	names, err := rt.cfg.Cgroups.List()
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
			grp, err := rt.cfg.Cgroups.Open(name)
			if err != nil {
				return err
			}
			live := rt.st.Live[n]
			g := &generation{n: n, group: grp, pid: live.Pid, baseline: live.Baseline, exited: make(chan struct{}),
				dir: rt.genDir(n)}
			g.spec.Worktree = live.Worktree
			g.spec.Generation = n
			rt.gens[n] = g
			rt.log.Warn("adopted a generation left by a previous shim; it is fenced at the next announcement", "generation", n)
			rt.audit.Record("generation_adopted", n, map[string]any{"cgroup": grp.Path()}, true)
		case strings.HasPrefix(name, "git-"), strings.HasPrefix(name, "tmp-"):
			// A throwaway cgroup of a previous shim: nothing of value runs there.
			if grp, err := rt.cfg.Cgroups.Open(name); err == nil {
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
		g := &generation{n: n, pid: live.Pid, baseline: live.Baseline, exited: make(chan struct{}),
			dir: rt.genDir(n), emptied: true}
		g.spec.Worktree, g.spec.Generation = live.Worktree, n
		rt.gens[n] = g
		rt.log.Warn("a generation was ended without its worktree restored; the next fence restores it", "generation", n)
		rt.audit.Record("generation_adopted", n, map[string]any{"restore_pending": true}, true)
	}
	return nil
}

// SetBroker attaches the credential broker (created by shim init on cred.sock).
func (rt *Runtime) SetBroker(b *creds.Broker) { rt.broker = b }

// Close releases the audit log.
func (rt *Runtime) Close() error { return rt.audit.Close() }

func (rt *Runtime) genDir(n uint64) string {
	return filepath.Join(rt.cfg.RuntimeDir, "gen", strconv.FormatUint(n, 10))
}

func (rt *Runtime) statePath() string { return filepath.Join(rt.cfg.RuntimeDir, "state.json") }

// saveLocked persists state; rt.mu held.
func (rt *Runtime) saveLocked() error {
	rt.st.Live = map[uint64]liveRecord{}
	for n, g := range rt.gens {
		rt.st.Live[n] = liveRecord{Worktree: g.spec.Worktree, Baseline: g.baseline, Pid: g.pid}
	}
	if err := rt.st.save(rt.statePath()); err != nil {
		return api.Errorf(api.CodeInternal, "persist state.json: %v", err)
	}
	return nil
}

// specHash identifies an announcement for retries. Secrets are left out, so
// state.json holds nothing derived from one; a retry that differs only in a
// secret counts as the same announcement.
func specHash(req api.StartRequest) string {
	req.Credentials = append([]api.Credential(nil), req.Credentials...)
	for i := range req.Credentials {
		req.Credentials[i].Password = ""
	}
	b, _ := json.Marshal(req)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Status reports the state machine.
func (rt *Runtime) Status() api.Status {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	s := api.Status{
		Generation: rt.st.Highest,
		State:      rt.stateLocked(),
		Mode:       string(rt.cfg.Cgroups.Mode()),
		ModeReason: rt.cfg.Cgroups.Reason(),
		ShimPid:    os.Getpid(),
		Subreaper:  os.Getpid() != 1,
		CgroupRoot: rt.cfg.Cgroups.Root(),
		RuntimeDir: rt.cfg.RuntimeDir,
		Error:      rt.st.Failed,
		Orphans:    rt.cfg.Reaper.Orphans(),
		Version:    rt.cfg.Version,
	}
	if g := rt.current; g != nil {
		rec := rt.recordLocked(g)
		s.Current = &rec
		if g.running() {
			s.Pid = g.pid
		}
	}
	ns := make([]uint64, 0, len(rt.gens))
	for n := range rt.gens {
		ns = append(ns, n)
	}
	sort.Slice(ns, func(i, j int) bool { return ns[i] < ns[j] })
	for _, n := range ns {
		s.Live = append(s.Live, rt.recordLocked(rt.gens[n]))
	}
	return s
}

func (rt *Runtime) stateLocked() string {
	switch {
	case rt.fencing:
		return api.StateFencing
	case rt.st.Failed != nil:
		return api.StateFailed
	case rt.current != nil && rt.current.running():
		return api.StateRunning
	case rt.current != nil:
		return api.StateExited
	}
	return api.StateIdle
}

func (rt *Runtime) recordLocked(g *generation) api.Generation {
	rec := api.Generation{
		Generation: g.n, Pid: g.pid, Command: g.spec.Command, StartedAt: g.started, Exit: g.exit,
		Worktree: g.spec.Worktree, Network: g.spec.Network, Labels: g.spec.Labels,
		Stdout: filepath.Join(g.dir, "stdout"), Stderr: filepath.Join(g.dir, "stderr"),
	}
	if g.group != nil {
		rec.Cgroup = g.group.Path()
	}
	switch {
	case g.proc == nil:
		rec.State = "adopted" // left by a previous shim; fenced at the next announcement
	case g.fenced:
		rec.State = "fenced"
	case g.running():
		rec.State = api.StateRunning
	default:
		rec.State = api.StateExited
	}
	return rec
}

// Generation returns one generation's record, live or from its directory.
func (rt *Runtime) Generation(n uint64) (api.Generation, error) {
	rt.mu.Lock()
	if g, ok := rt.gens[n]; ok {
		defer rt.mu.Unlock()
		return rt.recordLocked(g), nil
	}
	rt.mu.Unlock()
	var rec api.Generation
	if err := readJSON(filepath.Join(rt.genDir(n), "generation.json"), &rec); err != nil {
		return rec, api.Errorf(api.CodeNotFound, "generation %d is not known here", n)
	}
	rec.State = "fenced"
	var exit api.Exit
	if readJSON(filepath.Join(rt.genDir(n), "exit.json"), &exit) == nil {
		rec.Exit = &exit
		if !exit.Fenced {
			rec.State = api.StateExited
		}
	}
	return rec, nil
}

// Wait blocks until generation n's harness has exited and returns its record.
func (rt *Runtime) Wait(ctx context.Context, n uint64) (api.Exit, error) {
	rt.mu.Lock()
	g, ok := rt.gens[n]
	rt.mu.Unlock()
	if ok && g.proc == nil {
		return api.Exit{}, api.Errorf(api.CodeNotRunning, "generation %d was left by a previous shim; its exit status is unknown", n)
	}
	if ok {
		select {
		case <-g.exited:
			rt.mu.Lock()
			defer rt.mu.Unlock()
			return *g.exit, nil
		case <-ctx.Done():
			return api.Exit{}, ctx.Err()
		}
	}
	var exit api.Exit
	if err := readJSON(filepath.Join(rt.genDir(n), "exit.json"), &exit); err != nil {
		return exit, api.Errorf(api.CodeNotFound, "generation %d has no exit record", n)
	}
	return exit, nil
}

// Subscribe streams events until the returned function is called.
func (rt *Runtime) Subscribe() (<-chan api.Event, func()) { return rt.events.subscribe() }

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
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
