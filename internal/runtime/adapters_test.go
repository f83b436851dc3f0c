package runtime

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/creds"
	"github.com/shimdev/shim/internal/gitguard"
	"github.com/shimdev/shim/internal/testutil"
)

// A restore's report reaches the API with the worktree's registration and
// paths as an empty list, not null, and gitguard's own report unchanged.
func TestAWorktreeReportHasItsRegistrationAndAListOfPaths(t *testing.T) {
	w := &guardWorktree{reg: api.Registration{Worktree: "/w", Late: true}}
	src := &gitguard.Report{Worktree: "/w", Modified: 1}
	out := w.report(src)
	if out.Paths == nil || out.Registration == nil || !out.Registration.Late || out.Modified != 1 {
		t.Errorf("report: %+v", out)
	}
	if src.Paths != nil || src.Registration != nil {
		t.Errorf("gitguard's report changed: %+v", src)
	}
	if b, _ := json.Marshal(out); !strings.Contains(string(b), `"paths":[]`) {
		t.Errorf("no paths is not an empty list: %s", b)
	}
}

func TestCgroupIDIsTheDirectorysInode(t *testing.T) {
	dir := t.TempDir()
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	if id, err := cgroupID(dir); err != nil || id != st.Ino {
		t.Errorf("cgroupID: %d %v, want %d", id, err, st.Ino)
	}
	if _, err := cgroupID(filepath.Join(dir, "gone")); codeOf(err) != api.CodeCutFailed {
		t.Errorf("a cgroup that is gone: %v", err)
	}
}

func TestAHostModeCutNeedsTheCgroupsID(t *testing.T) {
	f := newFixture(t)
	l := newLauncher(f.rt)
	if _, err := l.abortSockets([]cgroup.Group{&fakeGroup{name: "gen-1", j: f.j}}); codeOf(err) != api.CodeCutFailed {
		t.Errorf("a cgroup whose id cannot be read: %v", err)
	}
	w := &guardWorktree{reg: api.Registration{Worktree: "/w", Late: true}}
	if r := w.Registration(); r.Worktree != "/w" || !r.Late {
		t.Errorf("registration %+v", r)
	}
}

func TestApiLimitsIsNilWhenNothingIsLimited(t *testing.T) {
	if l := apiLimits(cgroup.Limits{}); l != nil {
		t.Errorf("%+v", l)
	}
	if l := apiLimits(cgroup.Limits{MemoryMax: 1 << 30, PidsMax: 64, CPUMax: "50000 100000"}); l == nil || l.MemoryMax != 1<<30 || l.PidsMax != 64 || l.CPUMax != "50000 100000" {
		t.Errorf("%+v", l)
	}
}

func TestShimsOwnFetchAsksTheBrokerUnderAKeyNoGenerationHas(t *testing.T) {
	f := newFixture(t)
	l := &launcher{rt: f.rt, cfg: f.rt.cfg}
	l.cfg.ShimPath = "/usr/local/bin/shim"
	cs := []creds.Credential{{Protocol: "https", Host: "git.example", Username: "bot", Password: "s3cret"}}

	auth, done := l.fetchAuth(&fetchSpec{Remote: "origin", Branch: "main", Credentials: cs})
	key := fetchKeyBase + 1
	f.broker.mu.Lock()
	granted := f.broker.granted[key]
	f.broker.mu.Unlock()
	if auth == nil || granted != 1 || f.rt.fetchKey != key {
		t.Fatalf("auth %+v, granted %d under %d, fetchKey %d", auth, granted, key, f.rt.fetchKey)
	}
	if !auth.Has("https", "git.example", "org/repo", "") || auth.Has("https", "other.example", "org/repo", "") {
		t.Error("Has must answer for the announcement's credentials only")
	}
	everything := auth.Helper + strings.Join(auth.Env, " ")
	if strings.Contains(everything, "s3cret") {
		t.Fatalf("the secret is in git's helper or environment: %s", everything)
	}
	if !strings.Contains(everything, filepath.Join(f.dir, "cred.sock")) || !strings.Contains(auth.Helper, "/usr/local/bin/shim") {
		t.Errorf("git cannot reach the broker: %s", everything)
	}
	// A second fetch gets its own key; the first one's done does not end it.
	_, done2 := l.fetchAuth(&fetchSpec{Credentials: cs})
	done()
	if f.rt.fetchKey != key+1 || f.j.index(fmt.Sprintf("revoke %d", key)) < 0 {
		t.Errorf("after the first done: fetchKey %d, journal %q", f.rt.fetchKey, f.j.all())
	}
	done2()
	if f.rt.fetchKey != 0 {
		t.Errorf("fetchKey %d after every fetch ended", f.rt.fetchKey)
	}
	// Without credentials, or without a broker, git asks nobody.
	if auth, done := l.fetchAuth(&fetchSpec{}); auth != nil {
		t.Error("a fetch without credentials is given an authenticator")
	} else {
		done()
	}
	f.rt.SetBroker(nil)
	if auth, _ := l.fetchAuth(&fetchSpec{Credentials: cs}); auth != nil {
		t.Error("without a broker there is nobody to ask")
	}
}

func TestPathKeyIsReadableUniqueAndBounded(t *testing.T) {
	a, b := pathKey("/workspace/repo"), pathKey("/workspace/repo/")
	if a != b || !strings.HasPrefix(a, "workspace-repo-") {
		t.Errorf("%q %q", a, b)
	}
	if pathKey("/a-b/c") == pathKey("/a/b-c") {
		t.Error("two worktrees share a state dir")
	}
	long := pathKey("/" + strings.Repeat("x/", 100) + "end")
	if len(long) > 40+1+8 || !strings.Contains(long, "end") || strings.Contains(long, "/") {
		t.Errorf("long: %q", long)
	}
}

// TestGitOfAHarnessUIDMustBeOutOfItsReach: the git runner refuses a git
// to run as another uid than root without gitguard.OwnerCaps, and runs
// root's and a protected one's.
func TestGitOfAHarnessUIDMustBeOutOfItsReach(t *testing.T) {
	testutil.Need(t, len(gitguard.OwnerCaps()) > 0, "shim's capabilities here include neither CAP_NET_BIND_SERVICE nor CAP_AUDIT_WRITE")
	for _, c := range []struct {
		cred    *syscall.Credential
		ambient []uintptr
		refused bool
	}{
		{nil, nil, false},
		{&syscall.Credential{Uid: 0}, nil, false},
		{&syscall.Credential{Uid: 1000, Gid: 1000}, nil, true},
		{&syscall.Credential{Uid: 1000, Gid: 1000}, []uintptr{unix.CAP_CHOWN}, true},
		{&syscall.Credential{Uid: 1000, Gid: 1000}, gitguard.OwnerCaps(), false},
	} {
		cmd := exec.Command("git", "status")
		if c.cred != nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, AmbientCaps: c.ambient}
		}
		err := outOfReach(cmd)
		if (err != nil) != c.refused || (err != nil && api.CodeOf(err) != api.CodeInternal) {
			t.Errorf("cred %+v ambient %v: %v, want refused=%v", c.cred, c.ambient, err, c.refused)
		}
	}
}
