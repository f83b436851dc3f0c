package integration

// The benchmark of issue 5: the options of the original problem side by
// side, in one run under Docker, on the same repository and harness
// (dockerAgentScript: edits, commits, a setsid double-forked daemon, pushes
// in a loop). Reported, not asserted:
//
//	go test -run '^$' -bench DockerOptions -benchtime 1x -v ./integration/
//
// It is a benchmark so that plain `go test` never runs (nor skips) it.
// SHIM_DOCKER_BENCH_ROUNDS sets the rounds per option (default 5).

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
)

func BenchmarkDockerOptions(b *testing.B) {
	t := b
	dockerImage(t) // skips without a Docker engine
	rounds := 5
	if n, err := strconv.Atoi(os.Getenv("SHIM_DOCKER_BENCH_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	pass := randName("p-")
	srv := startGitServer(t, gitServerOpts{AnonFetch: true, Seed: dockerSeedFiles, Accounts: map[string]gitAccount{"agent": {Password: pass}}})
	base := srv.Seed
	credJSON := dockerCredJSON(srv.HostPort, "agent", pass)

	start := func(b *dockerBox, gen int) api.StartResult {
		t.Helper()
		var r api.StartResult
		ctl := b.hostCtl()
		ctl.must(t, &r, "start", "--generation", strconv.Itoa(gen), "--user", "1000:1000", "--cwd", "/workspace/repo",
			"--env", "HOME=/home/agent", "--env", "GEN="+strconv.Itoa(gen), "--env", "BRANCH=bench-"+b.Name+"-"+strconv.Itoa(gen),
			"--worktree", "/workspace/repo", "--baseline", base, "--network", "host",
			"--credential-file", ctl.credFile(t, credJSON), "--", "sh", "-c", dockerAgentScript)
		return r
	}
	// busy waits until the agent of the container has pushed and its daemon runs.
	busy := func(b *dockerBox) {
		t.Helper()
		eventually(t, 30*time.Second, "agent pushed and daemon running", func() bool {
			_, _, code := b.Exec("", "sh", "-c", "test -s /workspace/repo/pushed.count && test -s /workspace/repo/daemon.log")
			return code == 0
		})
	}
	newBox := func() *dockerBox {
		b := dockerRun(t, dockerFullFlags, "--grace", "5s")
		dockerClone(t, b, srv.URL)
		return b
	}

	// (a) fence in place: announce generation N+1 next to a busy generation N.
	var aTimes []time.Duration
	var aSurv, aKilled []int
	aSteps := map[string][]time.Duration{}
	aSaved := 0
	{
		b := newBox()
		start(b, 1)
		for i := 1; i <= rounds; i++ {
			busy(b)
			t0 := time.Now()
			r := start(b, i+1)
			aTimes = append(aTimes, time.Since(t0))
			if len(r.Fenced) != 1 {
				t.Fatalf("round %d: %+v", i, r)
			}
			aSurv = append(aSurv, r.Fenced[0].Survivors)
			aKilled = append(aKilled, r.Fenced[0].Killed)
			for k, v := range r.Fenced[0].DurationsMS {
				aSteps[k] = append(aSteps[k], time.Duration(v*float64(time.Millisecond)))
			}
			if r.Fenced[0].SnapshotRef != "" {
				aSaved++
			}
		}
	}

	// (b) fresh sandbox: a new container from the same image, a fresh clone,
	// the harness started; the old container (and its edits) removed.
	var bTimes, bRm []time.Duration
	{
		old := newBox()
		start(old, 1)
		for i := 1; i <= rounds; i++ {
			busy(old)
			t0 := time.Now()
			nb := dockerRun(t, dockerFullFlags, "--grace", "5s")
			dockerClone(t, nb, srv.URL)
			start(nb, 1)
			bTimes = append(bTimes, time.Since(t0))
			t1 := time.Now()
			dockerMust(t, "rm", "-f", old.Name)
			bRm = append(bRm, time.Since(t1))
			old = nb
		}
	}

	// (c) naive: kill the recorded pid of the harness, then git reset --hard
	// (to the baseline) && git clean -ffdx, in one docker exec; count the
	// processes of the old call (its cgroup) that survive.
	var cTimes, cInside []time.Duration
	var cSurv []int
	cDirty := 0
	{
		b := newBox()
		r := start(b, 1)
		for i := 1; i <= rounds; i++ {
			busy(b)
			t0 := time.Now()
			out := b.MustExec("agent", "sh", "-c", fmt.Sprintf(
				`t0=$(date +%%s%%N); kill -9 %d; cd /workspace/repo && git reset -q --hard %s && git clean -q -ffdx; t1=$(date +%%s%%N); echo $((t1-t0))`,
				r.Pid, base))
			cTimes = append(cTimes, time.Since(t0))
			ns, _ := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
			cInside = append(cInside, time.Duration(ns))
			time.Sleep(500 * time.Millisecond)
			procs := strings.Fields(b.MustExec("", "cat", r.Cgroup+"/cgroup.procs"))
			cSurv = append(cSurv, len(procs))
			if st, _, _ := b.Exec("agent", "git", "-C", "/workspace/repo", "status", "--porcelain"); strings.TrimSpace(st) != "" {
				cDirty++
			}
			// Not timed: shim fences what survived and starts the next call.
			r = start(b, i+1)
		}
	}

	a, bm := dockerMedian(aTimes), dockerMedian(bTimes)
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nDocker benchmark, %d rounds each (%s, %s)\n\n", rounds, dockerEngine(), time.Now().UTC().Format("2006-01-02"))
	fmt.Fprintf(&sb, "| option | what is timed | median | min – max | survivors of the old call | old call's edits |\n")
	fmt.Fprintf(&sb, "| --- | --- | --- | --- | --- | --- |\n")
	fmt.Fprintf(&sb, "| (a) fence in place (shim) | `shim ctl start --generation N+1` on the host: freeze, cut, kill, save + restore worktree, new harness running | %s | %s | %s (killed %s) | saved (`refs/shim/abandoned/<N>`) %d/%d |\n",
		dockerMS(a), dockerSpan(aTimes), dockerInts(aSurv), dockerInts(aKilled), aSaved, rounds)
	fmt.Fprintf(&sb, "| (b) fresh sandbox | `docker run` + shim ready + `git clone` + harness running (old container removed after: median %s more) | %s | %s | 0 (container removed) | lost |\n",
		dockerMS(dockerMedian(bRm)), dockerMS(bm), dockerSpan(bTimes))
	fmt.Fprintf(&sb, "| (c) naive | one `docker exec`: `kill -9 <pid>; git reset --hard <baseline> && git clean -ffdx` (inside: median %s); new harness not included | %s | %s | %s | lost; worktree dirty again 0.5 s later in %d/%d rounds |\n",
		dockerMS(dockerMedian(cInside)), dockerMS(dockerMedian(cTimes)), dockerSpan(cTimes), dockerInts(cSurv), cDirty, rounds)
	fmt.Fprintf(&sb, "\nratio a/b (medians): %.3f\n\n(a) per step, medians as shim reports them:", float64(a)/float64(bm))
	var keys []string
	for k := range aSteps {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&sb, " %s %.1f ms;", k, float64(dockerMedian(aSteps[k]))/1e6)
	}
	sb.WriteString("\n")
	fmt.Print(sb.String())
	if p := os.Getenv("SHIM_DOCKER_BENCH_OUT"); p != "" {
		_ = os.WriteFile(p, []byte(sb.String()), 0o644)
	}
}

func dockerMedian(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func dockerMS(d time.Duration) string {
	return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
}

func dockerSpan(d []time.Duration) string {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return fmt.Sprintf("%.0f – %.0f ms", float64(s[0])/1e6, float64(s[len(s)-1])/1e6)
}

func dockerInts(v []int) string {
	var s []string
	for _, n := range v {
		s = append(s, strconv.Itoa(n))
	}
	return strings.Join(s, ", ")
}

func dockerEngine() string {
	out, _, _ := dockerCmd("", "info", "--format", "Docker {{.ServerVersion}}, cgroup v{{.CgroupVersion}}, {{.NCPU}} CPUs, {{.Driver}}")
	return strings.TrimSpace(out)
}
