package runtime

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/creds"
	"github.com/shimdev/shim/internal/gitguard"
	"github.com/shimdev/shim/internal/testutil"
)

// The runtime turns the reports of the packages below it into the api's
// concrete types. Nothing a package reports may be lost on the way: every
// JSON field of the source must reach the API with its value.

// fill sets every exported field of v, recursively, to a distinct non-zero
// value.
func fill(v reflect.Value, seed *int) {
	*seed++
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d", *seed))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(*seed))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(*seed))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(*seed) + 0.5)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fill(p.Elem(), seed)
		v.Set(p)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		fill(s.Index(0), seed)
		fill(s.Index(1), seed)
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k, seed)
		fill(e, seed)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Struct:
		if v.Type() == reflect.TypeOf(time.Time{}) {
			v.Set(reflect.ValueOf(time.Unix(int64(*seed)*1000, 0).UTC()))
			return
		}
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), seed)
			}
		}
	}
}

func filled[T any]() T {
	var v T
	seed := 0
	fill(reflect.ValueOf(&v).Elem(), &seed)
	return v
}

func asJSON(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	json.Unmarshal(b, &out)
	return out
}

// carried reports the JSON paths of src that dst lacks or holds with
// another value.
func carried(path string, src, dst any) []string {
	switch s := src.(type) {
	case map[string]any:
		d, ok := dst.(map[string]any)
		if !ok {
			return []string{path}
		}
		var lost []string
		for k, v := range s {
			lost = append(lost, carried(path+"."+k, v, d[k])...)
		}
		return lost
	case []any:
		d, ok := dst.([]any)
		if !ok || len(d) != len(s) {
			return []string{path}
		}
		var lost []string
		for i := range s {
			lost = append(lost, carried(fmt.Sprintf("%s[%d]", path, i), s[i], d[i])...)
		}
		return lost
	}
	if !reflect.DeepEqual(src, dst) {
		return []string{path}
	}
	return nil
}

func TestTheWorktreeReportCarriesEveryFieldOfGitguards(t *testing.T) {
	src := filled[gitguard.Report]()
	if lost := carried("report", asJSON(t, src), asJSON(t, worktreeReport(&src))); len(lost) > 0 {
		t.Errorf("fields of gitguard.Report lost on the way to the API: %v", lost)
	}
	// A restore without a fetch reports none.
	src.Fetch = nil
	if worktreeReport(&src).Fetch != nil {
		t.Error("a fetch appeared")
	}
}

func TestASnapshotCarriesEveryFieldOfGitguards(t *testing.T) {
	src := filled[gitguard.Snapshot]()
	if lost := carried("snapshot", asJSON(t, src), asJSON(t, snapshot(src))); len(lost) > 0 {
		t.Errorf("fields of gitguard.Snapshot lost on the way to the API: %v", lost)
	}
	if ps := pathChanges(nil); ps == nil || len(ps) != 0 {
		t.Errorf("no paths is an empty list, not null: %#v", ps)
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
