package layers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
)

// The layers' layout, their pins and the checks a start makes, on plain
// directories: no mount, no root.

func TestNewAppliesTheDefaultsAndReportsItsConfig(t *testing.T) {
	l := New(Config{Dir: "/l", Keep: -3, Persist: []string{"/cache"}, KeepBytes: 9, WorktreeSize: 7, LowerGroup: 5})
	if l.RootSize() != 1<<30 || l.Keep() != 0 || l.Dir() != "/l" || l.KeepBytes() != 9 || l.WorktreeSize() != 7 || l.LowerGroup() != 5 {
		t.Fatalf("config %+v", l.cfg)
	}
	p := l.Persist()
	p[0] = "/changed"
	if l.Persist()[0] != "/cache" {
		t.Error("Persist hands out the config's own slice")
	}
}

// A worktree's layers are named by a key of its clean path: the same for
// every spelling of it, short, never a path component of the worktree.
func TestAWorktreesLayersAreNamedByItsCleanPath(t *testing.T) {
	l := New(Config{Dir: "/l"})
	if WorktreeKey("/w/x/") != WorktreeKey("/w//x") || WorktreeKey("/w/x") == WorktreeKey("/w/y") || len(WorktreeKey("/w")) != 16 {
		t.Fatal("key")
	}
	k := WorktreeKey("/w")
	if got := l.WorktreeUpper("/w/", 12); got != "/l/wt/"+k+"/12/upper" {
		t.Errorf("worktree upper %s", got)
	}
	if got := l.RootUpper(12); got != "/l/root/12/upper" {
		t.Errorf("root upper %s", got)
	}
	if got := l.LowerView("/w/"); got != "/l/lower/"+k {
		t.Errorf("view %s", got)
	}
}

// The stub's command lines: the started-ahead stub waits on its socket;
// the probe's carries its plan, which reads back the same.
func TestTheStubsCommandLines(t *testing.T) {
	path, argv := Command("/shim", 3)
	if path != "/shim" || !reflect.DeepEqual(argv, []string{"shim", StubArg, "fd:3"}) {
		t.Fatalf("%s %q", path, argv)
	}
	p := &Plan{Generation: 4, Cwd: "/w", Worktrees: []WorktreeLayer{{Path: "/w", Upper: "/u", Work: "/k"}}}
	path, argv, err := planCommand("/shim", p, "/bin/agent", []string{"agent", "-x"})
	if err != nil || path != "/shim" || len(argv) != 6 || argv[1] != StubArg || argv[3] != "/bin/agent" || argv[5] != "-x" {
		t.Fatalf("%s %q %v", path, argv, err)
	}
	var back Plan
	if err := json.Unmarshal([]byte(argv[2]), &back); err != nil || !reflect.DeepEqual(&back, p) {
		t.Fatalf("plan %+v %v", back, err)
	}
}

// A pin takes effect with its reason; a person reads the pins oldest
// first, at most 100, with what each layer takes; a reason being written
// is no pin.
func TestPinsAreListedOldestFirstWithTheirReason(t *testing.T) {
	dir := t.TempDir()
	l := New(Config{Dir: dir})
	if len(l.Pinned()) != 0 {
		t.Fatal("no pins yet")
	}
	for _, n := range []uint64{12, 3, 7} {
		if err := l.Pin(n, fmt.Sprintf("snapshot %d failed", n)); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(dir, "pinned", "9.tmp"), []byte("half"), 0o600)
	os.MkdirAll(filepath.Join(dir, "wt", "k", "7", "upper"), 0o700)
	os.WriteFile(filepath.Join(dir, "wt", "k", "7", "upper", "f"), make([]byte, 8192), 0o600)
	got := l.Pinned()
	if len(got) != 3 || got[0].Generation != 3 || got[2].Generation != 12 || got[1].Why != "snapshot 7 failed" {
		t.Fatalf("pinned %+v", got)
	}
	if got[1].Bytes < 8192 || got[0].Bytes != 0 {
		t.Errorf("bytes %+v", got)
	}
	if !l.pinned(7) || l.pinned(9) {
		t.Error("pinned()")
	}
	for n := range 120 {
		l.Pin(uint64(100+n), "")
	}
	if got := l.Pinned(); len(got) != 100 || got[0].Generation != 3 {
		t.Errorf("%d listed, first %d", len(got), got[0].Generation)
	}
}

// A pin whose reason cannot be written still pins; one that cannot be
// made at all is an error the fence reports.
func TestAPinThatCannotBeMadeIsAnError(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "pinned"), nil, 0o600) // a file where the dir goes
	if err := New(Config{Dir: dir}).Pin(3, "x"); err == nil {
		t.Fatal("a pin that was not made")
	}
}

func TestWorktreeLayersListsTheGenerationsLayerDirs(t *testing.T) {
	dir := t.TempDir()
	l := New(Config{Dir: dir})
	os.MkdirAll(filepath.Join(dir, "wt", "a", "4", "upper"), 0o700)
	os.MkdirAll(filepath.Join(dir, "wt", "b", "5"), 0o700)
	os.MkdirAll(filepath.Join(dir, "wt", "c"), 0o700)
	os.WriteFile(filepath.Join(dir, "wt", "c", "4"), nil, 0o600) // not a layer
	got := l.WorktreeLayers(4)
	if len(got) != 1 || got["a"] != filepath.Join(dir, "wt", "a", "4") {
		t.Fatalf("%v", got)
	}
}

// Remove drops a generation's root layer and its layer of every
// worktree, and nothing of another generation.
func TestRemoveDropsEveryLayerOfTheGenerationOnly(t *testing.T) {
	dir := t.TempDir()
	l := New(Config{Dir: dir})
	for _, d := range []string{"root/4/upper", "root/5/upper", "wt/a/4/upper", "wt/b/4/work", "wt/b/5/upper"} {
		os.MkdirAll(filepath.Join(dir, d), 0o700)
	}
	if err := l.Remove(4); err != nil {
		t.Fatal(err)
	}
	for d, want := range map[string]bool{"root/4": false, "wt/a/4": false, "wt/b/4": false, "root/5": true, "wt/b/5": true} {
		if _, err := os.Stat(filepath.Join(dir, d)); (err == nil) != want {
			t.Errorf("%s there %v, want %v", d, err == nil, want)
		}
	}
}

// A worktree layer on the layers dir's filesystem has no bound of its
// own: Usage says it does not know.
func TestUsageOfAnUnboundedLayerIsUnknown(t *testing.T) {
	dir := t.TempDir()
	if _, _, _, ok := New(Config{Dir: dir}).Usage(filepath.Join(dir, "wt", "k", "1", "upper")); ok {
		t.Fatal("unbounded")
	}
	if _, _, _, ok := New(Config{Dir: dir, WorktreeSize: 1 << 20}).Usage(filepath.Join(dir, "wt", "k", "1", "upper")); ok {
		t.Fatal("a bounded layer whose tmpfs is not mounted")
	}
}

// A start checks the layers dir can take layers: one it cannot read or
// write is unusable, and says why.
func TestAnUnusableLayersDirSaysWhy(t *testing.T) {
	dir := t.TempDir()
	if why := New(Config{Dir: dir}).Unusable(); why != "" {
		t.Fatalf("a usable dir: %s", why)
	}
	if _, err := os.Stat(filepath.Join(dir, ".probe")); err == nil {
		t.Error("the probe file is left")
	}
	if why := New(Config{Dir: filepath.Join(dir, "missing")}).Unusable(); !strings.Contains(why, "cannot be read") {
		t.Errorf("missing: %q", why)
	}
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	if why := New(Config{Dir: file}).Unusable(); !strings.Contains(why, "cannot be written") {
		t.Errorf("not a dir: %q", why)
	}
}

// Two shims on one layers dir would take each other's layers: the second
// is refused until the first lets it go.
func TestOneLayersDirServesOneShim(t *testing.T) {
	dir := t.TempDir()
	a, b := New(Config{Dir: dir}), New(Config{Dir: dir})
	if err := a.Prepare(); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"root", "wt"} {
		if st, err := os.Stat(filepath.Join(dir, d)); err != nil || !st.IsDir() {
			t.Fatalf("%s not laid out: %v", d, err)
		}
	}
	if err := a.Prepare(); err != nil {
		t.Fatalf("again: %v", err)
	}
	if err := b.Prepare(); err == nil || !strings.Contains(err.Error(), "in use by another shim") {
		t.Fatalf("second shim: %v", err)
	}
	if why := b.Probe(context.Background(), "/shim", func(*exec.Cmd) error { return nil }); !strings.Contains(why, "in use by another shim") {
		t.Fatalf("second shim's probe: %q", why)
	}
	a.Release()
	if err := b.Prepare(); err != nil {
		t.Fatalf("after the first let go: %v", err)
	}
	b.Release()
}

// The probe runs what a layered start runs, in new namespaces, with a
// root layer of its own and a worktree layer on the layers dir; it says
// why when the child fails (its stderr, else the error) and leaves
// nothing behind either way.
func TestTheProbeTriesALayeredStartAndLeavesNothing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stderr string
		err    error
		want   string
	}{
		{name: "layers work"},
		{name: "the stub says why", stderr: "shim: layers of generation 0: root layer: operation not permitted\n", err: errors.New("exit status 127"), want: "shim: layers of generation 0: root layer: operation not permitted"},
		{name: "the child could not start", err: errors.New("fork/exec: operation not permitted"), want: "fork/exec: operation not permitted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l := New(Config{Dir: dir, Bind: []string{"/run/shim"}})
			defer l.Release()
			var plan Plan
			why := l.Probe(context.Background(), "/shim", func(cmd *exec.Cmd) error {
				if cmd.SysProcAttr == nil || cmd.SysProcAttr.Cloneflags != Cloneflags {
					t.Error("the probe must run in new mount and IPC namespaces")
				}
				if cmd.Path != "/shim" || cmd.Args[1] != StubArg || cmd.Args[3] != "/proc/self/exe" {
					t.Errorf("argv %q", cmd.Args)
				}
				if err := json.Unmarshal([]byte(cmd.Args[2]), &plan); err != nil {
					t.Fatal(err)
				}
				for _, w := range plan.Worktrees {
					if st, err := os.Stat(w.Upper); err != nil || !st.IsDir() {
						t.Errorf("the worktree layer is not laid out on the layers dir: %v", err)
					}
				}
				cmd.Stderr.Write([]byte(tc.stderr))
				return tc.err
			})
			if why != tc.want {
				t.Errorf("why %q, want %q", why, tc.want)
			}
			if plan.Generation != 0 || plan.RootTmpfs == "" || plan.Root == nil || len(plan.Worktrees) != 1 || !reflect.DeepEqual(plan.Hide, []string{dir}) || !reflect.DeepEqual(plan.Bind, []string{"/run/shim"}) {
				t.Errorf("plan %+v", plan)
			}
			left, _ := filepath.Glob(filepath.Join(dir, "*", "*"))
			ents, _ := os.ReadDir(dir)
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			if len(left) != 0 || strings.Join(names, ",") != "lock,root,wt" && strings.Join(names, ",") != "lock,wt" && strings.Join(names, ",") != "lock" {
				t.Errorf("left behind: %v %v", names, left)
			}
		})
	}
}

// fresh empties a layer's dir and makes its parts, closed to everyone
// else; likeLower gives the upper's top its lower's owner and mode, the
// sticky and setgid bits included.
func TestAFreshLayerIsEmptyClosedAndLikeItsLower(t *testing.T) {
	dir := t.TempDir()
	d := filepath.Join(dir, "layer")
	os.MkdirAll(filepath.Join(d, "upper", "old"), 0o755)
	if err := fresh(d, "upper", "work"); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(d, "upper")); len(ents) != 0 {
		t.Errorf("left from before: %v", ents)
	}
	if st, _ := os.Stat(d); st.Mode().Perm() != 0o700 {
		t.Errorf("mode %v", st.Mode())
	}
	lower := filepath.Join(dir, "lower")
	os.Mkdir(lower, 0o755)
	if err := os.Chmod(lower, 0o750|os.ModeSticky|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	if err := likeLower(filepath.Join(d, "upper"), lower); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(filepath.Join(d, "upper"))
	if st.Mode().Perm() != 0o750 || st.Mode()&os.ModeSticky == 0 || st.Mode()&os.ModeSetgid == 0 {
		t.Errorf("upper mode %v", st.Mode())
	}
	if err := likeLower(filepath.Join(d, "upper"), filepath.Join(dir, "missing")); err == nil {
		t.Error("a lower that is not there")
	}
	if modeBits(0) != 0 || modeBits(syscall.S_ISVTX) != os.ModeSticky {
		t.Error("modeBits")
	}
}

// The size walk of a layer stops just past its limit.
func TestTreeBytesStopsPastItsLimit(t *testing.T) {
	dir := t.TempDir()
	for i := range 10 {
		os.WriteFile(filepath.Join(dir, fmt.Sprint(i)), make([]byte, 8192), 0o600)
	}
	all := treeBytes(dir, 1<<40)
	if all < 10*8192 {
		t.Fatalf("all %d", all)
	}
	if got := treeBytes(dir, 8192); got <= 8192 || got >= all {
		t.Errorf("limited %d of %d", got, all)
	}
	if got := treeBytes(filepath.Join(dir, "missing"), 100); got != 0 {
		t.Errorf("missing %d", got)
	}
}
