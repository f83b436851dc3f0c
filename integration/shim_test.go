package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/testutil"
)

// gen1Script is a harness that does everything a fence must survive:
// setsid daemons, a double-forked child, a process that ignores SIGTERM and
// a loop that keeps forking, then keeps working.
const gen1Script = `
setsid sleep 1000 &
setsid sh -c 'sleep 1000' &
sh -c 'sh -c "sleep 1000" &' &
sh -c 'trap "" TERM; while :; do sleep 1; done' &
sh -c 'i=0; while [ $i -lt 3000 ]; do sleep 1000 & i=$((i+1)); sleep 0.01; done; wait' &
echo ready > "$1"
while :; do date >> "$2"; sleep 0.05; done
`

func TestFenceKillsEverythingOfTheOldGeneration(t *testing.T) {
	for _, placement := range []string{"auto", "stub"} {
		t.Run(placement, func(t *testing.T) {
			s := startShim(t, shimOpts{args: []string{"--placement", placement}})
			dir := t.TempDir()
			h := script(t, dir, "gen1.sh", gen1Script)
			ready, work := filepath.Join(dir, "ready"), filepath.Join(dir, "work")

			var r1 api.StartResult
			s.MustCtl(&r1, "start", "--generation", "1", "--", h, ready, work)
			if r1.Generation != 1 || r1.Pid == 0 || !strings.HasSuffix(r1.Cgroup, "/gen-1") || len(r1.Fenced) != 0 {
				t.Fatalf("start 1: %+v", r1)
			}
			eventually(t, 10*time.Second, "gen 1 ready", func() bool { _, err := os.Stat(ready); return err == nil })
			eventually(t, 10*time.Second, "gen 1 forking", func() bool { return countProcs(r1.Cgroup) > 50 })

			var r2 api.StartResult
			s.MustCtl(&r2, "start", "--generation", "2", "--", "sleep", "1000")
			if len(r2.Fenced) != 1 {
				t.Fatalf("gen 2 should fence exactly gen 1: %+v", r2)
			}
			rep := r2.Fenced[0]
			if rep.Generation != 1 || rep.Survivors != 0 || rep.Killed < 50 {
				t.Fatalf("fence report: %+v", rep)
			}
			for _, step := range []string{"freeze", "cut", "kill", "start"} {
				if _, ok := rep.DurationsMS[step]; !ok {
					t.Errorf("fence report lacks duration of %s: %v", step, rep.DurationsMS)
				}
			}
			if _, err := os.Stat(r1.Cgroup); !os.IsNotExist(err) {
				t.Errorf("gen-1 cgroup still exists: %v", err)
			}
			// Nothing of gen 1 writes any more.
			before := len(readLines(work))
			time.Sleep(300 * time.Millisecond)
			if after := len(readLines(work)); after != before {
				t.Errorf("gen 1 still writing after the fence: %d -> %d lines", before, after)
			}
			// Only shim and gen 2's harness are left in the namespace.
			eventually(t, 5*time.Second, "only shim and gen 2 left", func() bool { return len(s.PidnsProcs()) == 2 })

			var st api.Status
			s.MustCtl(&st, "status")
			if st.Generation != 2 || st.State != api.StateRunning || st.Pid != r2.Pid || st.Mode != "cgroup2" {
				t.Errorf("status: %+v", st)
			}
			var exit api.Exit
			s.MustCtl(&exit, "generation", "--generation", "1")
		})
	}
}

func countProcs(cgroup string) int {
	b, err := os.ReadFile(filepath.Join(cgroup, "cgroup.procs"))
	if err != nil {
		return 0
	}
	return len(strings.Fields(string(b)))
}

func TestStaleAndConflictingAnnouncements(t *testing.T) {
	s := startShim(t, shimOpts{})
	var r2 api.StartResult
	s.MustCtl(&r2, "start", "--generation", "2", "--", "sleep", "1000")

	_, errs, code := s.Ctl("start", "--generation", "1", "--", "sleep", "1000")
	if code != 3 || !strings.Contains(errs, api.CodeStaleGeneration) {
		t.Fatalf("stale announcement: exit %d, %s", code, errs)
	}
	_, errs, code = s.Ctl("start", "--generation", "2", "--", "sleep", "999")
	if code != 3 || !strings.Contains(errs, api.CodeGenerationConflict) {
		t.Fatalf("conflicting announcement: exit %d, %s", code, errs)
	}
	var again api.StartResult
	s.MustCtl(&again, "start", "--generation", "2", "--", "sleep", "1000")
	if again.Pid != r2.Pid || !again.StartedAt.Equal(r2.StartedAt) {
		t.Fatalf("identical retry should get the first answer: %+v vs %+v", again, r2)
	}

	// fence N: N becomes the lowest generation start accepts.
	var fr api.FenceResult
	s.MustCtl(&fr, "fence", "--generation", "5")
	if len(fr.Fenced) != 1 || fr.Fenced[0].Generation != 2 || fr.Fenced[0].Survivors != 0 {
		t.Fatalf("fence 5: %+v", fr)
	}
	if _, errs, code := s.Ctl("start", "--generation", "4", "--", "true"); code != 3 {
		t.Fatalf("start 4 after fence 5: exit %d %s", code, errs)
	}
	var r5 api.StartResult
	s.MustCtl(&r5, "start", "--generation", "5", "--", "sleep", "1000")
	if len(r5.Fenced) != 0 {
		t.Fatalf("nothing left to fence at 5: %+v", r5)
	}
}

func TestConcurrentAnnouncementsOneWins(t *testing.T) {
	s := startShim(t, shimOpts{})
	const n = 8
	type res struct {
		code int
		out  string
		errs string
	}
	results := make(chan res, n)
	for i := 0; i < n; i++ {
		go func(i int) {
			out, errs, code := s.Ctl("start", "--generation", "3", "--", "sleep", strconv.Itoa(1000+i))
			results <- res{code, out, errs}
		}(i)
	}
	wins, conflicts := 0, 0
	for i := 0; i < n; i++ {
		r := <-results
		switch {
		case r.code == 0:
			wins++
		case r.code == 3 && strings.Contains(r.errs, api.CodeGenerationConflict):
			conflicts++
		default:
			t.Errorf("unexpected answer: %+v", r)
		}
	}
	if wins != 1 || conflicts != n-1 {
		t.Fatalf("wins %d conflicts %d", wins, conflicts)
	}
}

func TestOrphansAreReaped(t *testing.T) {
	s := startShim(t, shimOpts{})
	dir := t.TempDir()
	h := script(t, dir, "orphans.sh", `
i=0
while [ $i -lt 1000 ]; do ( sleep 0.01 & ) ; i=$((i+1)); done
echo done > "$1"
sleep 1000
`)
	done := filepath.Join(dir, "done")
	s.MustCtl(nil, "start", "--generation", "1", "--", h, done)
	eventually(t, 60*time.Second, "1000 orphans spawned", func() bool { _, err := os.Stat(done); return err == nil })
	// Every orphan comes back to shim and is reaped: the count reaches 1000
	// and no zombie is left in the namespace.
	eventually(t, 10*time.Second, "1000 orphans reaped and no zombies", func() bool {
		var st api.Status
		s.MustCtl(&st, "status")
		if st.Orphans < 1000 {
			return false
		}
		for _, state := range s.PidnsProcs() {
			if state == "Z" {
				return false
			}
		}
		return true
	})
}

func TestSignalsReachTheHarness(t *testing.T) {
	s := startShim(t, shimOpts{})
	dir := t.TempDir()
	got := filepath.Join(dir, "got")
	h := script(t, dir, "trap.sh", `
for sig in HUP USR1 USR2 WINCH; do trap "echo $sig >> $1" $sig; done
echo ready >> "$1"
while :; do sleep 0.05; done
`)
	s.MustCtl(nil, "start", "--generation", "1", "--", h, got)
	eventually(t, 5*time.Second, "harness ready", func() bool { return len(readLines(got)) > 0 })
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH} {
		s.Cmd.Process.Signal(sig)
		time.Sleep(200 * time.Millisecond)
	}
	eventually(t, 5*time.Second, "all four signals", func() bool { return len(readLines(got)) == 5 })
	// ctl signal as well
	s.MustCtl(nil, "signal", "--generation", "1", "USR1")
	eventually(t, 5*time.Second, "ctl signal", func() bool { return len(readLines(got)) == 6 })
}

func TestSigtermShutdownExitCode(t *testing.T) {
	t.Run("harness exits on TERM", func(t *testing.T) {
		s := startShim(t, shimOpts{})
		dir := t.TempDir()
		ready := filepath.Join(dir, "ready")
		h := script(t, dir, "term.sh", `trap 'exit 7' TERM; echo > "$1"; while :; do sleep 0.05; done`)
		s.MustCtl(nil, "start", "--generation", "1", "--", h, ready)
		eventually(t, 5*time.Second, "ready", func() bool { _, err := os.Stat(ready); return err == nil })
		s.Cmd.Process.Signal(syscall.SIGTERM)
		code, ok := s.Wait(10 * time.Second)
		if !ok || code != 7 {
			t.Fatalf("shim exit: %d (exited %v), want 7", code, ok)
		}
	})
	t.Run("harness ignores TERM", func(t *testing.T) {
		s := startShim(t, shimOpts{args: []string{"--grace", "500ms"}})
		dir := t.TempDir()
		ready := filepath.Join(dir, "ready")
		h := script(t, dir, "ignore.sh", `trap '' TERM; echo > "$1"; while :; do sleep 0.05; done`)
		s.MustCtl(nil, "start", "--generation", "1", "--", h, ready)
		eventually(t, 5*time.Second, "ready", func() bool { _, err := os.Stat(ready); return err == nil })
		s.Cmd.Process.Signal(syscall.SIGTERM)
		code, ok := s.Wait(10 * time.Second)
		if !ok || code != 128+9 {
			t.Fatalf("shim exit: %d (exited %v), want 137", code, ok)
		}
	})
}

func TestPeerInsideHarnessIsRefused(t *testing.T) {
	s := startShim(t, shimOpts{})
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	h := script(t, dir, "peer.sh", fmt.Sprintf(`%s ctl --runtime-dir %s status > %s.stdout 2> %s.stderr; echo $? > %s`, shimBin, s.RuntimeDir, out, out, out))
	s.MustCtl(nil, "start", "--generation", "1", "--", h)
	eventually(t, 10*time.Second, "harness ctl finished", func() bool { return len(readLines(out)) == 1 })
	if code := readLines(out)[0]; code == "0" {
		t.Fatalf("a harness process controlled shim (exit %s)", code)
	}
	errs, _ := os.ReadFile(out + ".stderr")
	if !strings.Contains(string(errs), api.CodePeerNotAllowed) {
		t.Fatalf("want %s, got %s", api.CodePeerNotAllowed, errs)
	}
	// The audit log has the refusal.
	audit, _ := os.ReadFile(filepath.Join(s.RuntimeDir, "audit.jsonl"))
	if !strings.Contains(string(audit), "peer_refused") {
		t.Fatalf("audit log lacks the refusal")
	}
}

func TestMalformedRequestsAreRefusedAndShimKeepsServing(t *testing.T) {
	s := startShim(t, shimOpts{})
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return net.Dial("unix", filepath.Join(s.RuntimeDir, "shim.sock"))
	}}}
	cases := []struct {
		name, method, path, body string
		status                   int
	}{
		{"truncated json", "POST", "/v1/generations", `{"generation": 1, "command": [`, 400},
		{"unknown field", "POST", "/v1/generations", `{"generation": 1, "command": ["true"], "bogus": 1}`, 400},
		{"zero generation", "POST", "/v1/generations", `{"generation": 0, "command": ["true"]}`, 400},
		{"empty command", "POST", "/v1/generations", `{"generation": 1, "command": [""]}`, 400},
		{"negative generation", "POST", "/v1/generations", `{"generation": -1, "command": ["true"]}`, 400},
		{"oversized", "POST", "/v1/generations", `{"generation": 1, "command": ["` + strings.Repeat("a", 2<<20) + `"]}`, 400},
		{"bad network", "POST", "/v1/generations", `{"generation": 1, "command": ["true"], "network": "wide"}`, 400},
		{"bad generation path", "GET", "/v1/generations/abc", ``, 400},
		{"unknown endpoint", "GET", "/v1/nope", ``, 404},
		{"bad signal", "POST", "/v1/generations/1/signal", `{"signal": "SIGNOPE"}`, 400},
	}
	for _, c := range cases {
		req, _ := http.NewRequest(c.method, "http://shim"+c.path, strings.NewReader(c.body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var e api.Error
		json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != c.status || e.Code == "" {
			t.Errorf("%s: HTTP %d %+v, want %d with a code", c.name, resp.StatusCode, e, c.status)
		}
	}
	// Garbage that is not HTTP at all.
	conn, err := net.Dial("unix", filepath.Join(s.RuntimeDir, "shim.sock"))
	if err == nil {
		conn.Write([]byte("\x00\x01\x02 not http\r\n\r\n"))
		conn.Close()
	}
	var st api.Status
	s.MustCtl(&st, "status")
	if st.State != api.StateIdle {
		t.Fatalf("state after garbage: %+v", st)
	}
}

func TestRestartRefusesPersistedGenerations(t *testing.T) {
	rd := t.TempDir()
	root := filepath.Join(cgroup2Mount(), randName("shim-it-"))
	t.Cleanup(func() { removeCgroupTree(t, root) })
	s := startShim(t, shimOpts{runtimeDir: rd, cgroupRoot: root})
	s.MustCtl(nil, "start", "--generation", "7", "--", "sleep", "1000")
	s.Cmd.Process.Signal(syscall.SIGTERM)
	if _, ok := s.Wait(10 * time.Second); !ok {
		t.Fatal("shim did not stop")
	}
	s2 := startShim(t, shimOpts{runtimeDir: rd, cgroupRoot: root})
	for _, g := range []string{"6", "7"} {
		_, errs, code := s2.Ctl("start", "--generation", g, "--", "sleep", "1")
		if code != 3 {
			t.Errorf("generation %s after restart: exit %d %s", g, code, errs)
		}
	}
	var st api.Status
	s2.MustCtl(&st, "status")
	if st.Generation != 7 {
		t.Fatalf("highest after restart: %d", st.Generation)
	}
	s2.MustCtl(nil, "start", "--generation", "8", "--", "sleep", "1000")
}

func TestWaitReportsTheHarnessExitCode(t *testing.T) {
	s := startShim(t, shimOpts{})
	s.MustCtl(nil, "start", "--generation", "1", "--", "sh", "-c", "exit 42")
	out, _, code := s.Ctl("wait", "--generation", "1")
	if code != 42 {
		t.Fatalf("wait exit code %d, want 42 (%s)", code, out)
	}
	var e api.Exit
	json.Unmarshal([]byte(out), &e)
	if e.ExitCode != 42 || e.Fenced {
		t.Fatalf("exit record: %+v", e)
	}
	b, err := os.ReadFile(filepath.Join(s.RuntimeDir, "gen", "1", "exit.json"))
	if err != nil || !strings.Contains(string(b), `"exit_code": 42`) {
		t.Fatalf("exit.json: %s %v", b, err)
	}
	// An exited generation is still fenced: its leftover daemon dies.
	s.MustCtl(nil, "start", "--generation", "2", "--", "sh", "-c", "setsid sleep 1000 & exit 0")
	eventually(t, 5*time.Second, "gen 2 exited", func() bool {
		var g api.Generation
		s.MustCtl(&g, "generation", "--generation", "2")
		return g.State == api.StateExited
	})
	var r3 api.StartResult
	s.MustCtl(&r3, "start", "--generation", "3", "--", "sleep", "1000")
	if len(r3.Fenced) != 1 || r3.Fenced[0].StateBefore != api.StateExited || r3.Fenced[0].Killed != 1 {
		t.Fatalf("fence of an exited generation: %+v", r3.Fenced)
	}
}

// A kill that cannot be confirmed within the deadline fails the fence
// closed: exit 4, FENCE_FAILED, state failed, the new generation does not
// start; a later announcement retries the fence and succeeds.
func TestUnconfirmedKillFailsClosed(t *testing.T) {
	s := startShim(t, shimOpts{args: []string{"--kill-timeout", "1ms"}})
	// Whether a thousand processes can be confirmed dead within 1ms is up
	// to the machine: a fast one (or a lucky moment) confirms it, and that
	// fence rightly succeeds. So each attempt that is confirmed in time is
	// let be, and the next one has twice as many processes, until a kill
	// is not confirmed within the deadline: that fence must fail closed.
	loop := func(n int) string {
		return fmt.Sprintf("i=0; while [ $i -lt %d ]; do sleep 1000 & i=$((i+1)); done; wait", n)
	}
	var r1 api.StartResult
	gen, procs := 1, 1000
	s.MustCtl(&r1, "start", "--generation", "1", "--", "sh", "-c", loop(procs))
	var out, errs string
	var code int
	for attempt := 0; ; attempt++ {
		eventually(t, 60*time.Second, fmt.Sprintf("%d processes", procs), func() bool { return countProcs(r1.Cgroup) > procs })
		out, errs, code = s.Ctl("start", "--generation", strconv.Itoa(gen+1), "--", "sh", "-c", loop(2*procs))
		if code != 0 || attempt == 3 {
			break
		}
		t.Logf("a kill of %d processes was confirmed within 1ms; again with %d", procs, 2*procs)
		if err := json.Unmarshal([]byte(out), &r1); err != nil {
			t.Fatalf("start %d: %v: %s", gen+1, err, out)
		}
		gen, procs = gen+1, 2*procs
	}
	if code != 4 || !strings.Contains(errs, api.CodeFenceFailed) {
		t.Fatalf("want exit 4 FENCE_FAILED, got %d: %s %s", code, out, errs)
	}
	gen2 := strconv.Itoa(gen + 1)
	var st api.Status
	s.MustCtl(&st, "status")
	if st.State != api.StateFailed || st.Error == nil || st.Error.Code != api.CodeFenceFailed || st.Pid != 0 {
		t.Fatalf("status after a failed fence: %+v", st)
	}
	if _, err := os.Stat(filepath.Join(s.CgroupRoot, "gen-"+gen2)); !os.IsNotExist(err) {
		t.Fatalf("generation %s started despite the failed fence", gen2)
	}
	// The processes are dead by now (the kill was sent); a retry confirms it.
	eventually(t, 10*time.Second, "the fenced generation emptied", func() bool { return countProcs(r1.Cgroup) == 0 })
	var r3 api.StartResult
	s.MustCtl(&r3, "start", "--generation", strconv.Itoa(gen+2), "--", "sleep", "1000")
	if len(r3.Fenced) != 1 || r3.Fenced[0].Generation != uint64(gen) || r3.Fenced[0].Survivors != 0 {
		t.Fatalf("retry: %+v", r3.Fenced)
	}
	var after api.Status
	s.MustCtl(&after, "status")
	if after.State != api.StateRunning || after.Error != nil {
		t.Fatalf("status after the retry: %+v", after)
	}
	audit, _ := os.ReadFile(filepath.Join(s.RuntimeDir, "audit.jsonl"))
	if !strings.Contains(string(audit), `"event":"fence_failed"`) {
		t.Fatal("audit log lacks the failed fence")
	}
}

// TestFreezeNotConfirmedFailsClosed: a harness the kernel cannot freeze
// (a write into a filesystem frozen with fsfreeze sleeps uninterruptibly:
// cgroup.events never says frozen 1, and no signal wakes it) makes the
// fence fail with FREEZE_FAILED (exit 4) naming the freeze; the kill was
// sent anyway, so once the filesystem thaws generation 1 is gone and a
// retry fences it. (By construction, not by a deadline that loses a race.)
func TestFreezeNotConfirmedFailsClosed(t *testing.T) {
	requireRoot(t)
	testutil.NeedTool(t, "fsfreeze")
	d := newPowerDisk(t)
	thaw := func() { _ = exec.Command("fsfreeze", "-u", d.mnt).Run() }
	if out, err := exec.Command("fsfreeze", "-f", d.mnt).CombinedOutput(); err != nil {
		t.Fatalf("fsfreeze: %v %s", err, out)
	}
	s := startShim(t, shimOpts{args: []string{"--freeze-timeout", "300ms"}})
	t.Cleanup(thaw) // before shim's teardown waits for its cgroups to empty (cleanups run last first)
	var r1 api.StartResult
	s.MustCtl(&r1, "start", "--generation", "1", "--", "sh", "-c", "echo x > "+d.mnt+"/f")
	eventually(t, 30*time.Second, "the harness asleep in the frozen filesystem", func() bool {
		procs, _ := os.ReadFile(filepath.Join(r1.Cgroup, "cgroup.procs")) // host pids (r1.Pid is shim's namespace's)
		pid := strings.TrimSpace(string(procs))
		b, err := os.ReadFile("/proc/" + pid + "/stat")
		if pid == "" || strings.Contains(pid, "\n") || err != nil {
			return false
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		// Asleep in the frozen filesystem's write lock, not in a passing
		// D state (a page-in under load): a CI run took one for the other,
		// and the fence's kill then ended the harness before its write.
		wchan, _ := os.ReadFile("/proc/" + pid + "/wchan")
		return len(f) > 0 && f[0] == "D" && strings.Contains(string(wchan), "percpu_rwsem")
	})
	_, errs, code := s.Ctl("start", "--generation", "2", "--", "sleep", "1000")
	if code != 4 || !strings.Contains(errs, "freeze") {
		t.Fatalf("want exit 4 naming the freeze, got %d: %s", code, errs)
	}
	if n := countProcs(r1.Cgroup); n != 1 {
		t.Fatalf("%d processes in gen 1's cgroup while the filesystem is frozen, want the sleeper", n)
	}
	thaw()
	// The kill was sent: the writer dies as it wakes.
	eventually(t, 10*time.Second, "gen 1 killed anyway", func() bool { return countProcs(r1.Cgroup) == 0 })
	var r3 api.StartResult
	s.MustCtl(&r3, "start", "--generation", "3", "--", "sleep", "1000")
	if len(r3.Fenced) != 1 || r3.Fenced[0].Generation != 1 || r3.Fenced[0].Survivors != 0 {
		t.Fatalf("retry: %+v", r3.Fenced)
	}
}

// The fallbacks fence just as completely: the v1 freezer (Docker on a
// cgroup v1 host) and the process sweep (no usable cgroups, shim PID 1 of
// its own pid namespace).
func TestFenceInFallbackModes(t *testing.T) {
	cases := []struct {
		mode string
		root func(t *testing.T) string
	}{
		{"cgroup1", func(t *testing.T) string {
			var st syscall.Statfs_t
			if syscall.Statfs("/sys/fs/cgroup/freezer", &st) != nil || st.Type != 0x27e0eb {
				requireRoot(t)
				testutil.Need(t, false, "no cgroup v1 freezer at /sys/fs/cgroup/freezer")
			}
			root := filepath.Join("/sys/fs/cgroup/freezer", randName("shim-it-"))
			t.Cleanup(func() { removeCgroupTree(t, root) })
			return root
		}},
		{"pidns", func(t *testing.T) string { return "" }},
	}
	for _, c := range cases {
		t.Run(c.mode, func(t *testing.T) {
			requireRoot(t)
			o := shimOpts{args: []string{"--mode", c.mode}, cgroupRoot: c.root(t)}
			s := startShim(t, o)
			var st api.Status
			s.MustCtl(&st, "status")
			if st.Mode != c.mode {
				t.Fatalf("mode %q, want %q (%s)", st.Mode, c.mode, st.ModeReason)
			}
			dir := t.TempDir()
			h := script(t, dir, "gen1.sh", gen1Script)
			ready, work := filepath.Join(dir, "ready"), filepath.Join(dir, "work")
			s.MustCtl(nil, "start", "--generation", "1", "--", h, ready, work)
			eventually(t, 10*time.Second, "gen 1 ready", func() bool { _, err := os.Stat(ready); return err == nil })
			eventually(t, 10*time.Second, "gen 1 forking", func() bool { return len(s.PidnsProcs()) > 30 })
			var r2 api.StartResult
			s.MustCtl(&r2, "start", "--generation", "2", "--", "sleep", "1000")
			if len(r2.Fenced) != 1 || r2.Fenced[0].Survivors != 0 || r2.Fenced[0].Killed < 25 {
				t.Fatalf("fence report: %+v", r2.Fenced)
			}
			eventually(t, 5*time.Second, "only shim and gen 2 left", func() bool { return len(s.PidnsProcs()) == 2 })
		})
	}
}

func TestEventsStream(t *testing.T) {
	s := startShim(t, shimOpts{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan api.Event, 64)
	go s.Client.Events(ctx, func(ev api.Event) error { got <- ev; return nil })
	time.Sleep(100 * time.Millisecond) // let the subscription register
	s.MustCtl(nil, "start", "--generation", "1", "--", "sleep", "1000")
	s.MustCtl(nil, "start", "--generation", "2", "--", "sh", "-c", "exit 3")
	want := []string{"started/1", "fencing/1", "exited/1", "fenced/1", "started/2", "exited/2"}
	seen := map[string]bool{}
	deadline := time.After(10 * time.Second)
	for len(seen) < len(want) {
		select {
		case ev := <-got:
			seen[fmt.Sprintf("%s/%d", ev.Type, ev.Generation)] = true
		case <-deadline:
			t.Fatalf("events seen %v, want all of %v", seen, want)
		}
		ok := true
		for _, w := range want {
			ok = ok && seen[w]
		}
		if ok {
			return
		}
	}
}

func TestLimitsNeedTheirController(t *testing.T) {
	s := startShim(t, shimOpts{})
	ctrls, _ := os.ReadFile(filepath.Join(s.CgroupRoot, "cgroup.controllers"))
	out, errs, code := s.Ctl("start", "--generation", "1", "--pids-max", "64", "--", "sleep", "1000")
	if strings.Contains(string(ctrls), "pids") {
		var r api.StartResult
		if code != 0 || json.Unmarshal([]byte(out), &r) != nil {
			t.Fatalf("pids available but start failed: %d %s", code, errs)
		}
		b, _ := os.ReadFile(filepath.Join(r.Cgroup, "pids.max"))
		if strings.TrimSpace(string(b)) != "64" {
			t.Fatalf("pids.max = %q", b)
		}
		return
	}
	if code == 0 || !strings.Contains(errs, api.CodeControllerMissing) || !strings.Contains(errs, "pids") {
		t.Fatalf("want CONTROLLER_MISSING naming pids, got %d: %s", code, errs)
	}
	var st api.Status
	s.MustCtl(&st, "status")
	if st.Pid != 0 {
		t.Fatalf("a generation started without its limit: %+v", st)
	}
}

// A supervisor that stops reading shim's log must not kill PID 1: Go exits
// on a write to a broken stdout or stderr unless SIGPIPE is caught.
func TestBrokenLogPipeDoesNotKillShim(t *testing.T) {
	s := startShim(t, shimOpts{brokenLog: true})
	s.MustCtl(nil, "start", "--generation", "1", "--", "sleep", "1000")
	s.MustCtl(nil, "start", "--generation", "2", "--", "sleep", "1000")
	var st api.Status
	s.MustCtl(&st, "status")
	if st.Generation != 2 || st.State != api.StateRunning {
		t.Fatalf("status: %+v", st)
	}
}

// In pidns mode a fence spares connected control peers (the client asking
// for it), but only allowed ones: a harness process holding a connection
// that was refused (it is in the harness's session) is killed like the rest.
func TestRefusedPeerIsNotSparedByAPidnsSweep(t *testing.T) {
	s := startShim(t, shimOpts{args: []string{"--mode", "pidns"}})
	dir := t.TempDir()
	beat := filepath.Join(dir, "beat")
	holder := script(t, dir, "hold.sh", fmt.Sprintf(`exec perl -MIO::Socket::UNIX -e '
my $s = IO::Socket::UNIX->new(Peer => "%s/shim.sock") or die "connect: $!";
$| = 1;
while (1) { open(my $f, ">>", "%s") or die; print $f "x\n"; close $f; select(undef, undef, undef, 0.05); }'
`, s.RuntimeDir, beat))
	s.MustCtl(nil, "start", "--generation", "1", "--", holder)
	eventually(t, 10*time.Second, "holder connected and beating", func() bool { return len(readLines(beat)) > 3 })
	var r2 api.StartResult
	s.MustCtl(&r2, "start", "--generation", "2", "--", "sleep", "1000")
	if len(r2.Fenced) != 1 || r2.Fenced[0].Killed < 1 || r2.Fenced[0].Survivors != 0 {
		t.Fatalf("fence report: %+v", r2.Fenced)
	}
	n := len(readLines(beat))
	time.Sleep(300 * time.Millisecond)
	if m := len(readLines(beat)); m != n {
		t.Fatalf("the refused peer survived the fence: %d -> %d beats", n, m)
	}
}

// A generation ended by a shutdown (or a crash after its kill) still has
// its abandoned edits in the worktree; the next shim saves and restores
// them at the next fence instead of handing them to the new harness.
func TestRestorePendingAcrossARestart(t *testing.T) {
	rd := t.TempDir()
	root := filepath.Join(cgroup2Mount(), randName("shim-it-"))
	t.Cleanup(func() { removeCgroupTree(t, root) })
	work := t.TempDir()
	wt := filepath.Join(work, "wt")
	gitc := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@x", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@x")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	gitc("init", "-q", "-b", "main", wt)
	os.WriteFile(filepath.Join(wt, "a.txt"), []byte("base\n"), 0o644)
	gitc("-C", wt, "add", "-A")
	gitc("-C", wt, "commit", "-qm", "base")
	base := gitc("-C", wt, "rev-parse", "HEAD")

	s := startShim(t, shimOpts{runtimeDir: rd, cgroupRoot: root})
	s.MustCtl(nil, "start", "--generation", "1", "--worktree", wt, "--baseline", base, "--",
		"sh", "-c", "echo abandoned >> a.txt; echo new > b.txt; exec sleep 1000")
	eventually(t, 5*time.Second, "gen 1 edited", func() bool { _, err := os.Stat(filepath.Join(wt, "b.txt")); return err == nil })
	s.Cmd.Process.Signal(syscall.SIGTERM)
	if _, ok := s.Wait(10 * time.Second); !ok {
		t.Fatal("shim did not stop")
	}

	s2 := startShim(t, shimOpts{runtimeDir: rd, cgroupRoot: root})
	var r2 api.StartResult
	s2.MustCtl(&r2, "start", "--generation", "2", "--worktree", wt, "--baseline", base, "--", "sleep", "1000")
	if len(r2.Fenced) != 1 || r2.Fenced[0].Generation != 1 || r2.Fenced[0].SnapshotRef != "refs/shim/abandoned/1" {
		t.Fatalf("the restore pending from generation 1 was not done: %+v", r2.Fenced)
	}
	if st := gitc("-C", wt, "status", "--porcelain"); st != "" {
		t.Fatalf("worktree not restored: %q", st)
	}
	if got := gitc("-C", wt, "show", "refs/shim/abandoned/1:b.txt"); got != "new" {
		t.Fatalf("b.txt in the snapshot: %q", got)
	}
}
