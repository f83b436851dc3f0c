package runtime

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/gitguard"
)

// Every git shim runs goes through gitRunner: in a throwaway cgroup,
// killed and removed after it; the fetching git is the only one bound to
// a broker grant, and only while it runs.
func TestShimsGitRunsInAThrowawayCgroup(t *testing.T) {
	for _, mode := range []cgroup.Mode{cgroup.ModePidns, cgroup.ModeCgroup2} {
		t.Run(string(mode), func(t *testing.T) {
			lf := newLaunchFixture(t, mode)
			var out bytes.Buffer
			cmd := exec.Command("/bin/sh", "-c", "echo ran")
			cmd.Stdout = &out
			if err := (gitRunner{lf.l}).Run(context.Background(), cmd); err != nil {
				t.Fatal(err)
			}
			if out.String() != "ran\n" {
				t.Errorf("output %q", out.String())
			}
			if mode == cgroup.ModePidns {
				if lf.j.index("create") >= 0 {
					t.Errorf("no cgroups in pidns mode: %q", lf.j.all())
				}
				return
			}
			lf.j.inOrder(t, "create git-1", "kill git-1", "remove git-1")
		})
	}
}

func TestTheFetchingGitAloneHoldsItsGrantWhileItRuns(t *testing.T) {
	lf := newLaunchFixture(t, cgroup.ModeCgroup2)
	key := fetchKeyBase + 7
	var during uint64
	lf.groups.onKill = func(name string) {
		lf.rt.mu.Lock()
		during = lf.rt.gitGrants[name]
		lf.rt.mu.Unlock()
	}
	cmd := exec.Command("/bin/true")
	cmd.Env = []string{envFetchGrant + "=" + strconv.FormatUint(key, 10)}
	if err := (gitRunner{lf.l}).RunWithNetwork(context.Background(), cmd); err != nil {
		t.Fatal(err)
	}
	if during != key || len(lf.rt.gitGrants) != 0 {
		t.Fatalf("grant while it ran %d (want %d), after %v", during, key, lf.rt.gitGrants)
	}
	// The same key in a git without network binds nothing.
	cmd = exec.Command("/bin/true")
	cmd.Env = []string{envFetchGrant + "=" + strconv.FormatUint(key, 10)}
	during = 0
	if err := (gitRunner{lf.l}).Run(context.Background(), cmd); err != nil || during != 0 {
		t.Fatalf("a git without network bound to a grant: %d %v", during, err)
	}
}

// A git cgroup that cannot be made is an error, and the git does not run
// outside it; one that cannot be emptied is kept (logged), not removed.
func TestAGitCgroupThatCannotBeMadeOrEmptied(t *testing.T) {
	lf := newLaunchFixture(t, cgroup.ModeCgroup2)
	marker := filepath.Join(lf.dir, "ran")
	lf.groups.createErr = errors.New("EBUSY")
	if err := (gitRunner{lf.l}).Run(context.Background(), exec.Command("/bin/sh", "-c", "touch "+marker)); err == nil {
		t.Fatal("a git without its cgroup ran")
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the git ran outside its cgroup")
	}
	lf.groups.createErr = nil
	lf.groups.killErr = errors.New("survivors")
	if err := (gitRunner{lf.l}).Run(context.Background(), exec.Command("/bin/true")); err != nil {
		t.Fatal(err)
	}
	if g := lf.groups.group("git-2"); g == nil || g.removed {
		t.Fatal("a git cgroup that was not emptied must not be removed")
	}
}

// A git to run as a harness's uid, without the capabilities that put it
// out of that harness's reach (the ambient guard decided, and shim holds
// no capability to give), is refused and never run.
func TestAGitWithinAHarnesssReachIsRefused(t *testing.T) {
	lf := newLaunchFixture(t, cgroup.ModePidns)
	lf.l.prepare() // the start-up probe's decision, replaced below
	prev := gitguard.CurrentOwnerGuard()
	gitguard.SetOwnerGuard(gitguard.OwnerGuard{Mode: gitguard.GuardAmbientCap})
	t.Cleanup(func() { gitguard.SetOwnerGuard(prev) })
	marker := filepath.Join(lf.dir, "ran")
	cmd := exec.Command("/bin/sh", "-c", "touch "+marker)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 4321, Gid: 4321}}
	err := (gitRunner{lf.l}).Run(context.Background(), cmd)
	if codeOf(err) != api.CodeInternal || !strings.Contains(err.Error(), "within reach") {
		t.Fatalf("got %v", err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("it ran")
	}
	if err := outOfReach(exec.Command("/bin/true")); err != nil {
		t.Fatalf("a git as shim's own uid: %v", err)
	}
}

// shim's own fetch asks the broker as a harness's git does, under a key
// no generation has; the secret is in no environment, and done revokes
// the grant.
func TestAFetchGetsItsOwnGrantAndDoneRevokesIt(t *testing.T) {
	lf := newLaunchFixture(t, cgroup.ModePidns)
	cred := api.Credential{Protocol: "https", Host: "example.com", Username: "u", Password: "s3cret"}
	cs, err := credsOf([]api.Credential{cred})
	if err != nil {
		t.Fatal(err)
	}
	if auth, done := lf.l.fetchAuth(&fetchSpec{}); auth != nil {
		t.Fatal("no credentials: no auth")
	} else {
		done()
	}
	auth, done := lf.l.fetchAuth(&fetchSpec{Credentials: cs})
	if auth == nil || !auth.Has("https", "example.com", "", "u") || auth.Has("https", "other.example", "", "u") {
		t.Fatalf("auth %+v", auth)
	}
	key := fetchGrantOf(auth.Env)
	if key <= fetchKeyBase || lf.broker.granted[key] != 1 || lf.rt.fetchKey != key {
		t.Fatalf("key %d, granted %v", key, lf.broker.granted)
	}
	if strings.Contains(strings.Join(auth.Env, " "), "s3cret") || strings.Contains(auth.Helper, "s3cret") {
		t.Fatal("the secret is in the fetching git's environment or argv")
	}
	done()
	if lf.j.index("revoke "+strconv.FormatUint(key, 10)) < 0 || lf.rt.fetchKey != 0 {
		t.Fatalf("not revoked: %q", lf.j.all())
	}
	lf.rt.broker = nil
	if auth, done := lf.l.fetchAuth(&fetchSpec{Credentials: cs}); auth != nil {
		t.Fatal("no broker: no auth")
	} else {
		done()
	}
}

func TestFetchGrantOfReadsOnlyAFetchKey(t *testing.T) {
	for env, want := range map[string]uint64{
		"":                                     0,
		envFetchGrant + "=12":                  0, // a generation's number, not a fetch's
		envFetchGrant + "=x":                   0,
		envFetchGrant + "=9223372036854775809": fetchKeyBase + 1,
		"OTHER=1\x00" + envFetchGrant + "=9223372036854775810": fetchKeyBase + 2,
	} {
		if got := fetchGrantOf(strings.Split(env, "\x00")); got != want {
			t.Errorf("%q: %d, want %d", env, got, want)
		}
	}
}

// A worktree that generations get layers on has its lower locked before
// anything of it is registered; one that cannot be locked is refused.
func TestALayeredWorktreesLowerIsLockedBeforeItIsRegistered(t *testing.T) {
	lf := newLaunchFixture(t, cgroup.ModePidns)
	wt := t.TempDir()
	if view, err := lf.l.lockLower(wt); view != "" || err != nil || lf.j.index("lock-lower") >= 0 {
		t.Fatalf("scan: %q %v", view, err)
	}
	ly := lf.layered()
	if view, err := lf.l.lockLower(wt); view != "" || err != nil || lf.j.index("lock-lower") >= 0 {
		t.Fatalf("no .git: %q %v", view, err)
	}
	os.Mkdir(filepath.Join(wt, ".git"), 0o700)
	if view, err := lf.l.lockLower(wt); view == "" || err != nil {
		t.Fatalf("locked: %q %v", view, err)
	}
	ly.lockErr = errors.New("EPERM")
	if _, err := lf.l.lockLower(wt); codeOf(err) != api.CodeWorktreeRefused {
		t.Fatalf("a lower that cannot be locked: %v", err)
	}
	ly.group = 77
	if lf.l.lowerGroup() != 77 {
		t.Error("lower group")
	}
	lf.rt.layers = nil
	if lf.l.lowerGroup() != 0 {
		t.Error("no layers: no lower group")
	}
}
