package runtime

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/errs"
)

// ownGroups is fakeGroups with chosen answers: a mode, the cgroup of
// chosen pids, or a GroupOf that fails.
type ownGroups struct {
	fakeGroups
	mode cgroup.Mode    // "" = cgroup2
	of   map[int]string // GroupOf of these pids; the others as fakeGroups
	err  error          // GroupOf fails with it when set
	// ctrls are the controllers generation cgroups can use (nil: fakeGroups').
	ctrls map[string]bool
	// list and open are the cgroups a previous shim left (List, Open).
	list    []string
	listErr error
	open    map[string]cgroup.Group
}

func (g ownGroups) List() ([]string, error) { return g.list, g.listErr }

func (g ownGroups) Open(name string) (cgroup.Group, error) {
	if grp, ok := g.open[name]; ok {
		return grp, nil
	}
	return nil, errs.New(api.CodeNotFound, "no cgroup %s", name)
}

func (g ownGroups) Controllers() map[string]bool {
	if g.ctrls != nil {
		return g.ctrls
	}
	return g.fakeGroups.Controllers()
}

func (g ownGroups) Mode() cgroup.Mode {
	if g.mode != "" {
		return g.mode
	}
	return g.fakeGroups.Mode()
}

func (g ownGroups) GroupOf(pid int) (string, error) {
	if g.err != nil {
		return "", g.err
	}
	if name, ok := g.of[pid]; ok {
		return name, nil
	}
	return g.fakeGroups.GroupOf(pid)
}

// sleeper is a real child process that runs until it is signalled (or the
// test ends), for signals to reach.
func sleeper(t *testing.T, attr ...*syscall.SysProcAttr) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if len(attr) > 0 {
		cmd.SysProcAttr = attr[0]
	}
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep to signal: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd
}

// waitSignal waits for cmd and returns the signal that ended it (0: none).
func waitSignal(t *testing.T, cmd *exec.Cmd) unix.Signal {
	t.Helper()
	cmd.Wait()
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		return 0
	}
	return unix.Signal(ws.Signal())
}

func TestCheckPeerAllowsRootAndAllowedUIDsOutsideEveryGeneration(t *testing.T) {
	f := newFixture(t)
	f.rt.cfg.AllowUIDs = []int{1500}
	f.rt.groups = ownGroups{fakeGroups: fakeGroups{f.s}, of: map[int]string{200: "shim", 300: "git-4", 400: "tmp-probe-1"}}
	for _, tc := range []struct {
		pid, uid int
		msg      string // "" = allowed
	}{
		{0, 0, ""},    // a supervisor outside shim's pid namespace
		{0, 1500, ""}, // an allowed uid
		{200, 0, ""},  // shim's own leaf
		{999, 0, ""},  // outside the generations' root
		{0, 1501, "uid 1501 may not control shim"},
		{999, 1501, "uid 1501 may not control shim"},
		{1003, 0, "peer pid 1003 runs inside gen-3"},
		{1003, 1500, "inside gen-3"},
		{300, 0, "inside git-4"}, // shim's own git runs the harness's repository
		{400, 0, "inside tmp-probe-1"},
	} {
		err := f.rt.CheckPeer(tc.pid, tc.uid)
		switch {
		case tc.msg == "" && err != nil:
			t.Errorf("pid %d uid %d refused: %v", tc.pid, tc.uid, err)
		case tc.msg != "" && (codeOf(err) != api.CodePeerNotAllowed || !strings.Contains(err.Error(), tc.msg)):
			t.Errorf("pid %d uid %d: %v, want PEER_NOT_ALLOWED %q", tc.pid, tc.uid, err, tc.msg)
		}
	}
	// A peer whose cgroup cannot be read is refused: it might be a harness.
	f.rt.groups = ownGroups{fakeGroups: fakeGroups{f.s}, err: errors.New("no /proc/5/cgroup")}
	if err := f.rt.CheckPeer(5, 0); codeOf(err) != api.CodePeerNotAllowed || !strings.Contains(err.Error(), "cannot tell which cgroup") {
		t.Errorf("unreadable cgroup: %v", err)
	}
	if err := f.rt.CheckPeer(0, 0); err != nil {
		t.Errorf("pid 0 is never looked up: %v", err)
	}
}

func TestCheckPeerWithoutCgroupsRefusesTheHarnessSessionAndItsDescendants(t *testing.T) {
	f := newFixture(t)
	f.rt.groups = ownGroups{fakeGroups: fakeGroups{f.s}, mode: cgroup.ModePidns}
	me := os.Getpid()
	if err := f.rt.CheckPeer(me, 0); err != nil {
		t.Fatalf("no harness runs: %v", err)
	}
	// A harness starts in its own session; a peer in that session is it.
	harness := sleeper(t, &syscall.SysProcAttr{Setsid: true})
	f.mustStart(1)
	f.setPid(1, harness.Process.Pid)
	if err := f.rt.CheckPeer(harness.Process.Pid, 0); codeOf(err) != api.CodePeerNotAllowed || !strings.Contains(err.Error(), "in the session of generation 1's harness") {
		t.Errorf("the harness itself: %v", err)
	}
	if err := f.rt.CheckPeer(me, 0); err != nil {
		t.Errorf("the test process is neither in the harness's session nor below it: %v", err)
	}
	// A process below a harness is refused, whatever its session.
	child := sleeper(t)
	f.setPid(1, me)
	if err := f.rt.CheckPeer(child.Process.Pid, 0); codeOf(err) != api.CodePeerNotAllowed || !strings.Contains(err.Error(), "generation 1's harness") {
		t.Errorf("a descendant of the harness: %v", err)
	}
	if err := f.rt.CheckPeer(1<<30, 0); codeOf(err) != api.CodePeerNotAllowed || !strings.Contains(err.Error(), "cannot inspect peer") {
		t.Errorf("a pid that does not exist: %v", err)
	}
	if err := f.rt.CheckPeer(0, 0); err != nil {
		t.Errorf("outside the pid namespace: %v", err)
	}
	if _, _, err := f.rt.Identify(1001); err == nil {
		t.Error("without cgroups no credential caller can be identified")
	}
}

func TestProcStatReadsParentAndSession(t *testing.T) {
	ppid, sid, err := procStat(os.Getpid())
	if err != nil || ppid != os.Getppid() {
		t.Fatalf("procStat: %d %d %v (ppid %d)", ppid, sid, err, os.Getppid())
	}
	if want, _ := unix.Getsid(0); sid != want {
		t.Errorf("sid %d, want %d", sid, want)
	}
}

// hookStarter runs a hook when a harness is launched, while Start holds
// the announcement.
type hookStarter struct {
	*fakeStarter
	onStart func(n uint64)
}

func (s hookStarter) start(ctx context.Context, req api.StartRequest, baseline string, early *earlyStart) (*generation, error) {
	if s.onStart != nil {
		s.onStart(req.Generation)
	}
	return s.fakeStarter.start(ctx, req, baseline, early)
}

func TestIdentifyAnswersOnlyTheCurrentRunningGeneration(t *testing.T) {
	f := newFixture(t)
	type answer struct {
		n   uint64
		cur bool
	}
	ask := func(pid int) answer {
		t.Helper()
		n, cur, err := f.rt.Identify(pid)
		if err != nil {
			t.Fatalf("identify %d: %v", pid, err)
		}
		return answer{n, cur}
	}
	if a := ask(1001); a != (answer{1, false}) {
		t.Errorf("before any start: %+v", a)
	}
	// While generation 2 is launched its harness may already ask: yes;
	// generation 1 was fenced before: no.
	var during []answer
	f.rt.launch = hookStarter{fakeStarter: f.s, onStart: func(uint64) { during = append(during, ask(1001), ask(1002)) }}
	f.mustStart(1)
	if a := ask(1001); a != (answer{1, true}) {
		t.Errorf("the current, running generation: %+v", a)
	}
	f.mustStart(2)
	if during[2] != (answer{1, false}) || during[3] != (answer{2, true}) {
		t.Errorf("during the start of 2: gen 1 %+v, gen 2 %+v", during[2], during[3])
	}
	if a := ask(1002); a != (answer{2, true}) {
		t.Errorf("current after its start: %+v", a)
	}
	if a := ask(1005); a != (answer{5, false}) {
		t.Errorf("a generation never started: %+v", a)
	}
	// A failed start answers no once it returned.
	f.rt.launch = f.s
	f.s.startErr = errs.New(api.CodeStartFailed, "exec failed")
	if _, err := f.start(3); codeOf(err) != api.CodeStartFailed {
		t.Fatalf("start 3: %v", err)
	}
	if a := ask(1003); a.cur {
		t.Error("a generation whose start failed is answered")
	}
	if a := ask(1002); a.cur {
		t.Error("generation 2 is answered after generation 3 was announced")
	}
}

func TestIdentifyAnswersNoOnceANewerAnnouncementFailedToFence(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	f.s.group(1).killErr = errs.New(api.CodeFenceFailed, "survivor")
	if _, err := f.rt.Fence(context.Background(), api.FenceRequest{Generation: 2}); err == nil {
		t.Fatal("fence succeeded")
	}
	if n, cur, err := f.rt.Identify(1001); n != 1 || cur || err != nil {
		t.Errorf("a generation left failed by its fence: %d %v %v", n, cur, err)
	}
}

func TestIdentifyRefusesCallersOutsideGenerations(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	f.rt.groups = ownGroups{fakeGroups: fakeGroups{f.s}, of: map[int]string{5: "shim", 6: "", 7: "gen-x", 8: "git-2"}}
	for pid, msg := range map[int]string{5: "not in a generation", 6: "not in a generation", 7: "invalid syntax", 8: "runs no fetch"} {
		if n, cur, err := f.rt.Identify(pid); err == nil || cur || !strings.Contains(err.Error(), msg) {
			t.Errorf("pid %d: %d %v %v, want an error saying %q", pid, n, cur, err, msg)
		}
	}
	// shim's own fetching git is answered with its fetch's grant only.
	f.rt.mu.Lock()
	f.rt.gitGrants["git-2"] = fetchKeyBase + 1
	f.rt.mu.Unlock()
	if n, cur, err := f.rt.Identify(8); n != fetchKeyBase+1 || !cur || err != nil {
		t.Errorf("the fetch's git: %d %v %v", n, cur, err)
	}
	f.rt.groups = ownGroups{fakeGroups: fakeGroups{f.s}, err: errors.New("gone")}
	if _, cur, err := f.rt.Identify(1001); err == nil || cur {
		t.Errorf("unreadable cgroup: %v %v", cur, err)
	}
}

// A cgroup named gen-0 is no generation shim makes (generation 0 is
// never admitted); "starting" is 0 whenever nothing is starting.
func TestIdentifyNeverAnswersGenerationZero(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	if n, cur, _ := f.rt.Identify(1000); cur {
		t.Errorf("a caller in gen-0 is answered as current (n=%d): Identify compares n with rt.starting, which is 0 when nothing starts", n)
	}
}

// procsGroup is a fake group whose processes are real children.
type procsGroup struct {
	*fakeGroup
	pids []int
	err  error
}

func (g procsGroup) Procs() ([]int, error) { return g.pids, g.err }

func TestSignalReachesTheHarnessOrEveryProcessOfTheGeneration(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, func(r *api.StartRequest) { r.Linger = true })
	harness, rest := sleeper(t), sleeper(t)
	f.setPid(1, harness.Process.Pid)
	f.rt.mu.Lock()
	f.rt.gens[1].group = procsGroup{fakeGroup: f.s.group(1), pids: []int{harness.Process.Pid, rest.Process.Pid}}
	f.rt.mu.Unlock()
	if err := f.rt.Signal(1, unix.SIGUSR1, false); err != nil {
		t.Fatal(err)
	}
	if sig := waitSignal(t, harness); sig != unix.SIGUSR1 {
		t.Errorf("harness: %v", sig)
	}
	f.rt.mu.Lock()
	f.rt.gens[1].group = procsGroup{fakeGroup: f.s.group(1), pids: []int{rest.Process.Pid}} // the harness's pid is free now
	f.rt.mu.Unlock()
	// The harness exited (lingering): only "all" still reaches the rest.
	f.s.group(1).proc.exit(0)
	if _, err := f.rt.Wait(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if err := f.rt.Signal(1, unix.SIGTERM, false); codeOf(err) != api.CodeNotRunning {
		t.Errorf("signal to an exited harness: %v", err)
	}
	if err := f.rt.Signal(1, unix.SIGTERM, true); err != nil {
		t.Fatalf("signal all: %v", err)
	}
	if sig := waitSignal(t, rest); sig != unix.SIGTERM {
		t.Errorf("the rest: %v", sig)
	}
	if recs := auditRecords(t, f.dir, "signal"); len(recs) != 2 || recs[1]["all"] != true {
		t.Errorf("signal audit: %v", recs)
	}

	f.rt.mu.Lock()
	f.rt.gens[1].group = procsGroup{fakeGroup: f.s.group(1), err: errors.New("cgroup gone")}
	f.rt.mu.Unlock()
	if err := f.rt.Signal(1, unix.SIGTERM, true); err == nil {
		t.Error("an unreadable process list is not an error")
	}
	f.rt.groups = ownGroups{fakeGroups: fakeGroups{f.s}, mode: cgroup.ModePidns}
	if err := f.rt.Signal(1, unix.SIGTERM, true); codeOf(err) != api.CodeUnsupported {
		t.Errorf("all without cgroups: %v", err)
	}
}

func TestSignalRefusesGenerationsWithoutAHarnessOrCgroup(t *testing.T) {
	f := newFixture(t)
	if err := f.rt.Signal(1, unix.SIGTERM, true); codeOf(err) != api.CodeNotRunning {
		t.Errorf("unknown generation: %v", err)
	}
	f.rt.st.Live = map[uint64]liveRecord{3: {Worktree: "/w"}}
	if err := f.rt.adoptLeftovers(); err != nil {
		t.Fatal(err)
	}
	if err := f.rt.Signal(3, unix.SIGTERM, false); codeOf(err) != api.CodeNotRunning {
		t.Errorf("adopted, no harness: %v", err)
	}
	if err := f.rt.Signal(3, unix.SIGTERM, true); codeOf(err) != api.CodeNotRunning || !strings.Contains(err.Error(), "no cgroup") {
		t.Errorf("adopted, no cgroup: %v", err)
	}
}

func TestForwardSignalGoesToTheCurrentRunningHarnessOnly(t *testing.T) {
	f := newFixture(t)
	f.rt.ForwardSignal(unix.SIGTERM) // nothing runs: nothing happens
	f.mustStart(1)
	harness := sleeper(t)
	f.setPid(1, harness.Process.Pid)
	f.rt.ForwardSignal(unix.SIGINT)
	if sig := waitSignal(t, harness); sig != unix.SIGINT {
		t.Errorf("harness: %v", sig)
	}
	f.s.group(1).proc.exit(0)
	f.rt.mu.Lock()
	exited := f.rt.gens[1].exited
	f.rt.mu.Unlock()
	<-exited
	other := sleeper(t)
	f.setPid(1, other.Process.Pid)
	f.rt.ForwardSignal(unix.SIGKILL) // the harness is gone: not forwarded to its pid
	other.Process.Signal(unix.SIGTERM)
	if sig := waitSignal(t, other); sig != unix.SIGTERM {
		t.Errorf("a signal was forwarded to an exited harness's pid: it died of %v", sig)
	}
}

func TestShutdownWithNothingRunningExitsZeroAndAdmitsNothing(t *testing.T) {
	f := newFixture(t)
	ch, stop := f.rt.Subscribe()
	defer stop()
	if code := f.rt.Shutdown(time.Hour); code != 0 {
		t.Errorf("exit code %d", code)
	}
	if ev := <-ch; ev.Type != api.EventShutdown {
		t.Errorf("event %+v", ev)
	}
	if len(auditRecords(t, f.dir, "shutdown")) != 1 {
		t.Error("shutdown not audited")
	}
	if _, err := f.start(1); codeOf(err) != api.CodeShuttingDown {
		t.Errorf("start after shutdown: %v", err)
	}
	if _, err := f.rt.Fence(context.Background(), api.FenceRequest{Generation: 1}); codeOf(err) != api.CodeShuttingDown {
		t.Errorf("fence after shutdown: %v", err)
	}
	if w := f.call(allowedPeer, "POST", "/v1/generations", `{"generation": 1, "command": ["x"]}`); w.Code != 503 {
		t.Errorf("start over HTTP after shutdown: %d", w.Code)
	}
}

func TestShutdownExitsWithTheHarnessCodeAndLeavesTheRestoreToTheNextShim(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "base"))
	f.s.group(1).proc.exit(3)
	f.rt.mu.Lock()
	exited := f.rt.gens[1].exited
	f.rt.mu.Unlock()
	<-exited
	if code := f.rt.Shutdown(time.Hour); code != 3 {
		t.Errorf("exit code %d, want the harness's 3", code)
	}
	// What the harness left is killed; its worktree is not restored here,
	// and state.json tells the next shim to restore it.
	if f.j.index("kill gen-1") < 0 || f.j.index("restore") >= 0 {
		t.Errorf("at shutdown: %q", f.j.all())
	}
	st, err := loadState(filepath.Join(f.dir, "state.json"))
	if err != nil || st.Live[1].Worktree != "/w" || st.Live[1].Baseline != "c0ffeebase" {
		t.Errorf("state.json after shutdown: %+v %v", st, err)
	}
	if recs := auditRecords(t, f.dir, "killed_at_shutdown"); len(recs) != 1 || recs[0]["generation"] != float64(1) {
		t.Errorf("killed_at_shutdown: %v", recs)
	}
}

func TestShutdownKillsAHarnessThatOutlivesTheGrace(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	f.mustStart(2) // 1 fenced, 2 current
	f.s.group(2).freezeErr = errs.New(api.CodeFreezeFailed, "not frozen")
	if code := f.rt.Shutdown(time.Millisecond); code != 137 {
		t.Errorf("exit code %d, want 137 (killed)", code)
	}
	// An unconfirmed freeze does not spare it from the kill.
	if f.j.index("freeze gen-2") < 0 || f.j.index("kill gen-2") < 0 {
		t.Errorf("at shutdown: %q", f.j.all())
	}
	var exit api.Exit
	if err := readJSON(filepath.Join(f.dir, "gen", "2", "exit.json"), &exit); err != nil || !exit.Fenced || exit.ExitCode != 137 {
		t.Errorf("exit record: %+v %v", exit, err)
	}
}

func TestShutdownSkipsAGenerationAlreadyEmptied(t *testing.T) {
	f := newFixture(t)
	f.rt.st.Live = map[uint64]liveRecord{4: {Worktree: "/w"}}
	if err := f.rt.adoptLeftovers(); err != nil {
		t.Fatal(err)
	}
	if code := f.rt.Shutdown(0); code != 0 {
		t.Errorf("exit code %d", code)
	}
	if st, _ := loadState(filepath.Join(f.dir, "state.json")); st.Live[4].Worktree != "/w" {
		t.Errorf("the pending restore was forgotten: %+v", st)
	}
}

func TestShutdownWithAGenerationThatCannotBeKilledLeavesItToTheNextShim(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "a"))
	f.s.abortErr = errors.New("sock_diag refused")
	f.s.group(1).killErr = errs.New(api.CodeFenceFailed, "survivor")
	code := f.rt.Shutdown(time.Millisecond)
	if f.j.index("abort gen-1") < 0 || f.j.index("kill gen-1") < 0 {
		t.Errorf("at shutdown: %q", f.j.all())
	}
	// No exit status is known: shim exits 0.
	if code != 0 {
		t.Errorf("exit code %d", code)
	}
	if st, err := loadState(filepath.Join(f.dir, "state.json")); err != nil || st.Live[1].Worktree != "/w" {
		t.Errorf("state.json: %+v %v", st, err)
	}
}

func TestPeersAreCountedPerConnection(t *testing.T) {
	f := newFixture(t)
	f.rt.PeerConnected(10)
	f.rt.PeerConnected(10)
	f.rt.PeerGone(10)
	if !f.rt.IsPeer(10) {
		t.Error("one of two connections closed: still a peer")
	}
	f.rt.PeerGone(10)
	if f.rt.IsPeer(10) {
		t.Error("every connection closed: still a peer")
	}
	f.rt.PeerGone(11) // never connected
	f.rt.PeerConnected(11)
	if !f.rt.IsPeer(11) {
		t.Error("a stray PeerGone made a later connection not count")
	}
}

func TestAuditFromOtherComponentsNamesTheGeneration(t *testing.T) {
	f := newFixture(t)
	f.rt.Audit("credential_served", map[string]any{"generation": uint64(3), "host": "git.example"})
	f.rt.Audit("proxy_refused", map[string]any{"host": "evil.example"})
	recs := auditRecords(t, f.dir, "credential_served")
	if len(recs) != 1 || recs[0]["generation"] != float64(3) || recs[0]["host"] != "git.example" {
		t.Errorf("records: %v", recs)
	}
	if recs := auditRecords(t, f.dir, "proxy_refused"); len(recs) != 1 || recs[0]["generation"] != nil {
		t.Errorf("records: %v", recs)
	}
}
