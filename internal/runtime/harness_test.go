package runtime

import (
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/errs"
)

// What a harness is started with: its environment, its binary, its user,
// whether it can reach cred.sock, its limits, and which announcements are
// refused before anything is fenced.

func TestHarnessEnvKeepsWhatTheSupervisorSetAndAddsOnlyWhatIsMissing(t *testing.T) {
	env := harnessEnv(api.StartRequest{Generation: 9, Env: []string{"PATH=/opt/bin", "HOME=/h", "PATHX=1"}}, "/home/agent")
	want := []string{"PATH=/opt/bin", "HOME=/h", "PATHX=1", "SHIM_GENERATION=9"}
	if strings.Join(env, " ") != strings.Join(want, " ") {
		t.Errorf("env %q, want %q", env, want)
	}
	// A user without a home gets no HOME; the request's env is not modified.
	req := api.StartRequest{Generation: 2, Env: make([]string, 1, 8)}
	req.Env[0] = "A=1"
	env = harnessEnv(req, "")
	if strings.Join(env, " ") != "A=1 PATH="+defaultPath+" SHIM_GENERATION=2" {
		t.Errorf("env %q", env)
	}
	if len(req.Env) != 1 || req.Env[:2][1] != "" {
		t.Errorf("harnessEnv wrote into the request's env: %q", req.Env[:2])
	}
}

func TestProxyEnvComesFromShimButTheSupervisorsNoProxyWins(t *testing.T) {
	netEnv := []string{"HTTP_PROXY=http://169.254.0.1:3128", "http_proxy=http://169.254.0.1:3128", "NO_PROXY=", "no_proxy="}
	if got := proxyEnv(netEnv, []string{"A=1", "HTTP_PROXY=http://evil:1"}); strings.Join(got, " ") != strings.Join(netEnv, " ") {
		t.Errorf("without a NO_PROXY of its own: %q", got)
	}
	for _, set := range []string{"NO_PROXY=localhost", "no_proxy=localhost"} {
		got := strings.Join(proxyEnv(netEnv, []string{set}), " ")
		if got != "HTTP_PROXY=http://169.254.0.1:3128 http_proxy=http://169.254.0.1:3128" {
			t.Errorf("%s: %q", set, got)
		}
	}
	if got := proxyEnv(netEnv, []string{"NO_PROXY_EXTRA=1", "NO_PROXY"}); len(got) != len(netEnv) {
		t.Errorf("a look-alike key counts as NO_PROXY: %q", got)
	}
}

func TestLookPathSearchesTheHarnessPATH(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	os.Mkdir(bin, 0o755)
	os.WriteFile(filepath.Join(bin, "agent"), []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(bin, "data"), []byte("x"), 0o644)
	os.Mkdir(filepath.Join(bin, "adir"), 0o755)
	env := []string{"PATH=" + filepath.Join(dir, "none") + ":" + bin}
	if p, err := lookPath("agent", env); err != nil || p != filepath.Join(bin, "agent") {
		t.Errorf("agent: %q %v", p, err)
	}
	for _, name := range []string{"data", "adir", "missing"} {
		if p, err := lookPath(name, env); err == nil || !strings.Contains(err.Error(), "harness's PATH") {
			t.Errorf("%s: found %q", name, p)
		}
	}
	// Shim's own PATH is never used.
	t.Setenv("PATH", bin)
	if p, err := lookPath("agent", []string{"PATH=" + dir}); err == nil {
		t.Errorf("found on shim's PATH: %q", p)
	}
	if p, err := lookPath("/any/where/agent", nil); err != nil || p != "/any/where/agent" {
		t.Errorf("a path is taken as it is: %q %v", p, err)
	}
	if p, err := lookPath("sub/agent", nil); err != nil || p != "sub/agent" {
		t.Errorf("a relative path is taken as it is: %q %v", p, err)
	}
}

// An empty or "." entry of PATH finds the file in shim's working directory,
// but lookPath returns it relative and the harness is then executed relative
// to its own cwd (exec.Cmd.Dir), i.e. another file than the one checked.
// os/exec refuses such a result (exec.ErrDot) for the same reason.
func TestLookPathNeverReturnsAPathRelativeToShimsCwd(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "agent"), []byte("#!/bin/sh\n"), 0o755)
	t.Chdir(dir)
	for _, path := range []string{"PATH=:/nonexistent", "PATH=.", "PATH=/nonexistent:"} {
		p, err := lookPath("agent", []string{path})
		if err == nil && !filepath.IsAbs(p) {
			t.Errorf("%s: lookPath returned %q, relative to shim's cwd, which the harness resolves against its own", path, p)
		}
	}
}

func TestLookupUserForms(t *testing.T) {
	if c, home, err := lookupUser(""); c != nil || home != "" || err != nil {
		t.Errorf("empty: %+v %q %v", c, home, err)
	}
	root, err := user.LookupId("0")
	if err != nil {
		t.Skipf("no user 0 here: %v", err)
	}
	for spec, want := range map[string][2]uint32{"0": {0, 0}, "root": {0, 0}, "0:4242": {0, 4242}, "root:0": {0, 0}} {
		c, home, err := lookupUser(spec)
		if err != nil || c.Uid != want[0] || c.Gid != want[1] || home != root.HomeDir || c.Groups == nil || len(c.Groups) != 0 {
			t.Errorf("%s: %+v %q %v", spec, c, home, err)
		}
	}
	if g, err := user.LookupGroupId("0"); err == nil {
		if c, _, err := lookupUser("0:" + g.Name); err != nil || c.Gid != 0 {
			t.Errorf("group by name: %+v %v", c, err)
		}
	}
	// A uid with no passwd entry runs with its own number as gid and no home.
	if _, err := user.LookupId("54321"); err != nil {
		if c, home, err := lookupUser("54321"); err != nil || c.Uid != 54321 || c.Gid != 54321 || home != "" {
			t.Errorf("unknown uid: %+v %q %v", c, home, err)
		}
	}
	for _, spec := range []string{"no-such-user-here", "0:no-such-group-here", ":0", "0:", "4294967296"} {
		if c, _, err := lookupUser(spec); codeOf(err) != api.CodeBadRequest {
			t.Errorf("%q: %+v %v, want BAD_REQUEST", spec, c, err)
		}
	}
}

func TestReachableByJudgesTheModeBitsOfTheHarnessUser(t *testing.T) {
	base := t.TempDir()
	parent := filepath.Dir(base)
	for d := filepath.Dir(parent); ; d = filepath.Dir(d) {
		if st, err := os.Stat(d); err != nil || st.Mode().Perm()&0o001 == 0 {
			t.Skipf("%s is not searchable by others: no place to test", d)
		}
		if d == "/" {
			break
		}
	}
	os.Chmod(parent, 0o711)
	sock := filepath.Join(base, "cred.sock")
	os.WriteFile(sock, nil, 0o600)
	other := &syscall.Credential{Uid: 54321, Gid: 54321}
	group := &syscall.Credential{Uid: 54321, Gid: uint32(os.Getgid())}

	if err := reachableBy(sock, nil); err != nil {
		t.Errorf("shim's own user: %v", err)
	}
	if err := reachableBy(sock, &syscall.Credential{Uid: 0, Gid: 5}); err != nil {
		t.Errorf("root: %v", err)
	}
	os.Chmod(base, 0o700)
	if err := reachableBy(sock, other); err == nil || !strings.Contains(err.Error(), "cannot use "+base+" ") || !strings.Contains(err.Error(), "searchable") {
		t.Errorf("a dir without search permission: %v", err)
	}
	os.Chmod(base, 0o711)
	if err := reachableBy(sock, other); err == nil || !strings.Contains(err.Error(), "cannot use "+sock) {
		t.Errorf("a socket without write permission: %v", err)
	}
	os.Chmod(sock, 0o602)
	if err := reachableBy(sock, other); err != nil {
		t.Errorf("others may write: %v", err)
	}
	// The group class applies to the primary gid, whatever others may do.
	os.Chmod(base, 0o701)
	if err := reachableBy(sock, group); err == nil {
		t.Error("a dir that the harness's group may not search")
	}
	os.Chmod(base, 0o711)
	os.Chmod(sock, 0o606)
	if err := reachableBy(sock, group); err == nil {
		t.Error("a socket that the harness's group may not write")
	}
	os.Chmod(sock, 0o620)
	if err := reachableBy(sock, group); err != nil {
		t.Errorf("group may write: %v", err)
	}
	// The owner class applies to the owner, whatever the others may do.
	ownerUID := uint32(os.Getuid())
	if ownerUID == 0 {
		if err := os.Chown(sock, 54321, -1); err != nil {
			t.Fatal(err)
		}
		ownerUID = 54321
	}
	owner := &syscall.Credential{Uid: ownerUID, Gid: 54322}
	os.Chmod(sock, 0o066)
	if err := reachableBy(sock, owner); err == nil {
		t.Error("a socket its owner may not write")
	}
	os.Chmod(sock, 0o200)
	if err := reachableBy(sock, owner); err != nil {
		t.Errorf("its owner may write: %v", err)
	}
	if err := reachableBy(filepath.Join(base, "gone.sock"), other); err == nil || !strings.Contains(err.Error(), "stat") {
		t.Errorf("no socket: %v", err)
	}
}

func TestValidateStartRefusesBeforeAnythingIsFenced(t *testing.T) {
	cred := api.Credential{Protocol: "https", Host: "git.example", Username: "u", Password: "p"}
	for _, tc := range []struct {
		name string
		edit func(*api.StartRequest)
		msg  string
	}{
		{"generation", func(r *api.StartRequest) { r.Generation = 0 }, "positive integer"},
		{"empty command", func(r *api.StartRequest) { r.Command = []string{""} }, "command is required"},
		{"idle with a command", func(r *api.StartRequest) { r.Idle = true }, "an idle generation has no command"},
		{"empty command", func(r *api.StartRequest) { r.Command = []string{"", "x"} }, "command is required"},
		{"network", func(r *api.StartRequest) { r.Network = "bridge" }, `not "bridge"`},
		{"allow host", func(r *api.StartRequest) { r.Allow = []string{"example.com:443"} }, "allow needs network isolated"},
		{"allow none", func(r *api.StartRequest) { r.Network, r.Allow = api.NetworkNone, []string{"x:1"} }, "allow needs network isolated"},
		{"worktree", func(r *api.StartRequest) { r.Worktree = "w" }, "worktree must be an absolute path"},
		{"cwd", func(r *api.StartRequest) { r.Cwd = "./x" }, "cwd must be an absolute path"},
		{"baseline alone", func(r *api.StartRequest) { r.Baseline = "main" }, "need a worktree"},
		{"keep alone", func(r *api.StartRequest) { r.KeepPaths = []string{"cache"} }, "need a worktree"},
		{"ignored alone", func(r *api.StartRequest) { r.IncludeIgnored = true }, "need a worktree"},
		{"baseline option", func(r *api.StartRequest) { r.Worktree, r.Baseline = "/w", "--upload-pack=x" }, "invalid baseline"},
		{"keep empty", func(r *api.StartRequest) { r.Worktree, r.KeepPaths = "/w", []string{""} }, "keep path"},
		{"keep abs", func(r *api.StartRequest) { r.Worktree, r.KeepPaths = "/w", []string{"/etc"} }, "keep path"},
		{"keep up", func(r *api.StartRequest) { r.Worktree, r.KeepPaths = "/w", []string{"../x"} }, "keep path"},
		{"keep up inside", func(r *api.StartRequest) { r.Worktree, r.KeepPaths = "/w", []string{"a/../../x"} }, "keep path"},
		{"env", func(r *api.StartRequest) { r.Env = []string{"A=1", "NOVALUE"} }, `env entry "NOVALUE"`},
		{"credential", func(r *api.StartRequest) { r.Credentials = []api.Credential{cred, {Protocol: "https"}} }, "credential 1"},
		{"memory", func(r *api.StartRequest) { r.Limits = &api.Limits{MemoryMax: -1} }, "must not be negative"},
		{"pids", func(r *api.StartRequest) { r.Limits = &api.Limits{PidsMax: -1} }, "must not be negative"},
	} {
		req := api.StartRequest{Generation: 1, Command: []string{"agent"}}
		tc.edit(&req)
		err := validateStart(&req)
		if codeOf(err) != api.CodeBadRequest || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want BAD_REQUEST %q", tc.name, err, tc.msg)
		}
	}
	req := api.StartRequest{Generation: 1, Command: []string{"agent"}, Worktree: "/w", Baseline: "refs/remotes/origin/main",
		KeepPaths: []string{"cache", "a/b/../c"}, Env: []string{"A=", "B=x=y"}, Credentials: []api.Credential{cred},
		Limits: &api.Limits{MemoryMax: 1 << 30}}
	if err := validateStart(&req); err != nil || req.Network != api.NetworkHost {
		t.Errorf("valid request: %v, network %q", err, req.Network)
	}
	req.Network, req.Allow = api.NetworkIsolated, []string{"example.com:443"}
	if err := validateStart(&req); err != nil {
		t.Errorf("isolated with allow: %v", err)
	}
	// The secret is never quoted by a refusal.
	bad := api.StartRequest{Generation: 1, Command: []string{"x"}, Credentials: []api.Credential{{Protocol: "https", Host: "h/x", Username: "u", Password: "hunter2"}}}
	if err := validateStart(&bad); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("bad credential: %v", err)
	}
}

func TestValidRevisionChecksSyntaxOnly(t *testing.T) {
	for _, ok := range []string{"HEAD", "HEAD~2", "main", "refs/remotes/origin/main", "3f2ce1", "v1.0^{commit}", "ünïcode", strings.Repeat("a", 1024)} {
		if err := validRevision(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"-x", "--all", "a b", "a\tb", "a\nb", "a\x00", "a\x7f", strings.Repeat("a", 1025)} {
		if err := validRevision(bad); codeOf(err) != api.CodeBadRequest {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestLimitsForAppliesDefaultsOnlyWhereTheControllerIs(t *testing.T) {
	f := newFixture(t)
	l := &launcher{rt: f.rt, cfg: f.rt.cfg}
	l.cfg.DefaultLimits = cgroup.Limits{MemoryMax: 1 << 30, PidsMax: 512, CPUMax: "ignored"}
	if got := l.limitsFor(api.StartRequest{}); got != (cgroup.Limits{MemoryMax: 1 << 30, PidsMax: 512}) {
		t.Errorf("defaults: %+v", got)
	}
	got := l.limitsFor(api.StartRequest{Limits: &api.Limits{MemoryMax: 5 << 20, CPUMax: "50000 100000"}})
	if got != (cgroup.Limits{MemoryMax: 5 << 20, PidsMax: 512, CPUMax: "50000 100000"}) {
		t.Errorf("explicit memory: %+v", got)
	}
	f.rt.groups = ownGroups{fakeGroups: fakeGroups{f.s}, ctrls: map[string]bool{"pids": true}}
	if got := l.limitsFor(api.StartRequest{}); got != (cgroup.Limits{PidsMax: 512}) {
		t.Errorf("no memory controller: %+v", got)
	}
	// An explicit limit is kept even without its controller: the cgroup
	// package refuses it (CONTROLLER_MISSING) rather than shim dropping it.
	if got := l.limitsFor(api.StartRequest{Limits: &api.Limits{MemoryMax: 7}}); got.MemoryMax != 7 {
		t.Errorf("explicit limit without its controller: %+v", got)
	}
}

func TestGrantHandsTheBrokerTheCredentialsAndTheHarnessOnlyTheWayToAsk(t *testing.T) {
	f := newFixture(t)
	l := &launcher{rt: f.rt, cfg: f.rt.cfg}
	l.cfg.ShimPath = "/sbin/shim"
	cs := []api.Credential{{Protocol: "https", Host: "git.example", Username: "u", Password: "s3cret"}, {Protocol: "https", Host: "other", Username: "v", Password: "p2"}}
	env, err := l.grant(6, cs, []string{"A=1"})
	if err != nil {
		t.Fatal(err)
	}
	f.broker.mu.Lock()
	n := f.broker.granted[6]
	f.broker.mu.Unlock()
	joined := strings.Join(env, "\n")
	if n != 2 || env[0] != "A=1" || !strings.Contains(joined, filepath.Join(f.dir, "cred.sock")) || !strings.Contains(joined, "/sbin/shim") {
		t.Errorf("granted %d, env %q", n, env)
	}
	if strings.Contains(joined, "s3cret") || strings.Contains(joined, "p2") {
		t.Fatalf("a secret is in the harness's environment: %q", env)
	}
	if _, err := l.grant(7, []api.Credential{{Protocol: "https"}}, nil); codeOf(err) != api.CodeBadRequest {
		t.Errorf("invalid credential: %v", err)
	}
	f.rt.SetBroker(nil)
	if _, err := l.grant(8, cs, nil); codeOf(err) != api.CodeUnsupported {
		t.Errorf("no broker: %v", err)
	}
}

func TestUndoRevokesCutsAndKillsWhatAFailedStartMade(t *testing.T) {
	f := newFixture(t)
	l := &launcher{rt: f.rt, cfg: f.rt.cfg}
	g := &fakeGroup{name: "gen-5", j: f.j}
	l.undo(5, g, &fakeNet{j: f.j, n: 5}, true)
	order := []string{"revoke 5", "netcut 5", "netclose 5", "kill gen-5", "remove gen-5"}
	if strings.Join(f.j.all(), ",") != strings.Join(order, ",") {
		t.Errorf("undo: %q, want %q", f.j.all(), order)
	}
	// A group that cannot be emptied is not removed (the next start of
	// that generation finds it and refuses).
	g2 := &fakeGroup{name: "gen-6", j: f.j, killErr: errs.New(api.CodeFenceFailed, "survivor")}
	f.rt.SetBroker(nil)
	l.undo(6, g2, nil, true)
	if g2.removeCalls != 0 || g2.kills != 1 {
		t.Errorf("an unkillable group: kills %d removes %d", g2.kills, g2.removeCalls)
	}
}

func TestChildOOMScoreIsNeverShimsImmunity(t *testing.T) {
	b := childOOMScore()
	if s := string(b); s != "0" && s != "1000" {
		t.Errorf("child OOM score %q", s)
	}
	own, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		t.Skip(err)
	}
	if n, _ := strconv.Atoi(strings.TrimSpace(string(own))); n == -1000 && string(b) != "0" {
		t.Errorf("shim is exempt: children must get the default back, got %q", b)
	}
}
