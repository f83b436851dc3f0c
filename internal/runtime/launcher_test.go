package runtime

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/layers"
	"github.com/shimdev/shim/internal/reaper"
	"golang.org/x/sys/unix"
)

// The real launcher (launch.go, git.go) on fake cgroups and fake layers,
// with a real reaper and real child processes run as whoever runs the
// tests: the placement stub is this test binary (TestMain), so no root is
// needed and nothing leaves the test's temporary directories.

func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case StubArg:
			os.Exit(RunStub(os.Args[2:]))
		case ProbeArg:
			os.Exit(0)
		case HoldArg:
			os.Exit(RunHold())
		case layers.StubArg:
			os.Exit(2) // a layer stub that refuses: no test mounts anything
		}
	}
	os.Exit(m.Run())
}

// dirGroup is a fake cgroup whose path is a real directory (the cgroup2
// id is its inode number). The processes placed in it (Add: the stub
// path) are tracked by pidfd, taken while they wait to be released, so
// Kill kills them, and its tool calls' groups, and never another
// process that got a reused pid.
type dirGroup struct {
	*fakeGroup
	path     string
	pmu      sync.Mutex
	pidfds   []int
	children []*dirGroup
}

func (g *dirGroup) Path() string { return g.path }

func (g *dirGroup) Add(pid int) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return err
	}
	g.pmu.Lock()
	g.pidfds = append(g.pidfds, fd)
	g.pmu.Unlock()
	return nil
}

func (g *dirGroup) Kill(ctx context.Context) (cgroup.KillResult, error) {
	res, err := g.fakeGroup.Kill(ctx)
	if err == nil {
		g.killAll()
	}
	return res, err
}

// killAll kills what was placed in g and its children.
func (g *dirGroup) killAll() {
	g.pmu.Lock()
	fds, kids := g.pidfds, g.children
	g.pidfds = nil
	g.pmu.Unlock()
	for _, fd := range fds {
		unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		unix.Close(fd)
	}
	for _, k := range kids {
		k.killAll()
	}
}

// childGroup is callGroup on dirGroups: a tool call's group below its
// generation's, killed with it.
func childGroup(parent cgroup.Group, name string) (cgroup.Group, error) {
	p, ok := parent.(*dirGroup)
	if !ok {
		return nil, errors.New("not a dirGroup")
	}
	path := filepath.Join(p.path, name)
	if err := os.Mkdir(path, 0o755); err != nil {
		return nil, err
	}
	c := &dirGroup{fakeGroup: &fakeGroup{name: p.name + "/" + name, j: p.j}, path: path}
	p.pmu.Lock()
	p.children = append(p.children, c)
	p.pmu.Unlock()
	return c, nil
}

// dirGroups is the cgroup manager of the launcher tests.
type dirGroups struct {
	j         *journal
	dir       string
	mode      cgroup.Mode
	mu        sync.Mutex
	made      map[string]*dirGroup
	createErr error
	onKill    func(name string)
	killErr   error // what Kill of the groups made from now returns
	vanish    bool  // Create makes no directory (the id cannot be read)
	leftKill  error // what Kill of a group left from an earlier attempt returns
}

func (m *dirGroups) Mode() cgroup.Mode { return m.mode }
func (m *dirGroups) Reason() string    { return "fake" }
func (m *dirGroups) Root() string      { return m.dir }
func (m *dirGroups) Create(name string, l cgroup.Limits) (cgroup.Group, error) {
	m.j.add("create %s mem=%d pids=%d", name, l.MemoryMax, l.PidsMax)
	if m.createErr != nil {
		return nil, m.createErr
	}
	p := filepath.Join(m.dir, name)
	g := &dirGroup{fakeGroup: &fakeGroup{name: name, j: m.j}, path: p}
	g.killErr = m.killErr
	if m.onKill != nil {
		g.onKill = func() { m.onKill(name) }
	}
	if !m.vanish {
		if err := os.MkdirAll(p, 0o700); err != nil {
			return nil, err
		}
	}
	m.mu.Lock()
	m.made[name] = g
	m.mu.Unlock()
	return g, nil
}

func (m *dirGroups) Open(name string) (cgroup.Group, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	g, ok := m.made[name]
	if !ok || g.removed {
		return nil, os.ErrNotExist
	}
	g.killErr = m.leftKill
	return g, nil
}

func (m *dirGroups) List() ([]string, error)      { return nil, nil }
func (m *dirGroups) GroupOf(int) (string, error)  { return "", nil }
func (m *dirGroups) Controllers() map[string]bool { return map[string]bool{"memory": true} }

func (m *dirGroups) group(name string) *dirGroup {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.made[name]
}

// launchFixture is a runtime whose starter is the real launcher.
type launchFixture struct {
	*fixture
	l      *launcher
	groups *dirGroups
	ly     *fakeLayers
}

func newLaunchFixture(t *testing.T, mode cgroup.Mode) *launchFixture {
	t.Helper()
	f := newFixture(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	rp := reaper.New()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { rp.Loop(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	m := &dirGroups{j: f.j, dir: t.TempDir(), mode: mode, made: map[string]*dirGroup{}}
	callGroup = childGroup
	t.Cleanup(func() {
		callGroup = cgroup.Child
		m.mu.Lock()
		for _, g := range m.made {
			g.killAll() // whatever a test left running
		}
		m.mu.Unlock()
		// Its exit is recorded in its directory: before the test's
		// directories go (the reaper still runs: its cleanup is later).
		f.rt.mu.Lock()
		var live []*generation
		for _, g := range f.rt.gens {
			if g.proc != nil {
				live = append(live, g)
			}
		}
		f.rt.mu.Unlock()
		for _, g := range live {
			<-g.exited
		}
	})
	f.rt.groups = m
	f.rt.cfg.Reaper, f.rt.cfg.ShimPath = rp, self
	f.rt.cfg.DefaultLimits = cgroup.Limits{MemoryMax: 1 << 30, PidsMax: 100}
	f.rt.iso.Mode = "scan"
	l := newLauncher(f.rt)
	// The start-up probes are the kernel's (CLONE_INTO_CGROUP, network
	// namespaces): decided here as where neither is allowed.
	l.once.Do(func() {})
	f.rt.launch = l
	return &launchFixture{fixture: f, l: l, groups: m}
}

// layered turns fake layers on for lf.
func (lf *launchFixture) layered() *fakeLayers {
	lf.ly = lf.withLayers()
	return lf.ly
}

func (lf *launchFixture) req(n uint64, cmd ...string) api.StartRequest {
	if len(cmd) == 0 {
		cmd = []string{"/bin/sh", "-c", "echo out; echo err >&2"}
	}
	return api.StartRequest{Generation: n, Command: cmd, Network: api.NetworkHost}
}

// wait waits for g's harness to exit and its output to be copied.
func waitExit(t *testing.T, g *generation) reaper.Exit {
	t.Helper()
	p := g.proc.(*reaper.Process)
	e, err := p.Wait(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	g.out.wait(time.Minute)
	return e
}

// A start in each placement (straight into the cgroup without cgroups,
// through the re-exec stub with them) runs the harness with the
// announcement's env, writes its output, in a cgroup made with shim's
// default limits; its record (written by startGeneration in one batch
// with state.json) says so.
func TestTheLauncherStartsAHarnessInEachPlacement(t *testing.T) {
	for _, mode := range []cgroup.Mode{cgroup.ModePidns, cgroup.ModeCgroup1, cgroup.ModeCgroup2} {
		t.Run(string(mode), func(t *testing.T) {
			lf := newLaunchFixture(t, mode)
			req := lf.req(1, "/bin/sh", "-c", `echo "gen=$SHIM_GENERATION a=$A"; echo err >&2; exit 3`)
			req.Env = []string{"A=1"}
			g, err := lf.l.start(context.Background(), req, "c0ffee", nil)
			if err != nil {
				t.Fatal(err)
			}
			if e := waitExit(t, g); e.Code != 3 {
				t.Errorf("exit %+v", e)
			}
			out, _ := os.ReadFile(filepath.Join(g.dir, "stdout"))
			errOut, _ := os.ReadFile(filepath.Join(g.dir, "stderr"))
			if string(out) != "gen=1 a=1\n" || string(errOut) != "err\n" {
				t.Errorf("output %q %q", out, errOut)
			}
			var records durableBatch
			lf.l.rt.putGenerationRecord(&records, g)
			if err := records.commit(); err != nil {
				t.Fatal(err)
			}
			var rec api.Generation
			if err := readJSON(filepath.Join(g.dir, "generation.json"), &rec); err != nil || rec.State != api.StateRunning || rec.Pid != g.pid || rec.Isolation != "scan" {
				t.Errorf("record %+v %v", rec, err)
			}
			if lf.j.index("create gen-1 mem=1073741824 pids=0") < 0 {
				t.Errorf("the cgroup gets the default memory limit, and no pids limit without the controller: %q", lf.j.all())
			}
			if g.baseline != "c0ffee" || g.state != stStarting || g.layers != nil {
				t.Errorf("generation %+v", g)
			}
		})
	}
}

// A start that fails undoes what it made: its cgroup is killed and
// removed, its layers dropped, and credentials revoked only once
// granted. What fails before anything is made leaves nothing.
func TestAFailedStartUndoesWhatItMade(t *testing.T) {
	for _, tc := range []struct {
		name      string
		setup     func(*launchFixture, *api.StartRequest)
		code      string
		group     bool // the cgroup was made (and must be removed)
		revoked   bool
		layersRem bool
	}{
		{name: "a command that is not there", code: api.CodeStartFailed,
			setup: func(_ *launchFixture, r *api.StartRequest) { r.Command = []string{"no-such-command-here"} }},
		{name: "a user that is not there", code: api.CodeBadRequest,
			setup: func(_ *launchFixture, r *api.StartRequest) { r.User = "no-such-user-here" }},
		{name: "the lower group as the harness's", code: api.CodeBadRequest,
			setup: func(lf *launchFixture, r *api.StartRequest) { lf.layered().group = 4242; r.User = "4243:4242" }},
		{name: "a cgroup that cannot be made", code: api.CodeStartFailed,
			setup: func(lf *launchFixture, _ *api.StartRequest) { lf.groups.createErr = errors.New("EBUSY") }},
		{name: "a refusal of the cgroup manager keeps its code", code: api.CodeControllerMissing,
			setup: func(lf *launchFixture, _ *api.StartRequest) {
				lf.groups.createErr = api.Errorf(api.CodeControllerMissing, "no memory controller")
			}},
		{name: "credentials without a broker", code: api.CodeUnsupported, group: true,
			setup: func(lf *launchFixture, r *api.StartRequest) {
				lf.rt.broker = nil
				r.Credentials = []api.Credential{{Protocol: "https", Host: "example.com", Username: "u", Password: "p"}}
			}},
		{name: "credentials that do not validate are never granted", code: api.CodeBadRequest, group: true,
			setup: func(_ *launchFixture, r *api.StartRequest) {
				r.Credentials = []api.Credential{{Protocol: "ftp", Host: "example.com"}}
			}},
		{name: "a harness that cannot be spawned, after the grant", code: api.CodeStartFailed, group: true, revoked: true, layersRem: true,
			setup: func(lf *launchFixture, r *api.StartRequest) {
				lf.layered()
				lf.l.cfg.ShimPath = filepath.Join(lf.dir, "no-shim-here") // the stub
				r.Credentials = []api.Credential{{Protocol: "https", Host: "example.com", Username: "u", Password: "p"}}
			}},
		{name: "layers that cannot be laid out", code: api.CodeStartFailed, group: true, layersRem: true,
			setup: func(lf *launchFixture, _ *api.StartRequest) { lf.layered().planErr = errors.New("ENOSPC") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lf := newLaunchFixture(t, cgroup.ModeCgroup2)
			req := lf.req(2)
			tc.setup(lf, &req)
			g, err := lf.l.start(context.Background(), req, "", nil)
			if codeOf(err) != tc.code || g != nil {
				t.Fatalf("got %v %v, want code %s", g, err, tc.code)
			}
			grp := lf.groups.group("gen-2")
			if (grp != nil) != tc.group {
				t.Fatalf("cgroup made %v, want %v: %q", grp != nil, tc.group, lf.j.all())
			}
			if grp != nil && (!grp.removed || grp.kills == 0) {
				t.Errorf("the cgroup of a failed start must be killed and removed: %q", lf.j.all())
			}
			if got := lf.j.index("revoke 2") >= 0; got != tc.revoked {
				t.Errorf("revoked %v, want %v: %q", got, tc.revoked, lf.j.all())
			}
			if got := lf.j.index("remove-layers 2") >= 0; got != tc.layersRem {
				t.Errorf("layers removed %v, want %v: %q", got, tc.layersRem, lf.j.all())
			}
		})
	}
}

// A cgroup left by a start that failed half-way is emptied and made
// again; one that cannot be emptied fails the start.
func TestALeftoverCgroupIsEmptiedOrTheStartFails(t *testing.T) {
	lf := newLaunchFixture(t, cgroup.ModeCgroup1)
	old, _ := lf.groups.Create("gen-3", cgroup.Limits{})
	g, err := lf.l.freshGroup(context.Background(), "gen-3", cgroup.Limits{})
	if err != nil || g == old || !old.(*dirGroup).removed {
		t.Fatalf("a leftover must be removed and made again: %v", err)
	}
	lf.groups.leftKill = errors.New("survivors")
	if _, err := lf.l.freshGroup(context.Background(), "gen-3", cgroup.Limits{}); codeOf(err) != api.CodeStartFailed || !strings.Contains(err.Error(), "cannot be emptied") {
		t.Fatalf("a leftover that cannot be emptied: %v", err)
	}
}

// In cgroup2 mode a generation's cgroup id is learned at its creation
// (the cut finds its sockets by it): a cgroup whose id cannot be read
// fails the start and is removed.
func TestACgroupWhoseIdCannotBeReadFailsTheStart(t *testing.T) {
	lf := newLaunchFixture(t, cgroup.ModeCgroup2)
	g, err := lf.l.newGroup(context.Background(), 4, lf.req(4))
	if err != nil {
		t.Fatal(err)
	}
	if id, ok := lf.l.ids.Load(g.Path()); !ok || id.(uint64) == 0 {
		t.Fatal("no id learned")
	}
	lf.groups.vanish = true
	if _, err := lf.l.newGroup(context.Background(), 5, lf.req(5)); codeOf(err) != api.CodeStartFailed {
		t.Fatalf("an id that cannot be read: %v", err)
	}
	if grp := lf.groups.group("gen-5"); grp == nil || !grp.removed {
		t.Fatal("its cgroup must be removed")
	}
}

// The part of a start begun beside the fence is begun only where nothing
// of the older generations can be touched by it (cgroups, layers, the
// sandbox's network, a worktree already registered), and what was begun
// is undone when the start cannot take it over.
func TestAnEarlyStartBeginsOnlyWhereItCanAndIsUndoneWhenNotTaken(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mode  cgroup.Mode
		setup func(*launchFixture, *api.StartRequest)
		begun bool
	}{
		{name: "no cgroups: the stub would be the older generations' until their kill", mode: cgroup.ModePidns,
			setup: func(lf *launchFixture, _ *api.StartRequest) { lf.layered() }},
		{name: "no layers: nothing slow to begin", mode: cgroup.ModeCgroup2},
		{name: "a network of its own is made at the start", mode: cgroup.ModeCgroup2,
			setup: func(lf *launchFixture, r *api.StartRequest) { lf.layered(); r.Network = api.NetworkNone }},
		{name: "a worktree not registered yet", mode: cgroup.ModeCgroup2,
			setup: func(lf *launchFixture, r *api.StartRequest) { lf.layered(); r.Worktree = "/w" }},
		{name: "layers: begun", mode: cgroup.ModeCgroup1, begun: true,
			setup: func(lf *launchFixture, _ *api.StartRequest) { lf.layered() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lf := newLaunchFixture(t, tc.mode)
			req := lf.req(6)
			if tc.setup != nil {
				tc.setup(lf, &req)
			}
			if lf.ly != nil {
				lf.ly.planErr = errors.New("the stub is not started in unit tests")
			}
			e := lf.l.startEarly(req)
			if (e != nil) != tc.begun {
				t.Fatalf("begun %v, want %v", e != nil, tc.begun)
			}
			if e == nil {
				return
			}
			if stub, group := e.take(lf.l, req); stub != nil || group != nil {
				t.Fatal("an early start whose stub failed cannot be taken over")
			}
			if g := lf.groups.group("gen-6"); g == nil || !g.removed {
				t.Fatalf("its cgroup must be removed: %q", lf.j.all())
			}
			lf.l.dropEarly(e, 6) // nothing left to undo
			lf.l.dropEarly(nil, 6)
		})
	}
}

// An early start is taken over only when its layers are still the ones
// the start gets; otherwise it is undone and the start begins again.
func TestAnEarlyStartIsTakenOnlyWithTheSameLayers(t *testing.T) {
	lf := newLaunchFixture(t, cgroup.ModeCgroup2)
	lf.layered()
	lf.rt.worktrees["/w"] = newScripted(lf.j, "/w")
	early := func(wts ...string) *earlyStart {
		r, w, err := readySocket()
		if err != nil {
			t.Fatal(err)
		}
		w.Close()
		t.Cleanup(func() { r.Close() })
		cat := exec.Command("/bin/cat")
		stdin, err := cat.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		p, err := lf.rt.cfg.Reaper.Start(cat)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stdin.Close(); p.Wait(context.Background()) })
		g, _ := lf.groups.Create("gen-8", cgroup.Limits{})
		e := &earlyStart{done: make(chan struct{}), group: g, stub: &layerStub{wts: wts, proc: p, ready: &stubReady{r: r}}}
		close(e.done)
		return e
	}
	req := lf.req(8)
	req.Worktree = "/w"
	e := early("/w")
	if stub, group := e.take(lf.l, req); stub != e.stub || group != e.group {
		t.Fatal("the same layers: taken over")
	}
	lf.l.dropEarly(e, 8)
	if lf.groups.group("gen-8").removed {
		t.Fatal("a start's taken-over cgroup was removed")
	}
	e = early()
	if stub, _ := e.take(lf.l, req); stub != nil {
		t.Fatal("a worktree registered since gets a layer the stub was not given: not taken")
	}
	if !lf.groups.group("gen-8").removed || lf.j.index("remove-layers 8") < 0 {
		t.Fatalf("undone: %q", lf.j.all())
	}
}

// A generation's limits: the announcement's, with shim's defaults for
// the kinds it leaves unset where the controller is available.
func TestLimitsAreTheAnnouncementsWithShimsDefaults(t *testing.T) {
	lf := newLaunchFixture(t, cgroup.ModeCgroup2)
	if got := lf.l.limitsFor(api.StartRequest{}); got.MemoryMax != 1<<30 || got.PidsMax != 0 {
		t.Errorf("defaults (no pids controller): %+v", got)
	}
	req := api.StartRequest{Limits: &api.Limits{MemoryMax: 5 << 20, CPUMax: "50000 100000"}}
	if got := lf.l.limitsFor(req); got.MemoryMax != 5<<20 || got.CPUMax != "50000 100000" {
		t.Errorf("explicit: %+v", got)
	}
}
