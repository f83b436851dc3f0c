package cgroup

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParseMountinfo(t *testing.T) {
	in := `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
37 31 0:34 /docker/abc /sys/fs/cgroup/freezer rw,relatime shared:5 - cgroup cgroup rw,freezer
41 31 0:38 / /sys/fs/cgroup/uni\040fied rw,relatime - cgroup2 cgroup2 rw
`
	ms := parseMountinfo([]byte(in))
	if len(ms) != 2 {
		t.Fatalf("got %d mounts: %+v", len(ms), ms)
	}
	if ms[0].root != "/docker/abc" || !ms[0].hasOpt("freezer") || ms[0].point != "/sys/fs/cgroup/freezer" {
		t.Errorf("freezer: %+v", ms[0])
	}
	if ms[1].point != "/sys/fs/cgroup/uni fied" || ms[1].fstype != "cgroup2" {
		t.Errorf("cgroup2: %+v", ms[1])
	}
	if p, ok := ms[0].fsPath("/docker/abc/gen-1"); !ok || p != "/sys/fs/cgroup/freezer/gen-1" {
		t.Errorf("fsPath = %q %v", p, ok)
	}
	if _, ok := ms[0].fsPath("/docker/other"); ok {
		t.Error("fsPath outside the mount root")
	}
	if cg, ok := ms[0].cgPath("/sys/fs/cgroup/freezer/x"); !ok || cg != "/docker/abc/x" {
		t.Errorf("cgPath = %q %v", cg, ok)
	}
}

func TestParseProcCgroup(t *testing.T) {
	pc := parseProcCgroup([]byte("6:freezer:/docker/x\n4:memory:/m\n0::/sb/gen-3\n"))
	if pc.unified != "/sb/gen-3" || pc.freezer != "/docker/x" {
		t.Fatalf("%+v", pc)
	}
}

func TestUnder(t *testing.T) {
	for _, c := range []struct {
		base, cg, rel string
		ok            bool
	}{
		{"/sb", "/sb", ".", true},
		{"/sb", "/sb/gen-1/x", "gen-1/x", true},
		{"/sb", "/sbx", "", false},
		{"/", "/a", "a", true},
		{"/", "/../../host", "", false}, // outside our cgroup namespace
		{"/sb", "", "", false},
	} {
		rel, ok := under(c.base, c.cg)
		if rel != c.rel || ok != c.ok {
			t.Errorf("under(%q, %q) = %q %v", c.base, c.cg, rel, ok)
		}
	}
}

func TestLayoutName(t *testing.T) {
	for n, want := range map[string]bool{
		"shim": true, "gen-1": true, "gen-18446744073709551615": true, "git-a": true, "tmp-x.y": true,
		"gen-": false, "gen-x": false, "git-": false, "docker": false, "user.slice": false, "": false,
	} {
		if layoutName(n) != want {
			t.Errorf("layoutName(%q) != %v", n, want)
		}
	}
}

func TestLimitsValidation(t *testing.T) {
	for _, s := range []string{"max", "max 100000", "50000 100000"} {
		if _, err := (Limits{CPUMax: s}).files(); err != nil {
			t.Errorf("%q: %v", s, err)
		}
	}
	for _, s := range []string{"0 100000", "x", "1 2 3", "-5 100"} {
		_, err := (Limits{CPUMax: s}).files()
		wantCode(t, err, CodeBadRequest)
	}
	_, err := (Limits{MemoryMax: -1}).files()
	wantCode(t, err, CodeBadRequest)
}

func TestPidnsRefusedOutsideOwnNamespace(t *testing.T) {
	if os.Getpid() == 1 {
		t.Skip("running as PID 1")
	}
	_, err := New(Config{Mode: ModePidns}, nil)
	wantCode(t, err, CodeUnsupported)
}

func TestRootRefusals(t *testing.T) {
	mount := requireV2(t)
	h, err := probeHost()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("host top cgroup", func(t *testing.T) {
		if !h.initialNS || h.v2.root != "/" {
			t.Skip("not in the initial cgroup namespace")
		}
		_, err := New(Config{Root: mount, Mode: ModeCgroup2}, nil)
		wantCode(t, err, CodeRootRefused)
		// Auto mode must not fall back to another mode after a refusal.
		_, err = New(Config{Root: mount}, nil)
		wantCode(t, err, CodeRootRefused)
		if h.self.unified == "/" {
			_, err = New(Config{}, nil)
			wantCode(t, err, CodeRootRefused)
		}
	})

	t.Run("foreign child", func(t *testing.T) {
		root := testRoot(t, mount)
		if err := os.MkdirAll(filepath.Join(root, "user.slice"), 0o755); err != nil {
			t.Fatal(err)
		}
		_, err := New(Config{Root: root}, nil)
		wantCode(t, err, CodeRootRefused)
		if !strings.Contains(err.Error(), "user.slice") || !strings.Contains(err.Error(), "--cgroup-root") {
			t.Errorf("message should name the child and the flag: %v", err)
		}
	})

	t.Run("foreign process", func(t *testing.T) {
		root := testRoot(t, mount)
		if err := os.Mkdir(root, 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("sleep", "1000")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		if err := writeFile(filepath.Join(root, "cgroup.procs"), strconv.Itoa(cmd.Process.Pid)); err != nil {
			t.Fatal(err)
		}
		_, err := New(Config{Root: root}, nil)
		wantCode(t, err, CodeRootRefused)
		if !strings.Contains(err.Error(), strconv.Itoa(cmd.Process.Pid)) {
			t.Errorf("message should name the pid: %v", err)
		}
	})

	t.Run("own layout accepted", func(t *testing.T) {
		root := testRoot(t, mount)
		for _, d := range []string{"gen-7", "git-a", "tmp-b", "shim"} {
			if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		m, err := New(Config{Root: root}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if m.Mode() != ModeCgroup2 || m.Root() != root || !strings.Contains(m.Reason(), root) {
			t.Fatalf("mode %s root %s reason %q", m.Mode(), m.Root(), m.Reason())
		}
		names, err := m.List()
		if err != nil || !slices.Equal(names, []string{"gen-7", "git-a", "tmp-b"}) {
			t.Fatalf("List = %v, %v", names, err)
		}
		if _, err := m.Open("gen-7"); err != nil {
			t.Fatal(err)
		}
		_, err = m.Open("gen-8")
		wantCode(t, err, CodeNotFound)
		_, err = m.Create("shim", Limits{})
		wantCode(t, err, CodeBadRequest)
		_, err = m.Create("../x", Limits{})
		wantCode(t, err, CodeBadRequest)
		if _, err := m.Create("gen-7", Limits{}); !errors.Is(err, fs.ErrExist) {
			t.Fatalf("Create of an existing group: %v", err)
		}
	})
}

func TestAdoptSelfAndGroupOf(t *testing.T) {
	mount := requireV2(t)
	root := testRoot(t, mount)
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	// AdoptSelf runs in a child so the test process stays where it is.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SHIM_CGROUP_HELPER=adopt", "SHIM_CGROUP_ROOT="+root)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	line := make([]byte, 256)
	n, _ := stdout.Read(line)
	if got := strings.TrimSpace(string(line[:n])); got != "ok" {
		t.Fatalf("helper: %q", got)
	}
	pid := cmd.Process.Pid
	data, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if !strings.Contains(string(data), "::"+strings.TrimPrefix(root, mount)+"/shim\n") {
		t.Fatalf("helper not in %s/shim: %s", root, data)
	}

	// A second manager on the same root accepts it: only shim's layout.
	m, err := New(Config{Root: root}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := m.GroupOf(pid); err != nil || got != "shim" {
		t.Fatalf("GroupOf(adopted helper) = %q, %v", got, err)
	}
	if got, err := m.GroupOf(os.Getpid()); err != nil || got != "" {
		t.Fatalf("GroupOf(test process) = %q, %v", got, err)
	}
	g, err := m.Create("gen-2", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	c := startIn(t, g, "exec sleep 1000", false)
	if got, err := m.GroupOf(c.Process.Pid); err != nil || got != "gen-2" {
		t.Fatalf("GroupOf(harness) = %q, %v", got, err)
	}
	if names, _ := m.List(); !slices.Equal(names, []string{"gen-2"}) {
		t.Fatalf("List = %v", names)
	}
	if _, err := m.GroupOf(1 << 30); err == nil {
		t.Fatal("GroupOf of a missing pid: no error")
	}
	if _, err := g.Kill(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestControllerMissing(t *testing.T) {
	mount := requireV2(t)
	root := testRoot(t, mount)
	m, err := New(Config{Root: root}, nil)
	if err != nil {
		t.Fatal(err)
	}
	avail, _ := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	if slices.Contains(strings.Fields(string(avail)), "memory") {
		// A pure cgroup2 host: enable it as AdoptSelf would, then the
		// limit must land in memory.max.
		if err := writeFile(filepath.Join(root, "cgroup.subtree_control"), "+memory"); err != nil {
			t.Fatal(err)
		}
		g, err := m.Create("gen-1", Limits{MemoryMax: 64 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := os.ReadFile(filepath.Join(g.Path(), "memory.max")); strings.TrimSpace(string(v)) != "67108864" {
			t.Fatalf("memory.max = %q", v)
		}
		return
	}
	_, err = m.Create("gen-1", Limits{MemoryMax: 64 << 20})
	wantCode(t, err, CodeControllerMissing)
	if !strings.Contains(err.Error(), "memory") {
		t.Errorf("message should name the controller: %v", err)
	}
	if _, serr := os.Stat(filepath.Join(root, "gen-1")); !errors.Is(serr, fs.ErrNotExist) {
		t.Fatalf("half-made group left behind: %v", serr)
	}
}

// The hard cases of a fence: setsid daemons, a double-forked orphan, a
// process ignoring SIGTERM, a fork loop of 2000 sleeps, a busy loop.
const (
	scriptSetsid = "setsid sleep 1000 & exec sleep 1000"
	scriptDouble = "(sleep 1000 &); exit 0"
	scriptNoTerm = `trap "" TERM HUP INT; while :; do sleep 1; done`
	scriptForks  = `i=0; while [ $i -lt 2000 ]; do sleep 1000 & i=$((i+1)); done; wait`
	scriptBusy   = "while :; do :; done"
	minProcs     = 2 + 1 + 1 + 2001 + 1
)

func TestFenceCgroup2(t *testing.T) {
	mount := requireV2(t)
	m, err := New(Config{Root: testRoot(t, mount), Mode: ModeCgroup2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	fenceScenario(t, m)
}

func TestFenceCgroup2WithoutKillFile(t *testing.T) {
	mount := requireV2(t)
	m, err := New(Config{Root: testRoot(t, mount), Mode: ModeCgroup2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m.hasKill = false // the freeze + SIGKILL sweep of kernels < 5.14
	fenceScenario(t, m)
}

func TestFenceCgroup1(t *testing.T) {
	mount := requireFreezer(t)
	m, err := New(Config{Root: testRoot(t, mount), Mode: ModeCgroup1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if m.Mode() != ModeCgroup1 {
		t.Fatalf("mode %s", m.Mode())
	}
	fenceScenario(t, m)
}

func fenceScenario(t *testing.T, m *Manager) {
	g, err := m.Create("gen-1", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	_, cloneOK, _ := g.CloneFD()
	if cloneOK != (m.Mode() == ModeCgroup2) {
		t.Fatalf("CloneFD ok=%v in %s mode", cloneOK, m.Mode())
	}
	busy := startIn(t, g, scriptBusy, false)
	if got, _ := m.GroupOf(busy.Process.Pid); got != "gen-1" {
		t.Fatalf("busy loop in %q, want gen-1", got)
	}
	startIn(t, g, scriptSetsid, true)
	startIn(t, g, scriptNoTerm, false)
	startIn(t, g, scriptForks, false)
	double := startIn(t, g, scriptDouble, false)
	if err := double.Wait(); err != nil {
		t.Fatal(err)
	}
	pids := waitProcs(t, g, minProcs)
	t.Logf("%d processes in %s", len(pids), g.Path())

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := g.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	if m.Mode() == ModeCgroup2 {
		if v, _ := readKV(filepath.Join(g.Path(), "cgroup.events"), "frozen"); v != "1" {
			t.Fatalf("cgroup.events frozen %q after Freeze", v)
		}
	} else if v, _ := os.ReadFile(filepath.Join(g.Path(), "freezer.state")); strings.TrimSpace(string(v)) != "FROZEN" {
		t.Fatalf("freezer.state %q after Freeze", v)
	}
	before := cpuTicks(t, busy.Process.Pid)
	time.Sleep(200 * time.Millisecond)
	if after := cpuTicks(t, busy.Process.Pid); after != before {
		t.Fatalf("busy loop ran while frozen: %d -> %d ticks", before, after)
	}
	if err := g.Thaw(ctx); err != nil {
		t.Fatal(err)
	}
	if err := waitUntil(ctx, "", func() (bool, error) { return cpuTicks(t, busy.Process.Pid) > before, nil }); err != nil {
		t.Fatal("busy loop does not run after Thaw")
	}

	// Freeze again, as the fence does, then kill. The test's own children
	// are reaped only after Kill returns: zombies must not count.
	if err := g.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := g.Kill(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Survivors != 0 || len(res.SurvivorPids) != 0 || res.Killed < minProcs {
		t.Fatalf("Kill = %+v, want >= %d killed and no survivors", res, minProcs)
	}
	if p, err := g.Populated(); err != nil || p {
		t.Fatalf("Populated after Kill = %v, %v", p, err)
	}
	if err := g.WaitEmpty(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(g.Path()); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("group still there: %v", err)
	}
	// A removed group is empty: fencing it again is a no-op success.
	if res, err := g.Kill(ctx); err != nil || res.Killed != 0 {
		t.Fatalf("Kill of a removed group = %+v, %v", res, err)
	}
}

func TestRemoveRefusesPopulated(t *testing.T) {
	mount := requireV2(t)
	m, err := New(Config{Root: testRoot(t, mount)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	g, err := m.Create("gen-1", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	c := startIn(t, g, "exec sleep 1000", false)
	if err := g.Remove(); err == nil {
		t.Fatal("Remove of a populated group succeeded")
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(c.Process.Pid)); err != nil {
		t.Fatal("Remove killed the process")
	}
	// A deadline that has passed: FENCE_FAILED naming the survivor.
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	<-ctx.Done()
	err = g.WaitEmpty(ctx)
	wantCode(t, err, CodeFenceFailed)
}

// Docker on a hybrid host: the unified cgroup is the host's top one, the
// freezer cgroup is the container's own. The default root must then fall
// back to cgroup1 rather than refuse.
func TestDefaultRootFallsBackToFreezer(t *testing.T) {
	freezer := requireFreezer(t)
	h, _ := probeHost()
	if h.v2 == nil || !h.initialNS || h.self.unified != "/" {
		skipOrFatal(t, "needs to run in the host's top cgroup2 cgroup (hybrid host)")
	}
	root := testRoot(t, freezer)
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SHIM_CGROUP_HELPER=detect")
	stdin, _ := cmd.StdinPipe()
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := writeFile(filepath.Join(root, "cgroup.procs"), strconv.Itoa(cmd.Process.Pid)); err != nil {
		t.Fatal(err)
	}
	stdin.Write([]byte("go\n"))
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v: %s", err, out.String())
	}
	if got, want := strings.TrimSpace(out.String()), "cgroup1 "+root; got != want {
		t.Fatalf("detected %q, want %q", got, want)
	}
}
