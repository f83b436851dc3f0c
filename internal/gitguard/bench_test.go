package gitguard

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// BenchmarkRestore compares shim's save+restore with the floor (`git reset
// --hard && git clean -ffdx`, which loses the edits) and with `git stash
// -u` + reset + clean (the usual way to keep them), on a generated repo of
// 5,000 and 50,000 files with 100 modified files and 50 untracked files in
// new directories per iteration. The 50,000-file case is skipped with
// -short. Every mode gets one untimed warm-up iteration first. Figures are
// reported, not asserted.
func BenchmarkRestore(b *testing.B) {
	for _, n := range []int{5000, 50000} {
		if n > 5000 && testing.Short() {
			continue
		}
		repo := benchRepo(b, n)
		for _, mode := range []string{"floor", "stash", "shim"} {
			b.Run(fmt.Sprintf("files=%d/%s", n, mode), func(b *testing.B) {
				f := repo.clone(b)
				var g *Guard
				if mode == "shim" {
					g = f.guard(b, nil)
				}
				ctx := context.Background()
				steps := map[string]float64{}
				b.ResetTimer()
				// Iteration -1 is an untimed warm-up of every mode: the
				// clone's index has its entries racily clean (files and
				// index written in the same second), so the first reset or
				// add re-reads every file. Later fences start from the
				// index the previous restore wrote.
				for i := -1; i < b.N; i++ {
					b.StopTimer()
					benchEdits(b, f.wt, n, i+1)
					if i >= 0 {
						b.StartTimer()
					}
					switch mode {
					case "floor":
						benchGit(b, f.wt, "reset", "-q", "--hard")
						benchGit(b, f.wt, "clean", "-ffdxq")
					case "stash":
						benchGit(b, f.wt, "stash", "push", "-q", "-u")
						benchGit(b, f.wt, "reset", "-q", "--hard")
						benchGit(b, f.wt, "clean", "-ffdxq")
					case "shim":
						rep, err := g.Restore(ctx, uint64(i+2), f.baseline)
						if err != nil {
							b.Fatal(err)
						}
						if rep.Modified != 100 || rep.Added != 50 {
							b.Fatalf("report m=%d a=%d", rep.Modified, rep.Added)
						}
						for k, v := range rep.DurationsMS {
							if i >= 0 {
								steps[k] += v
							}
						}
					}
				}
				b.StopTimer()
				for k, v := range steps {
					b.ReportMetric(v/float64(b.N), k+"-ms")
				}
			})
		}
	}
}

// benchFixture is a generated origin; each sub-benchmark clones it.
type benchFixture struct {
	root, origin, baseline string
}

func benchRepo(b testing.TB, n int) *benchFixture {
	b.Helper()
	root := b.TempDir()
	src := filepath.Join(root, "src")
	for i := 0; i < n; i++ {
		p := filepath.Join(src, fmt.Sprintf("d%03d/s%02d/f%05d.txt", i/500, (i/50)%10, i))
		if i%50 == 0 {
			must(b, os.MkdirAll(filepath.Dir(p), 0o755))
		}
		must(b, os.WriteFile(p, []byte(fmt.Sprintf("file %d\n%0200d\n", i, i)), 0o644))
	}
	tgit(b, root, "init", "-q", src)
	tgit(b, src, "add", "-A")
	tgit(b, src, "commit", "-q", "-m", "generated")
	origin := filepath.Join(root, "origin.git")
	tgit(b, root, "clone", "-q", "--bare", src, origin)
	return &benchFixture{root: root, origin: origin, baseline: tgit(b, src, "rev-parse", "HEAD")}
}

func (r *benchFixture) clone(b testing.TB) *fixture {
	b.Helper()
	root := b.TempDir()
	f := &fixture{root: root, origin: r.origin, wt: filepath.Join(root, "wt"), state: filepath.Join(root, "state"), baseline: r.baseline}
	tgit(b, root, "clone", "-q", r.origin, f.wt)
	return f
}

// benchEdits modifies 100 tracked files and adds 50 untracked files in 10
// new directories.
func benchEdits(b testing.TB, wt string, n, iter int) {
	for k := 0; k < 100; k++ {
		i := (k*n/100 + iter) % n
		p := filepath.Join(wt, fmt.Sprintf("d%03d/s%02d/f%05d.txt", i/500, (i/50)%10, i))
		must(b, os.WriteFile(p, []byte(fmt.Sprintf("edited %d in %d\n", i, iter)), 0o644))
	}
	for k := 0; k < 50; k++ {
		p := filepath.Join(wt, fmt.Sprintf("new%02d/sub/u%02d.txt", k/5, k))
		if k%5 == 0 {
			must(b, os.MkdirAll(filepath.Dir(p), 0o755))
		}
		must(b, os.WriteFile(p, []byte(fmt.Sprintf("untracked %d %d\n", k, iter)), 0o644))
	}
}

// benchGit runs plain git the way a user would (hooks off, nothing else).
func benchGit(b *testing.B, dir string, args ...string) {
	cmd := exec.Command("/usr/bin/git", append([]string{"-c", "core.hooksPath=/dev/null"}, args...)...)
	cmd.Dir = dir
	cmd.Env = testEnv(os.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("git %v: %v\n%s", args, err, out)
	}
}
