package layers

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeKernel records the package's privileged calls instead of making
// them: the decisions around them are tested without root. A call fails
// when its record starts with a key of fail. What it mounted, and the
// sandbox's mounts the test gives it, are what mountinfo lists.
type fakeKernel struct {
	mu      sync.Mutex
	calls   []string
	fail    map[string]error
	mounted map[string]bool
	sandbox []mountEntry // the mounts the "kernel" had before the test
	rootID  string
}

// useFakeKernel puts a fake in the kernel's place for the test.
func useFakeKernel(t *testing.T, sandbox ...mountEntry) *fakeKernel {
	t.Helper()
	k := &fakeKernel{fail: map[string]error{}, mounted: map[string]bool{}, sandbox: sandbox}
	for _, m := range sandbox {
		if m.point == "/" {
			k.rootID = m.id
		}
	}
	saved := kernel
	t.Cleanup(func() { kernel = saved })
	kernel.mount, kernel.unmount, kernel.pivot = k.mount, k.unmount, func(root string) error { return k.record("pivot " + root) }
	kernel.chown = func(p string, uid, gid int) error { return k.record(fmt.Sprintf("chown %s %d:%d", p, uid, gid)) }
	kernel.lchown = kernel.chown
	kernel.mountinfo = k.mountinfo
	return k
}

func (k *fakeKernel) record(call string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls = append(k.calls, call)
	for prefix, err := range k.fail {
		if strings.HasPrefix(call, prefix) {
			return err
		}
	}
	return nil
}

func (k *fakeKernel) mount(source, target, fstype string, flags uintptr, data string) error {
	var call string
	switch {
	case flags&unix.MS_REMOUNT != 0:
		call = "remount-ro " + target
	case flags&unix.MS_PRIVATE != 0:
		call = "private " + target
	case flags&unix.MS_BIND != 0:
		call = "bind " + source + " " + target
		if flags&unix.MS_REC != 0 {
			call += " rec"
		}
	default:
		call = fstype + " " + target
		if data != "" {
			call += " " + data
		}
	}
	if err := k.record(call); err != nil {
		return err
	}
	if flags&(unix.MS_REMOUNT|unix.MS_PRIVATE) == 0 {
		k.mu.Lock()
		k.mounted[target] = true
		k.mu.Unlock()
	}
	return nil
}

func (k *fakeKernel) unmount(target string, _ int) error {
	if err := k.record("unmount " + target); err != nil {
		return err
	}
	k.mu.Lock()
	delete(k.mounted, target)
	k.mu.Unlock()
	return nil
}

func (k *fakeKernel) mountinfo(string) ([]mountEntry, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := append([]mountEntry(nil), k.sandbox...)
	var points []string
	for p := range k.mounted {
		points = append(points, p)
	}
	sort.Strings(points)
	for i, p := range points {
		out = append(out, mountEntry{id: fmt.Sprint(1000 + i), parent: k.rootID, point: p})
	}
	return out, nil
}

func (k *fakeKernel) all() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.calls...)
}

// inOrder fails t unless each call is recorded, each after the one
// before (a prefix matches).
func (k *fakeKernel) inOrder(t *testing.T, calls ...string) {
	t.Helper()
	all, at := k.all(), 0
	for _, want := range calls {
		found := false
		for ; at < len(all); at++ {
			if strings.HasPrefix(all[at], want) {
				found = true
				at++
				break
			}
		}
		if !found {
			t.Fatalf("%q missing or out of order in %q", want, all)
		}
	}
}

// never fails t if a call starting with prefix was recorded.
func (k *fakeKernel) never(t *testing.T, prefixes ...string) {
	t.Helper()
	for _, c := range k.all() {
		for _, p := range prefixes {
			if strings.HasPrefix(c, p) {
				t.Errorf("%q must not happen: %q", c, k.all())
			}
		}
	}
}

var errFake = errors.New("operation not permitted (fake)")
