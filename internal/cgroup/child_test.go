package cgroup

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A tool call's cgroup below its generation's: killed alone, and frozen,
// listed, killed and removed with the generation (cgroup2 and cgroup1).
func TestChildGroupIsCoveredByItsParent(t *testing.T) {
	for _, mode := range []Mode{ModeCgroup2, ModeCgroup1} {
		t.Run(string(mode), func(t *testing.T) {
			var mount string
			if mode == ModeCgroup2 {
				mount = requireV2(t)
			} else {
				mount = requireFreezer(t)
			}
			m, err := New(Config{Root: testRoot(t, mount), Mode: mode}, nil)
			if err != nil {
				t.Fatal(err)
			}
			g, err := m.Create("gen-1", Limits{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Child(g, "harness"); err == nil {
				t.Error("a child name other than proc-<K> was accepted")
			}
			c1, err := Child(g, "proc-1")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Child(g, "proc-1"); !errors.Is(err, fs.ErrExist) {
				t.Errorf("a second proc-1: %v", err)
			}
			c2, err := Child(g, "proc-2")
			if err != nil {
				t.Fatal(err)
			}
			startIn(t, g, "exec sleep 1000", false) // the harness, beside its calls
			a := startIn(t, c1, "exec sleep 1000", true)
			startIn(t, c2, "exec sleep 1000", true)
			if got, _ := m.GroupOf(a.Process.Pid); got != "gen-1" {
				t.Errorf("a call's process is in %q for the peer check, want gen-1", got)
			}
			waitProcs(t, g, 3)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// The call alone.
			if res, err := c2.Kill(ctx); err != nil || res.Killed != 1 {
				t.Fatalf("kill of proc-2: %+v %v", res, err)
			}
			if err := c2.Remove(); err != nil {
				t.Fatal(err)
			}
			if p, _ := g.Procs(); len(p) != 2 {
				t.Errorf("the generation after its call's kill: %v", p)
			}
			// The generation's freeze covers its calls.
			if err := g.Freeze(ctx); err != nil {
				t.Fatal(err)
			}
			if mode == ModeCgroup2 {
				// The kernel reports the child frozen too (a task woken for
				// a moment, to leave and re-enter the frozen state, clears
				// it meanwhile: wait for it as Freeze waits).
				events := filepath.Join(c1.Path(), "cgroup.events")
				if err := waitUntil(ctx, events, func() (bool, error) {
					v, err := readKV(events, "frozen")
					return v == "1", err
				}); err != nil {
					t.Errorf("proc-1 not frozen with its generation: %v", err)
				}
			}
			res, err := g.Kill(ctx)
			if err != nil || res.Killed != 2 || res.Survivors != 0 {
				t.Fatalf("kill of the generation: %+v %v", res, err)
			}
			if err := g.Remove(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(c1.Path()); !os.IsNotExist(err) {
				t.Errorf("proc-1 left: %v", err)
			}
		})
	}
}
