package runtime

import (
	"fmt"
	"sync"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/layers"
)

// genState is where a generation is in its life. It is the one field that
// says so: every change goes through transition, which refuses any change
// the table below does not allow (runc's libcontainer state model).
//
//	             suspended (lease ran out; renewal: back)
//	                ▲ │ └─────────────┐
//	starting ─▶ running ─▶ exited ─▶ quiesced ──────┐
//	   │           │          │                      ▼
//	   └───────────┴──────────┴─▶ fencing ─────▶ emptied ─▶ fenced
//	adopted ───────────────────▶    │   ▲          │ (restore failed:
//	(⇄ suspended)                   ▼   │          ◀┘  stays emptied)
//	                               failed
type genState int

const (
	// stStarting: its cgroup exists and its harness is being launched.
	stStarting genState = iota
	// stRunning: its harness runs.
	stRunning
	// stExited: its harness exited on its own; its credentials are revoked
	// and its network cut, and what it left behind lingers until the exit
	// grace ends (or the next announcement, with linger).
	stExited
	// stQuiesced: its harness exited and everything else it started was
	// killed; its worktree waits for the next announcement's restore.
	stQuiesced
	// stAdopted: left by a previous shim, cgroup still present; fenced at
	// the next announcement.
	stAdopted
	// stFencing: a fence is freezing, cutting or killing it.
	stFencing
	// stEmptied: confirmed empty and its cgroup removed; its worktree is
	// not restored yet (the restore failed, or is about to run).
	stEmptied
	// stFenced: gone, worktree restored. Terminal.
	stFenced
	// stFailed: a fence could not confirm freeze, cut or kill. It is
	// still fenced (frozen where the freeze held, never answered by the
	// broker); the next announcement retries from the freeze.
	stFailed
	// stSuspended: its lease ran out: frozen and cut (the broker refuses
	// it, its connections were aborted), not killed. A renewal puts it
	// back (running, or adopted); a fence ends it as any other.
	stSuspended
)

var stateNames = [...]string{
	stStarting: "starting", stRunning: "running", stExited: "exited", stQuiesced: "quiesced",
	stAdopted: "adopted", stFencing: "fencing", stEmptied: "emptied", stFenced: "fenced", stFailed: "failed",
	stSuspended: "suspended",
}

func (s genState) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("genState(%d)", int(s))
}

// allowed is the transition table: from each state, where it may go.
var allowed = map[genState][]genState{
	stStarting:  {stRunning, stFencing},
	stRunning:   {stExited, stFencing, stSuspended},
	stExited:    {stQuiesced, stFencing},
	stQuiesced:  {stEmptied},
	stAdopted:   {stFencing, stSuspended},
	stSuspended: {stRunning, stAdopted, stExited, stFencing},
	stFencing:   {stEmptied, stFailed},
	stEmptied:   {stFenced, stEmptied},
	stFailed:    {stFencing},
	stFenced:    {},
}

// stateTransitionError is a transition the table does not allow: a bug in
// the runtime, never a harness's doing.
type stateTransitionError struct{ from, to genState }

func (e *stateTransitionError) Error() string {
	return fmt.Sprintf("generation state: %s -> %s is not a valid transition", e.from, e.to)
}

func (e *stateTransitionError) Code() string { return api.CodeInternal }

// canTransition reports whether from may become to.
func canTransition(from, to genState) bool {
	for _, s := range allowed[from] {
		if s == to {
			return true
		}
	}
	return false
}

// generation is one generation shim knows of and has not finished fencing.
type generation struct {
	// Immutable once the generation is in Runtime.gens.
	n       uint64
	spec    api.StartRequest
	group   cgroup.Group // nil: adopted after its cgroup was already gone
	net     genNetwork   // nil in host mode and for adopted generations
	proc    process      // nil for a generation adopted from a previous shim
	pid     int
	started time.Time
	dir     string
	out     *outputs      // the harness's capped stdout and stderr; nil when adopted
	layers  *layers.Plan  // its copy-on-write layers; nil in isolation scan and when adopted
	exited  chan struct{} // closed once exit is set (never, when adopted)
	quiet   chan struct{} // closed once nothing of it acts any more: killed after exit, or fenced
	mounts  *heldMounts   // its mount namespace, held open; nil without layers
	lost    bool          // adopted with no process left: its exit is unknown (api.GenGone)
	calls   *calls        // its tool calls (exec.go); nil when adopted

	// Guarded by Runtime.mu.
	state    genState
	baseline string      // the commit its worktree started from
	exit     *api.Exit   // set once its harness was reaped
	quietSet bool        // quiet is closed
	lease    *leaseState // nil: announced without a lease

	// leaseMu is held by a lease's suspension and by a renewal for all
	// they do, so the two never interleave (lease.go).
	leaseMu sync.Mutex
}

// transition moves g to state to, or refuses with a stateTransitionError.
// Runtime.mu must be held.
func (g *generation) transition(to genState) error {
	if !canTransition(g.state, to) {
		return &stateTransitionError{from: g.state, to: to}
	}
	g.state = to
	return nil
}

// move is transition where the caller has just checked the state, so the
// model allows the move by construction: a refusal is a bug of shim,
// logged and audited, never a panic in PID 1; the state stays as it was.
// Runtime.mu must be held.
func (rt *Runtime) move(g *generation, to genState) {
	if err := g.transition(to); err != nil {
		rt.log.Error("a generation state transition the model refuses (a bug of shim)", "generation", g.n, "error", err)
		_ = rt.audit.Record("state_bug", g.n, map[string]any{"error": err.Error()}, false)
	}
}

// running reports whether its harness is still running. Runtime.mu held.
func (g *generation) running() bool {
	return g.proc != nil && g.exit == nil && (g.state == stRunning || g.state == stStarting)
}

// markQuiet closes quiet once. Runtime.mu held.
func (g *generation) markQuiet() {
	if !g.quietSet {
		g.quietSet = true
		close(g.quiet)
	}
}

// apiState is the generation's state as the API reports it in a record.
func (g *generation) apiState() string {
	switch g.state {
	case stStarting, stRunning:
		return api.StateRunning
	case stExited, stQuiesced:
		return api.StateExited
	case stAdopted:
		return api.GenAdopted
	case stFencing:
		return api.StateFencing
	case stEmptied, stFenced:
		if g.lost {
			return api.GenGone
		}
		return api.GenFenced
	case stFailed:
		return api.StateFailed
	case stSuspended:
		return api.StateSuspended
	}
	return g.state.String()
}
