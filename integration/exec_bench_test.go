package integration

// The benchmarks of issue 24 (tool calls through exec), under Docker with
// the image built from this checkout (images/build.sh), each measurement
// side by side with its baseline in one run, the options taking turns in
// every round so that the machine's noise falls on all of them alike.
// Reported (b.ReportMetric and a markdown table in the log), not asserted:
//
//	go test -run '^$' -bench 'BenchmarkExec' -benchtime 1x -v ./integration/
//
// SHIM_EXEC_BENCH_ROUNDS sets the rounds (default 7, at least 3).
//
//   - BenchmarkExecRoundTrip: `true` run into a layered idle generation
//     through the Go client (over the bind-mounted socket), against
//     `docker exec NAME true` into the same container, and against the
//     by-hand floor: a fresh child cgroup of the generation's made from
//     the host, nsenter cloned straight into it (CLONE_INTO_CGROUP), into
//     the holder's mount, IPC, network and pid namespaces, its root and
//     cwd, as the generation's uid, exec'ing `true`; waited for, the
//     cgroup removed.
//   - BenchmarkExecStream: a tool call writing SHIM_EXEC_BENCH_MIB MiB
//     (default 256) of zeros to stdout, read by the Go client from the
//     exec stream (shim run with `--exec-output-max -1`, so that every
//     byte reaches the reader; and with the default cap, where the call
//     writes every byte and the reader gets the first 16 MiB), against the same command's stdout through a plain
//     pipe (the same `head` on the host into this Go program) and through
//     `docker exec` (its stdout piped to this program); and the framing's
//     CPU alone (encode and decode of the frames in this program).
//   - BenchmarkExecFence: the announcement of an idle generation fencing
//     a generation running 10 tool calls (each `sh -c 'sleep 1000 & exec
//     sleep 1000'`: 2 processes) against one fencing a generation whose
//     single harness runs the same 10 subtrees (the same total number of
//     processes: holder or harness, plus 20).

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/client"
)

func execBenchRounds(t testing.TB) int {
	rounds := 7
	if s := os.Getenv("SHIM_EXEC_BENCH_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 3 {
			t.Fatalf("SHIM_EXEC_BENCH_ROUNDS: %q (at least 3)", s)
		}
		rounds = n
	}
	return rounds
}

// execBox is a container of the image on layers with a checkout, and the
// Go client on its socket.
type execBox struct {
	*dockerBox
	c    *client.Client
	base string
	gen  uint64
}

const execBenchWT = "/workspace/repo"

// newExecBox starts a container of the image (the full flags, layers on a
// volume, shim's extra init flags) with a clone of a fresh git server.
func newExecBox(t *testing.B, initArgs ...string) *execBox {
	dockerImage(t) // skips without a Docker engine
	srv := startGitServer(t, gitServerOpts{AnonFetch: true, Seed: dockerSeedFiles})
	flags := append(append([]string{}, dockerFullFlags...), "-v", t.TempDir()+":/var/lib/shim")
	box := dockerRun(t, flags, append([]string{"--grace", "5s", "--isolation", "auto"}, initArgs...)...)
	var st api.Status
	eventually(t, 30*time.Second, "the start-up probes done", func() bool {
		box.hostCtl().must(t, &st, "status")
		return st.Isolation.Mode != "probing"
	})
	if st.Mode != "cgroup2" || st.Isolation.Mode != "layers" {
		t.Fatalf("%s: mode %s, isolation %+v, want cgroup2 and layers", box.Name, st.Mode, st.Isolation)
	}
	dockerClone(t, box, srv.URL)
	return &execBox{dockerBox: box, c: client.New(box.RuntimeDir), base: srv.Seed}
}

// announce starts the next generation on the checkout as uid 1000: idle
// without a command, else running it as its harness.
func (e *execBox) announce(t testing.TB, cmd ...string) api.StartResult {
	t.Helper()
	e.gen++
	r, err := e.c.Start(context.Background(), api.StartRequest{Generation: e.gen, User: "1000:1000", Cwd: execBenchWT,
		Env: []string{"HOME=/home/agent", "GEN=" + strconv.FormatUint(e.gen, 10)}, Worktree: execBenchWT, Baseline: e.base,
		Network: api.NetworkHost, Command: cmd, Idle: len(cmd) == 0})
	if err != nil {
		t.Fatalf("start %d in %s: %v", e.gen, e.Name, err)
	}
	return *r
}

// hostPidOf is the host pid of the container's process pid (in the
// container's pid namespace): the process of the host whose pid
// namespace is the container init's and whose last NSpid is pid.
func hostPidOf(t testing.TB, container string, pid int) int {
	t.Helper()
	initPid := strings.TrimSpace(dockerMust(t, "inspect", "-f", "{{.State.Pid}}", container))
	ns, err := os.Readlink("/proc/" + initPid + "/ns/pid")
	if err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir("/proc")
	for _, d := range ents {
		if n, err := strconv.Atoi(d.Name()); err != nil || n <= 0 {
			continue
		}
		if l, _ := os.Readlink("/proc/" + d.Name() + "/ns/pid"); l != ns {
			continue
		}
		st, _ := os.ReadFile("/proc/" + d.Name() + "/status")
		for _, line := range strings.Split(string(st), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "NSpid:" && f[len(f)-1] == strconv.Itoa(pid) {
				h, _ := strconv.Atoi(d.Name())
				return h
			}
		}
	}
	t.Fatalf("no host pid for pid %d of %s", pid, container)
	return 0
}

// hostCgroupOf is the host path of a host process's cgroup2 cgroup.
func hostCgroupOf(t testing.TB, hostPid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(hostPid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	root := "/sys/fs/cgroup"
	if _, err := os.Stat("/sys/fs/cgroup/unified/cgroup.procs"); err == nil {
		root = "/sys/fs/cgroup/unified" // a hybrid host
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return filepath.Join(root, p)
		}
	}
	t.Fatalf("pid %d has no cgroup2 cgroup: %s", hostPid, b)
	return ""
}

// floorExec is the by-hand floor of a tool call: a fresh child cgroup of
// the generation's, nsenter cloned into it, entering the holder's
// namespaces, root and cwd as uid 1000, exec'ing argv; waited for, the
// cgroup removed; stdout (nil: /dev/null) gets the command's output.
func floorExec(t testing.TB, holder int, genCg string, i int, stdout io.Writer, argv ...string) {
	t.Helper()
	cg := filepath.Join(genCg, fmt.Sprintf("bench-floor-%d-%d", os.Getpid(), i))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(cg)
	fd, err := syscall.Open(cg, syscall.O_DIRECTORY|syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	cmd := exec.Command("nsenter", append([]string{"-t", strconv.Itoa(holder), "-m", "-i", "-n", "-p", "-r", "-w",
		"-S", "1000", "-G", "1000", "--"}, argv...)...)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.Stdout = stdout
	var errb bytes.Buffer
	cmd.Stderr = &errb
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	if err := cmd.Run(); err != nil {
		t.Fatalf("floor %v: %v %s", argv, err, errb.Bytes())
	}
}

func BenchmarkExecRoundTrip(b *testing.B) {
	t := b
	rounds := execBenchRounds(t)
	const perRound = 20
	e := newExecBox(t)
	load0 := dockerLoad()
	r := e.announce(t)
	holder := hostPidOf(t, e.Name, r.Pid)
	genCg := hostCgroupOf(t, holder)
	ctx := context.Background()
	opts := []struct {
		name string
		run  func(i int)
	}{
		{"shim exec (Go client)", func(int) {
			rec, err := e.c.Exec(ctx, r.Generation, api.ExecRequest{Command: []string{"true"}}, nil)
			if err != nil || rec.ExitCode == nil || *rec.ExitCode != 0 {
				t.Fatalf("exec true: %+v %v", rec, err)
			}
		}},
		{"`docker exec NAME true`", func(int) { e.MustExec("", "true") }},
		{"floor: cgroup + `nsenter` by hand", func(i int) { floorExec(t, holder, genCg, i, nil, "true") }},
	}
	all := make([][]time.Duration, len(opts))
	meds := make([][]time.Duration, len(opts))
	k := 0
	for round := 0; round < rounds; round++ {
		for o, opt := range opts {
			var ds []time.Duration
			for j := 0; j < perRound; j++ {
				k++
				t0 := time.Now()
				opt.run(k)
				ds = append(ds, time.Since(t0))
			}
			all[o] = append(all[o], ds...)
			meds[o] = append(meds[o], dockerMedian(ds))
		}
	}
	// The generation is still running, holding only its holder.
	g, err := e.c.Generation(ctx, r.Generation)
	if err != nil || g.State != api.StateRunning {
		t.Fatalf("generation %d after the benchmark: %+v %v", r.Generation, g, err)
	}
	shim, dock, floor := dockerMedian(all[0]), dockerMedian(all[1]), dockerMedian(all[2])
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nExec round trip of `true` into a layered idle generation, %d rounds of %d each, interleaved (%s, kernel %s, %s, load average %s at the start, %s at the end)\n\n",
		rounds, perRound, dockerEngine(), dockerKernel(), time.Now().UTC().Format("2006-01-02 15:04 MST"), load0, dockerLoad())
	sb.WriteString("| how | median | round medians, min – max | / docker exec | / floor |\n|---|---:|---:|---:|---:|\n")
	for o, opt := range opts {
		m := dockerMedian(all[o])
		fmt.Fprintf(&sb, "| %s | %s | %s | %.2f | %.2f |\n", opt.name, dockerMS1(m), execSpan(meds[o]), float64(m)/float64(dock), float64(m)/float64(floor))
	}
	fmt.Fprintf(&sb, "\nGoals of issue 24: shim at most 1/5 of docker exec (here %.2f), within 2x of the floor (here %.2fx).\n",
		float64(shim)/float64(dock), float64(shim)/float64(floor))
	b.Log(sb.String())
	b.ReportMetric(float64(shim)/1e6, "shim-ms")
	b.ReportMetric(float64(dock)/1e6, "docker-exec-ms")
	b.ReportMetric(float64(floor)/1e6, "floor-ms")
	b.ReportMetric(float64(shim)/float64(dock), "shim/docker")
	b.ReportMetric(float64(shim)/float64(floor), "shim/floor")
}

func execSpan(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("%.1f – %.1f ms", float64(s[0])/1e6, float64(s[len(s)-1])/1e6)
}

// countingWriter counts what it is given.
type countingWriter struct{ n atomic.Int64 }

func (c *countingWriter) Write(p []byte) (int, error) {
	c.n.Add(int64(len(p)))
	return len(p), nil
}

func BenchmarkExecStream(b *testing.B) {
	t := b
	rounds := execBenchRounds(t)
	mib := 256
	if s := os.Getenv("SHIM_EXEC_BENCH_MIB"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("SHIM_EXEC_BENCH_MIB: %q", s)
		}
		mib = n
	}
	size := int64(mib) << 20
	// e keeps every byte of a call's output (no cap), so that its reader
	// gets them all; capped keeps the default 16 MiB a stream and counts
	// the rest as dropped (the call still writes them all, through shim).
	e := newExecBox(t, "--exec-output-max", "-1")
	capped := newExecBox(t)
	load0 := dockerLoad()
	r, rc := e.announce(t), capped.announce(t)
	ctx := context.Background()
	head := []string{"head", "-c", strconv.FormatInt(size, 10), "/dev/zero"}
	var dropped, cappedRead int64
	pipe := func(name string, args ...string) {
		var w countingWriter
		cmd := exec.Command(name, args...)
		cmd.Stdout = &w
		if err := cmd.Run(); err != nil || w.n.Load() != size {
			t.Fatalf("%s %v: %v, %d bytes", name, args, err, w.n.Load())
		}
	}
	opts := []struct {
		name string
		run  func()
	}{
		{"shim exec stream (Go client, frames)", func() {
			var w countingWriter
			out := &client.Output{Stdout: &w}
			rec, err := e.c.Exec(ctx, r.Generation, api.ExecRequest{Command: head}, out)
			if err != nil || rec.ExitCode == nil || *rec.ExitCode != 0 {
				t.Fatalf("exec head: %+v %v", rec, err)
			}
			dropped += out.StdoutDropped
			if w.n.Load()+out.StdoutDropped != size {
				t.Fatalf("exec head: %d bytes read, %d dropped, want %d", w.n.Load(), out.StdoutDropped, size)
			}
		}},
		{"shim exec stream, the default cap (`--exec-output-max` 16 MiB: the call writes every byte, the client reads the first 16 MiB and a dropped frame)", func() {
			var w countingWriter
			out := &client.Output{Stdout: &w}
			rec, err := capped.c.Exec(ctx, rc.Generation, api.ExecRequest{Command: head}, out)
			if err != nil || rec.ExitCode == nil || *rec.ExitCode != 0 || w.n.Load()+out.StdoutDropped != size {
				t.Fatalf("exec head (capped): %+v %v, %d read, %d dropped", rec, err, w.n.Load(), out.StdoutDropped)
			}
			cappedRead = w.n.Load()
		}},
		{"plain pipe (`head` on the host into this program)", func() { pipe(head[0], head[1:]...) }},
		{"the framing alone: shim's `json.Encoder` of 32 KiB frames and the client's `json.Unmarshal`, in this program, no I/O (the CPU the exec stream spends a byte)", func() {
			if n := frameAlone(size); n != size {
				t.Fatalf("framing alone: %d bytes", n)
			}
		}},
		{"base64 alone: encode and decode of the same 32 KiB chunks, in this program (what the framing costs without JSON)", func() {
			if n := base64Alone(size); n != size {
				t.Fatalf("base64 alone: %d bytes", n)
			}
		}},
		{"`docker exec NAME head ...` piped into this program", func() { pipe("docker", append([]string{"exec", e.Name}, head...)...) }},
	}
	times := make([][]time.Duration, len(opts))
	for round := 0; round < rounds; round++ {
		for o, opt := range opts {
			t0 := time.Now()
			opt.run()
			times[o] = append(times[o], time.Since(t0))
		}
	}
	rate := func(d time.Duration) float64 { return float64(mib) / d.Seconds() }
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nstdout throughput, %d MiB of zeros, %d rounds interleaved (%s, kernel %s, %s, load average %s at the start, %s at the end)\n\n",
		mib, rounds, dockerEngine(), dockerKernel(), time.Now().UTC().Format("2006-01-02 15:04 MST"), load0, dockerLoad())
	sb.WriteString("| how | median MiB/s | min – max MiB/s | median time |\n|---|---:|---:|---:|\n")
	for o, opt := range opts {
		s := slices.Clone(times[o])
		slices.Sort(s)
		m := dockerMedian(times[o])
		fmt.Fprintf(&sb, "| %s | %.0f | %.0f – %.0f | %s |\n", opt.name, rate(m), rate(s[len(s)-1]), rate(s[0]), dockerMS(m))
	}
	fmt.Fprintf(&sb, "\nWithout the cap shim dropped %d bytes in all rounds; with it the client read %d bytes of each call (MiB/s there: of what the call wrote).\n", dropped, cappedRead)
	b.Log(sb.String())
	b.ReportMetric(rate(dockerMedian(times[0])), "shim-MiB/s")
	b.ReportMetric(rate(dockerMedian(times[1])), "shim-capped-MiB/s")
	b.ReportMetric(rate(dockerMedian(times[2])), "pipe-MiB/s")
	b.ReportMetric(rate(dockerMedian(times[3])), "framing-MiB/s")
	b.ReportMetric(rate(dockerMedian(times[4])), "base64-MiB/s")
	b.ReportMetric(rate(dockerMedian(times[5])), "docker-exec-MiB/s")
}

// frameAlone encodes size bytes as the exec stream's frames (shim's
// json.Encoder, 32 KiB of data a frame) and decodes them as the Go client
// does (a line, json.Unmarshal), one frame at a time; it returns the
// bytes decoded.
func frameAlone(size int64) int64 {
	data := make([]byte, 32<<10)
	var line bytes.Buffer
	enc := json.NewEncoder(&line)
	var got int64
	for off := int64(0); off < size; off += int64(len(data)) {
		line.Reset()
		enc.Encode(&api.Frame{Type: api.FrameStdout, Offset: off, Data: data})
		var f api.Frame
		if json.Unmarshal(line.Bytes(), &f) == nil {
			got += int64(len(f.Data))
		}
	}
	return got
}

// base64Alone encodes and decodes size bytes in 32 KiB chunks with
// base64.StdEncoding, as the frames carry them; it returns the bytes
// decoded.
func base64Alone(size int64) int64 {
	data := make([]byte, 32<<10)
	enc := make([]byte, base64.StdEncoding.EncodedLen(len(data)))
	dec := make([]byte, len(data))
	var got int64
	for off := int64(0); off < size; off += int64(len(data)) {
		base64.StdEncoding.Encode(enc, data)
		n, err := base64.StdEncoding.Decode(dec, enc)
		if err == nil {
			got += int64(n)
		}
	}
	return got
}

// execBenchTree is one tool call's (or one harness subtree's) processes:
// a shell that leaves a sleep behind and execs into another.
const execBenchTree = `sleep 1000 & exec sleep 1000`

// treeProcs counts the processes in the cgroup tree of a generation (its
// host path), every child cgroup included.
func treeProcs(dir string) int {
	n := 0
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "cgroup.procs" {
			b, _ := os.ReadFile(p)
			n += len(strings.Fields(string(b)))
		}
		return nil
	})
	return n
}

func BenchmarkExecFence(b *testing.B) {
	t := b
	rounds := execBenchRounds(t)
	const calls, want = 10, 1 + 2*10
	e := newExecBox(t)
	load0 := dockerLoad()
	ctx := context.Background()
	type side struct {
		name   string
		times  []time.Duration
		steps  map[string][]time.Duration
		killed []int
		surv   []int
		tools  []int
	}
	sides := []*side{{name: "10 tool calls in an idle generation"}, {name: "one harness with the same 10 subtrees"}}
	for _, s := range sides {
		s.steps = map[string][]time.Duration{}
	}
	ready := func(r api.StartResult) {
		cg := hostCgroupOf(t, hostPidOf(t, e.Name, r.Pid))
		eventually(t, time.Minute, fmt.Sprintf("%d processes in generation %d", want, r.Generation), func() bool { return treeProcs(cg) == want })
	}
	fence := func(s *side, fenced uint64) api.StartResult {
		t0 := time.Now()
		r := e.announce(t)
		s.times = append(s.times, time.Since(t0))
		if len(r.Fenced) != 1 || r.Fenced[0].Generation != fenced {
			t.Fatalf("start %d: %+v", r.Generation, r)
		}
		f := r.Fenced[0]
		s.killed, s.surv, s.tools = append(s.killed, f.Killed), append(s.surv, f.Survivors), append(s.tools, len(f.ToolCalls))
		for k, v := range f.DurationsMS {
			s.steps[k] = append(s.steps[k], time.Duration(v*float64(time.Millisecond)))
		}
		return r
	}
	harness := fmt.Sprintf(`i=0; while [ $i -lt %d ]; do sh -c '%s' & i=$((i+1)); done; wait`, calls, execBenchTree)
	cur := e.announce(t)
	for round := 0; round < rounds; round++ {
		// An idle generation running 10 tool calls, fenced.
		done := make(chan error, calls)
		for i := 0; i < calls; i++ {
			go func() {
				_, err := e.c.Exec(ctx, cur.Generation, api.ExecRequest{Command: []string{"sh", "-c", execBenchTree}}, &client.Output{})
				done <- err
			}()
		}
		ready(cur)
		fence(sides[0], cur.Generation)
		for i := 0; i < calls; i++ {
			if err := <-done; err != nil {
				t.Fatalf("a tool call's stream: %v", err)
			}
		}
		// A harness of the same processes (announced untimed: it fences
		// an empty idle generation), fenced.
		hr := e.announce(t, "sh", "-c", harness)
		ready(hr)
		cur = fence(sides[1], hr.Generation)
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nFence of a generation of %d processes, %d rounds interleaved; timed: `client.Start` of the next (idle) generation, announce to answer (%s, kernel %s, %s, load average %s at the start, %s at the end)\n\n",
		want, rounds, dockerEngine(), dockerKernel(), time.Now().UTC().Format("2006-01-02 15:04 MST"), load0, dockerLoad())
	var keys []string
	for k := range sides[0].steps {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	sb.WriteString("| fenced | announce to answer, median | min – max |")
	for _, k := range keys {
		fmt.Fprintf(&sb, " %s |", k)
	}
	sb.WriteString(" killed; survivors; tool calls listed |\n|---|---:|---:|")
	sb.WriteString(strings.Repeat("---:|", len(keys)) + "---|\n")
	for _, s := range sides {
		fmt.Fprintf(&sb, "| %s | %s | %s |", s.name, dockerMS1(dockerMedian(s.times)), execSpan(s.times))
		for _, k := range keys {
			fmt.Fprintf(&sb, " %s |", dockerMS1(dockerMedian(s.steps[k])))
		}
		fmt.Fprintf(&sb, " %s; %s; %s |\n", dockerInts(s.killed), dockerInts(s.surv), dockerInts(s.tools))
	}
	sb.WriteString("\n(the step columns are the fence report's durations_ms, medians)\n")
	b.Log(sb.String())
	b.ReportMetric(float64(dockerMedian(sides[0].times))/1e6, "toolcalls-ms")
	b.ReportMetric(float64(dockerMedian(sides[1].times))/1e6, "harness-ms")
}
