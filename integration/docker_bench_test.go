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
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/client"
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

// BenchmarkDockerSizes is the benchmark of issue 10 under Docker: the
// fence in place, with layers and with the scan, against a fresh sandbox
// (`docker run` of the same image plus a clone), at several sizes of the
// repository, and the cost each moves to the next generation: its first
// `git status`. Reported, not asserted:
//
//	go test -run '^$' -bench DockerSizes -benchtime 1x -timeout 90m -v ./integration/
//
// Like BenchmarkDockerOptions it is a benchmark so that plain `go test`
// never runs (nor skips) it. SHIM_DOCKER_BENCH_SIZES sets the numbers of
// files (default 100,5000,50000), SHIM_DOCKER_BENCH_ROUNDS the rounds
// (default 5, at least 5); SHIM_DOCKER_BENCH_OUT also writes the table to a
// file. The options take turns in each round, so that the machine's
// noise falls on all of them alike. The fence with layers is measured
// twice, in two containers: driven by `shim ctl` exec'd on the host (a Go
// program's exec and start-up, 15-25 ms on this project's VM, on top of
// the announcement) and by the Go client, as a Go supervisor drives it;
// the fresh sandbox starts its harness through the Go client too.
//
// The harness (dockerSizesScript), the same in every option: time its own
// first `git status`, modify 100 tracked files, add 50 untracked files in
// 10 new directories, commit once, start a setsid double-forked daemon,
// then idle.
func BenchmarkDockerSizes(bb *testing.B) {
	t := bb
	dockerImage(t) // skips without a Docker engine
	sizes := []int{100, 5000, 50000}
	if s := os.Getenv("SHIM_DOCKER_BENCH_SIZES"); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 100 {
				t.Fatalf("SHIM_DOCKER_BENCH_SIZES: %q (sizes of at least 100)", s)
			}
			sizes = append(sizes, n)
		}
	}
	rounds := 5
	if s := os.Getenv("SHIM_DOCKER_BENCH_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 5 {
			t.Fatalf("SHIM_DOCKER_BENCH_ROUNDS: %q (at least 5)", s)
		}
		rounds = n
	}
	load0 := dockerLoad()
	var rows []dockerSizeRow
	for _, n := range sizes {
		rows = append(rows, dockerSizesAt(t, n, rounds)...)
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nDocker benchmark by repository size, %d rounds each, medians (%s, kernel %s, %s, load average %s at the start, %s at the end)\n\n",
		rounds, dockerEngine(), dockerKernel(), time.Now().UTC().Format("2006-01-02"), load0, dockerLoad())
	sb.WriteString("| files | option | timed | median | min – max | fence's restore step | next generation's first `git status` | (b) / this | survivors; snapshots |\n")
	sb.WriteString("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, r := range rows {
		sb.WriteString(r.String())
	}
	sb.WriteString("\nThe fence report's steps, medians:\n\n")
	for _, r := range rows {
		if !r.fenced {
			continue
		}
		var keys []string
		for k := range r.steps {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(&sb, "- %d files, %s:", r.files, r.option)
		for _, k := range keys {
			fmt.Fprintf(&sb, " %s %.1f ms;", k, float64(dockerMedian(r.steps[k]))/1e6)
		}
		sb.WriteString("\n")
	}
	fmt.Print(sb.String())
	if p := os.Getenv("SHIM_DOCKER_BENCH_OUT"); p != "" {
		_ = os.WriteFile(p, []byte(sb.String()), 0o644)
	}
}

// dockerSizesScript is the harness of BenchmarkDockerSizes (GEN and N, the
// number of files, in its environment; the files are dockerSizesPath's).
// Its first `git status` is timed by itself, in its own mount namespace
// (a layer's overlay is seen only there), and written to
// /tmp/status-$GEN.ns; /tmp/ready-$GEN says it is done and its daemon runs.
const dockerSizesScript = `
cd /workspace/repo || exit 1
t0=$(date +%s%N); git status --porcelain >/dev/null || exit 1; t1=$(date +%s%N)
echo $((t1-t0)) > /tmp/status-$GEN.ns
git config user.name agent; git config user.email agent@example.com
k=0
while [ $k -lt 100 ]; do
	i=$(( (k*N/100 + GEN) % N ))
	echo "gen $GEN edit" >> "$(printf 'd%03d/s%02d/f%05d.txt' $((i/500)) $(((i/50)%10)) $i)"
	k=$((k+1))
done
git commit -qam "gen $GEN" 2>/tmp/commit-failed-$GEN && rm /tmp/commit-failed-$GEN
k=0
while [ $k -lt 50 ]; do
	d=$(printf 'new%02d/sub' $((k/5)))
	mkdir -p "$d" && echo "untracked $k of gen $GEN" > "$d/$(printf 'u%02d.txt' $k)"
	k=$((k+1))
done
sh -c 'setsid sh -c "while :; do date >> daemon.log; sleep 0.2; done" &' &
until test -s daemon.log; do sleep 0.05; done
echo ok > /tmp/ready-$GEN
exec sleep 100000
`

// dockerSizesPath is the i-th file of the generated repository: 50 files a
// directory, 10 directories under each of n/500 top directories.
func dockerSizesPath(i int) string {
	return fmt.Sprintf("d%03d/s%02d/f%05d.txt", i/500, (i/50)%10, i)
}

// dockerSizesRepo makes main of srv's repository a commit of n generated
// files (plus the seed's) and returns it.
func dockerSizesRepo(t testing.TB, srv *gitServer, n int) string {
	t.Helper()
	src := t.TempDir()
	for name, content := range dockerSeedFiles {
		if err := os.WriteFile(filepath.Join(src, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i++ {
		p := filepath.Join(src, dockerSizesPath(i))
		if i%50 == 0 {
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(p, []byte(fmt.Sprintf("file %d\n%0200d\n", i, i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + src, "GIT_CONFIG_NOSYSTEM=1", "LC_ALL=C",
		"GIT_AUTHOR_NAME=bench", "GIT_AUTHOR_EMAIL=bench@example.invalid",
		"GIT_COMMITTER_NAME=bench", "GIT_COMMITTER_EMAIL=bench@example.invalid"}
	git := func(args ...string) string {
		cmd := exec.Command("git", args...)
		cmd.Dir, cmd.Env = src, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git("init", "-q", "-b", "main")
	git("add", "-A")
	git("commit", "-q", "-m", fmt.Sprintf("%d generated files", n))
	git("push", "-q", "-f", srv.Bare, "HEAD:refs/heads/main")
	return git("rev-parse", "HEAD")
}

type dockerSizeRow struct {
	files            int
	option, timed    string
	times, restore   []time.Duration
	status           []time.Duration
	fresh            time.Duration // (b)'s median, for the ratio
	survivors, snaps []int
	fenced           bool
	steps            map[string][]time.Duration // the fence report's, per step
	commitFailed     int                        // rounds whose harness could not commit
}

func (r dockerSizeRow) String() string {
	restore, ratio, sanity := "–", "1", "– (container removed, edits lost)"
	if r.fenced {
		restore = dockerMS1(dockerMedian(r.restore))
		ratio = fmt.Sprintf("%.1fx", float64(r.fresh)/float64(dockerMedian(r.times)))
		saved := 0
		for _, s := range r.snaps {
			saved += s
		}
		sanity = fmt.Sprintf("%s; %d/%d saved", dockerInts(r.survivors), saved, len(r.snaps))
	}
	if r.commitFailed > 0 {
		sanity += fmt.Sprintf("; the harness's commit failed in %d generations", r.commitFailed)
	}
	return fmt.Sprintf("| %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.files, r.option, r.timed,
		dockerMS(dockerMedian(r.times)), dockerSpan(r.times), restore, dockerMS1(dockerMedian(r.status)), ratio, sanity)
}

// dockerSizesAt runs the three options at n files.
func dockerSizesAt(t *testing.B, n, rounds int) []dockerSizeRow {
	srv := startGitServer(t, gitServerOpts{AnonFetch: true, Seed: dockerSeedFiles})
	base := dockerSizesRepo(t, srv, n)
	const wt = "/workspace/repo"

	// start announces generation gen to box: through `shim ctl` exec'd on
	// the host, or through the Go client (what a Go supervisor calls),
	// with the same request.
	start := func(box *dockerBox, gen int, viaClient bool) api.StartResult {
		t.Helper()
		if viaClient {
			r, err := client.New(box.RuntimeDir).Start(context.Background(), api.StartRequest{
				Generation: uint64(gen), User: "1000:1000", Cwd: wt,
				Env:      []string{"HOME=/home/agent", "GEN=" + strconv.Itoa(gen), "N=" + strconv.Itoa(n)},
				Worktree: wt, Baseline: base, Network: api.NetworkHost, Command: []string{"sh", "-c", dockerSizesScript}})
			if err != nil {
				t.Fatalf("start %d in %s: %v", gen, box.Name, err)
			}
			return *r
		}
		var r api.StartResult
		box.hostCtl().must(t, &r, "start", "--generation", strconv.Itoa(gen), "--user", "1000:1000", "--cwd", wt,
			"--env", "HOME=/home/agent", "--env", "GEN="+strconv.Itoa(gen), "--env", "N="+strconv.Itoa(n),
			"--worktree", wt, "--baseline", base, "--network", "host", "--", "sh", "-c", dockerSizesScript)
		return r
	}
	// ready waits until generation gen of box (started as r) is done with
	// its edits and its daemon runs, and returns its first status's time.
	// A layered generation is seen through its root (/proc/PID/root, as
	// its uid: docker exec sees the lowers).
	ready := func(box *dockerBox, r api.StartResult, layered bool, commitFailed *int) time.Duration {
		t.Helper()
		view, user := "", ""
		if layered {
			view, user = fmt.Sprintf("/proc/%d/root", r.Pid), "agent"
		}
		g := strconv.FormatUint(r.Generation, 10)
		eventually(t, 5*time.Minute, "generation "+g+" of "+box.Name+" ready", func() bool {
			if _, err := os.Stat(filepath.Join(box.RuntimeDir, "gen", g, "exit.json")); err == nil {
				errs, _ := os.ReadFile(filepath.Join(box.RuntimeDir, "gen", g, "stderr"))
				t.Fatalf("generation %s of %s exited: %s", g, box.Name, errs)
			}
			_, _, code := box.Exec(user, "sh", "-c", "test -s "+view+"/tmp/ready-"+g+" && test -s "+view+wt+"/daemon.log")
			return code == 0
		})
		if _, _, code := box.Exec(user, "test", "-e", view+"/tmp/commit-failed-"+g); code == 0 {
			*commitFailed++
			t.Logf("generation %s of %s: its commit failed: %s", g, box.Name, box.MustExec(user, "cat", view+"/tmp/commit-failed-"+g))
		}
		ns, err := strconv.ParseInt(strings.TrimSpace(box.MustExec(user, "cat", view+"/tmp/status-"+g+".ns")), 10, 64)
		if err != nil {
			t.Fatalf("generation %s of %s: status time: %v", g, box.Name, err)
		}
		return time.Duration(ns)
	}
	boxWith := func(isolation string) *dockerBox {
		flags := append(append([]string{}, dockerFullFlags...), "-v", t.TempDir()+":/var/lib/shim")
		box := dockerRun(t, flags, "--grace", "5s", "--isolation", isolation)
		want := map[string]string{"auto": "layers", "scan": "scan"}[isolation]
		var st api.Status
		eventually(t, 30*time.Second, "the start-up probes done", func() bool {
			box.hostCtl().must(t, &st, "status")
			return st.Isolation.Mode != "probing"
		})
		if st.Mode != "cgroup2" || st.Isolation.Mode != want {
			t.Fatalf("%s: mode %s, isolation %+v, want cgroup2 and %s", box.Name, st.Mode, st.Isolation, want)
		}
		dockerClone(t, box, srv.URL)
		return box
	}

	// (a) with layers, driven through `shim ctl` and through the Go
	// client, and (a') with the scan: one container each, a generation
	// announced next to a busy one in every round.
	type inPlace struct {
		box       *dockerBox
		layered   bool
		viaClient bool
		cur       api.StartResult
		row       dockerSizeRow
	}
	const ctlTimed = "`shim ctl start --generation N+1` (exec'd on the host): fence (freeze, cut, kill, save + restore) and the new harness running"
	a := &inPlace{box: boxWith("auto"), layered: true, row: dockerSizeRow{option: "(a) fence in place, layers (`--isolation auto`, layers on a volume)", timed: ctlTimed}}
	ac := &inPlace{box: boxWith("auto"), layered: true, viaClient: true, row: dockerSizeRow{option: "(a) the same, through the Go client",
		timed: "`client.Start` over the socket: the same announcement, without `shim ctl`'s exec"}}
	sc := &inPlace{box: boxWith("scan"), row: dockerSizeRow{option: "(a') fence in place, scan (`--isolation scan`)", timed: ctlTimed}}
	inPlaces := []*inPlace{a, ac, sc}
	for _, p := range inPlaces {
		p.row.files, p.row.fenced, p.row.steps = n, true, map[string][]time.Duration{}
		p.cur = start(p.box, 1, p.viaClient)
		ready(p.box, p.cur, p.layered, &p.row.commitFailed)
	}
	// (b) fresh sandbox: a new container from the same image (the full
	// flags; the scan, since a fresh container has nothing to isolate),
	// shim ready, a clone, the harness started (through the Go client,
	// the quicker way in); the old one removed after.
	bRow := dockerSizeRow{files: n, option: "(b) fresh sandbox", timed: "`docker run` + shim ready + `git clone` + harness running (`client.Start`)"}
	var bRm []time.Duration
	old := dockerRun(t, dockerFullFlags, "--grace", "5s", "--isolation", "scan")
	dockerClone(t, old, srv.URL)
	ready(old, start(old, 1, true), false, &bRow.commitFailed)

	for i := 1; i <= rounds; i++ {
		for _, p := range inPlaces {
			t0 := time.Now()
			r := start(p.box, i+1, p.viaClient)
			p.row.times = append(p.row.times, time.Since(t0))
			if os.Getenv("SHIM_DOCKER_BENCH_STEPS") == "1" {
				// Where one round's time went: the client's, shim's own
				// (arrival to fence end, start), the fence report's and its
				// worktree's.
				var wd map[string]float64
				if w := r.Fenced[0].Worktree; w != nil {
					wd = w.DurationsMS
				}
				t.Logf("%s round %d: client %v, shim %v, fence report total %v ms, worktree %v", p.box.Name, i, time.Since(t0), r.DurationsMS, r.Fenced[0].DurationsMS["total"], wd)
			}
			if len(r.Fenced) != 1 || r.Fenced[0].Generation != uint64(i) {
				t.Fatalf("%s round %d: %+v", p.box.Name, i, r)
			}
			f := r.Fenced[0]
			if w := f.Worktree; p.layered && (w == nil || w.Isolation != "layers") {
				t.Fatalf("%s round %d: the snapshot is not the worktree layer's: %+v", p.box.Name, i, w)
			}
			p.row.restore = append(p.row.restore, time.Duration(f.DurationsMS["restore"]*float64(time.Millisecond)))
			for k, v := range f.DurationsMS {
				p.row.steps[k] = append(p.row.steps[k], time.Duration(v*float64(time.Millisecond)))
			}
			p.row.survivors = append(p.row.survivors, f.Survivors)
			saved := 0
			if f.SnapshotRef != "" {
				saved = 1
			}
			p.row.snaps = append(p.row.snaps, saved)
			p.cur = r
			p.row.status = append(p.row.status, ready(p.box, r, p.layered, &p.row.commitFailed))
		}
		t0 := time.Now()
		nb := dockerRun(t, dockerFullFlags, "--grace", "5s", "--isolation", "scan")
		dockerClone(t, nb, srv.URL)
		r := start(nb, 1, true)
		bRow.times = append(bRow.times, time.Since(t0))
		bRow.status = append(bRow.status, ready(nb, r, false, &bRow.commitFailed))
		t1 := time.Now()
		dockerMust(t, "rm", "-f", old.Name)
		bRm = append(bRm, time.Since(t1))
		old = nb
	}
	bRow.timed += fmt.Sprintf(" (old container removed after: median %s more)", dockerMS(dockerMedian(bRm)))
	fresh := dockerMedian(bRow.times)
	var rows []dockerSizeRow
	for _, p := range inPlaces {
		p.row.fresh = fresh
		rows = append(rows, p.row)
		dockerCmd("", "rm", "-f", p.box.Name) // not needed any more
	}
	dockerCmd("", "rm", "-f", old.Name)
	return append(rows, bRow)
}

func dockerMS1(d time.Duration) string {
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}

func dockerLoad() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func dockerKernel() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}
