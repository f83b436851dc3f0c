package cgroup

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// BenchmarkKill measures Kill (call to confirmed empty) against the kernel
// floor measured the same way: a bare write of "1" to cgroup.kill, then a
// busy poll of cgroup.events until "populated 0". Spawning the processes
// is outside the timer.
func BenchmarkKill(b *testing.B) {
	mount := requireV2(b)
	m, err := New(Config{Root: testRoot(b, mount), Mode: ModeCgroup2}, nil)
	if err != nil {
		b.Fatal(err)
	}
	if !m.hasKill {
		b.Skip("no cgroup.kill")
	}
	seq := 0
	for _, n := range []int{100, 1000} {
		for _, kind := range []string{"shim", "floor"} {
			b.Run(fmt.Sprintf("%s-%d", kind, n), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					seq++
					g, err := m.Create("gen-"+strconv.Itoa(seq), Limits{})
					if err != nil {
						b.Fatal(err)
					}
					cmd := startIn(b, g, `i=0; while [ $i -lt `+strconv.Itoa(n)+` ]; do sleep 1000 & i=$((i+1)); done; wait`, false)
					waitProcs(b, g, n+1)
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					b.StartTimer()
					if kind == "shim" {
						if _, err := g.Kill(ctx); err != nil {
							b.Fatal(err)
						}
					} else {
						if err := writeFile(filepath.Join(g.Path(), "cgroup.kill"), "1"); err != nil {
							b.Fatal(err)
						}
						for {
							v, err := readKV(filepath.Join(g.Path(), "cgroup.events"), "populated")
							if err != nil {
								b.Fatal(err)
							}
							if v == "0" {
								break
							}
						}
					}
					b.StopTimer()
					cancel()
					_ = cmd.Wait()
					if err := g.Remove(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
