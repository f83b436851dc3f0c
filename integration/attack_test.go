package integration

// Issue 8 end to end: a hostile generation tries to stop, outlive or take
// down its own fence. Every attack runs the harness as the unprivileged uid
// that owns the worktree, with a credential hammer beside it (the broker
// asked in a loop, as the credential helper and through git), and shows:
// nothing of the old generation is left (its cgroup is gone, no process of
// shim's pid namespace is in it), the broker answered it nothing from the
// moment the announcement began (shim's own "fencing" event), a stable code
// where the new generation cannot start, shim still serving, and shim
// exiting on SIGTERM within --grace plus the kill timeout.
//
// The network attacks (a push in flight, secrets of shim's own fetch) are
// in attack_net_test.go.

import (
	"bufio"
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
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/testutil"
)

// atkHost is the host of the hammer's credential.
const atkHost = "attack.invalid"

// atkStopBound is how long shim may take to exit on SIGTERM: startShim's
// --grace 2s plus the default --kill-timeout 10s, and 3s for the test's own
// scheduling on a loaded machine.
const atkStopBound = 2*time.Second + 10*time.Second + 3*time.Second

// atkPrelude defines hammer: ask the broker for the credential in a loop,
// through `shim credential get` and through git's credential helper, from
// outside the worktree (its .git may be a FIFO), and count the rounds in
// $ATTACK_OUT/asked. Each helper request logs its pid (the one the broker
// sees: the sh that execs the helper) and when it began in
// $ATTACK_OUT/asks. Every harness here runs it.
const atkPrelude = `
hammer() {
	( cd / || exit 1
	  printf 'protocol=https\nhost=attack.invalid\npath=repo\n\n' > "$ATTACK_OUT/req"
	  while :; do
		sh -c 'echo "$$ $(date +%s%N)" >> "$ATTACK_OUT/asks"; exec "$ATTACK_SHIM" credential get < "$ATTACK_OUT/req"'
		git credential fill < "$ATTACK_OUT/req"
		echo >> "$ATTACK_OUT/asked"
		sleep 0.02
	  done ) </dev/null >/dev/null 2>&1 &
}
`

// atkRig is one shim under attack: its runtime dir (traversable, so the
// harness reaches cred.sock), the hammer's credential file, a dir the
// harness may write (out) and its HOME, and shim's event stream.
type atkRig struct {
	t    *testing.T
	s    *Shim
	rd   string
	cf   string
	out  string
	home string
	ev   *atkEvents
}

// newAtkRig starts shim with o (a traversable runtime dir unless o names
// one) and the hammer's credential plus extra credentials.
func newAtkRig(t *testing.T, o shimOpts, extra ...map[string]string) *atkRig {
	t.Helper()
	requireRoot(t)
	if o.runtimeDir == "" {
		o.runtimeDir = credDir(t, -1)
	}
	list := append([]map[string]string{{"protocol": "https", "host": atkHost, "username": "attacker", "password": credSecret("hammer")}}, extra...)
	a := &atkRig{t: t, rd: o.runtimeDir, cf: credFile(t, list), out: credDir(t, wtUID), home: credDir(t, wtUID)}
	a.s = startShim(t, o)
	a.ev = atkWatchEvents(t, a.s)
	return a
}

// harnessArgs are the flags every attacking generation gets besides its
// user: the hammer's environment and the credentials.
func (a *atkRig) harnessArgs() []string {
	return []string{"--env", "ATTACK_SHIM=" + shimBin, "--env", "ATTACK_OUT=" + a.out, "--credential-file", a.cf}
}

// plainArgs start a generation as wtUID without a worktree, in its HOME.
func (a *atkRig) plainArgs(gen int, extra ...string) []string {
	args := append([]string{"start", "--generation", strconv.Itoa(gen)}, credHarnessArgs(a.home)...)
	args = append(args, "--env", "PATH=/usr/bin:/bin")
	return append(append(args, a.harnessArgs()...), extra...)
}

// script writes a harness script with the hammer defined.
func (a *atkRig) script(dir, name, body string) string {
	return script(a.t, dir, name, atkPrelude+body)
}

// waitReady waits for the harness's ready file and for the hammer to have
// been answered at least twice (the attack is live and the broker serves it).
func (a *atkRig) waitReady(gen uint64, timeout time.Duration) {
	a.t.Helper()
	eventually(a.t, timeout, fmt.Sprintf("generation %d ready and hammering", gen), func() bool {
		_, err := os.Stat(filepath.Join(a.out, "ready"))
		return err == nil && len(atkGrants(a.rd, gen)) >= 2
	})
}

// atkAnnounced is one announcement as the test saw it: ctl's answer, when
// it was sent, when shim began fencing the old generation (its "fencing"
// event, published once the token is raised and the broker refuses it) and
// how long ctl took.
type atkAnnounced struct {
	out, errs   string
	code        int
	sent, began time.Time
	took        time.Duration
}

// announce runs ctl args with a deadline (a hung announcement is a finding,
// not a hung test) and finds when shim began fencing generation old.
func (a *atkRig) announce(old uint64, timeout time.Duration, args ...string) atkAnnounced {
	a.t.Helper()
	x := atkAnnounced{sent: time.Now()}
	x.out, x.errs, x.code = atkCtl(a.rd, timeout, args...)
	x.took = time.Since(x.sent)
	// The event is published before the freeze; it may be read after ctl
	// returned. None within 5s: the announcement never began a fence.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if b, ok := a.ev.first(api.EventFencing, old); ok {
			x.began = b
			break
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return x
}

// checkGone checks that generation gen (whose cgroup was cg) is gone and
// that the broker answered it nothing once its fence began: no answer to a
// request begun after shim's fencing event (asks: the dir of the harness's
// request log), and no answer recorded after the announcement returned. An
// answer recorded after the event to a request begun before it was in
// flight when the token was raised (decided before, recorded after): it is
// counted and logged. It returns the answers recorded between the
// announcement's sending and the fencing event.
func (a *atkRig) checkGone(x atkAnnounced, gen uint64, cg, asks string) int {
	a.t.Helper()
	t := a.t
	boundary := x.began
	if boundary.IsZero() {
		t.Errorf("shim published no fencing event for generation %d: the announcement (exit %d, %s) never began a fence", gen, x.code, strings.TrimSpace(x.errs))
		boundary = x.sent
	}
	if _, err := os.Stat(cg); !os.IsNotExist(err) {
		t.Errorf("generation %d's cgroup %s is still there (%v)", gen, cg, err)
	}
	if pids := atkGenProcs(a.s, gen); len(pids) != 0 {
		t.Errorf("%d processes of generation %d are left in shim's pid namespace: %v", len(pids), gen, pids)
	}
	log := atkAsks(asks)
	returned := x.sent.Add(x.took)
	window, inFlight := 0, 0
	for _, g := range atkGrants(a.rd, gen) {
		begun, known := log.begun(g)
		switch {
		case g.at.After(returned):
			t.Errorf("the broker answered generation %d %v after the announcement returned (pid %d)", gen, g.at.Sub(returned), g.pid)
		case known && begun.After(boundary):
			t.Errorf("the broker answered a request of generation %d begun %v after its fence began (pid %d, recorded %v after)",
				gen, begun.Sub(boundary), g.pid, g.at.Sub(boundary))
		case g.at.After(boundary):
			inFlight++
			t.Logf("an answer to generation %d recorded %v after its fence began, to a request begun before it (pid %d, known %v): in flight when the token was raised",
				gen, g.at.Sub(boundary), g.pid, known)
		case g.at.After(x.sent):
			window++
		}
	}
	return window
}

// checkServing checks that shim answers status.
func (a *atkRig) checkServing() api.Status {
	a.t.Helper()
	var st api.Status
	out, errs, code := atkCtl(a.rd, 10*time.Second, "status")
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
		a.t.Errorf("shim does not serve status: exit %d %s", code, errs)
	}
	return st
}

// stop sends SIGTERM and checks that shim exits within atkStopBound.
func (a *atkRig) stop() time.Duration {
	a.t.Helper()
	t0 := time.Now()
	a.s.Cmd.Process.Signal(syscall.SIGTERM)
	if _, ok := a.s.Wait(atkStopBound); !ok {
		a.t.Errorf("shim did not exit within %v of SIGTERM", atkStopBound)
		a.s.Stop()
	}
	return time.Since(t0)
}

// atkCtl is runCtl with a deadline; code -2 means ctl was killed at it.
func atkCtl(rd string, timeout time.Duration, args ...string) (string, string, int) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, shimBin, append([]string{"ctl", "--runtime-dir", rd}, args...)...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ctx.Err() != nil {
		code = -2
	} else if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		code = -1
	}
	return out.String(), errb.String(), code
}

// atkErrCode is the code of ctl's JSON error ("" when there is none).
func atkErrCode(stderr string) string {
	var e api.Error
	if json.Unmarshal([]byte(strings.TrimSpace(stderr)), &e) != nil {
		return ""
	}
	return e.Code
}

// atkGrant is one credential_granted record of audit.jsonl.
type atkGrant struct {
	at  time.Time
	pid int
}

// atkGrants reads the broker's grants to generation gen. A line being
// written while it is read is skipped.
func atkGrants(rd string, gen uint64) []atkGrant {
	var out []atkGrant
	for _, line := range readLines(filepath.Join(rd, "audit.jsonl")) {
		var r struct {
			Time       time.Time `json:"time"`
			Event      string    `json:"event"`
			Generation uint64    `json:"generation"`
			Pid        int       `json:"pid"`
		}
		if json.Unmarshal([]byte(line), &r) == nil && r.Event == "credential_granted" && r.Generation == gen {
			out = append(out, atkGrant{at: r.Time, pid: r.Pid})
		}
	}
	return out
}

// atkGenProcs lists the processes of shim's pid namespace in generation
// gen's cgroup.
func atkGenProcs(s *Shim, gen uint64) []int {
	suffix := fmt.Sprintf("/gen-%d", gen)
	var out []int
	for pid := range s.PidnsProcs() {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if p, ok := strings.CutPrefix(line, "0::"); ok && (strings.HasSuffix(p, suffix) || strings.Contains(p, suffix+"/")) {
				out = append(out, pid)
			}
		}
	}
	return out
}

// atkEvents is shim's event stream, recorded from the moment it was
// subscribed (shim subscribes before it answers the request's headers).
type atkEvents struct {
	mu  sync.Mutex
	evs []api.Event
}

func atkWatchEvents(t testing.TB, s *Shim) *atkEvents {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", filepath.Join(s.RuntimeDir, "shim.sock"))
	}}}
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://shim/v1/events", nil)
	resp, err := hc.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		cancel()
		t.Fatalf("subscribe to events: %v %v", err, resp)
	}
	e := &atkEvents{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var ev api.Event
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				e.mu.Lock()
				e.evs = append(e.evs, ev)
				e.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { cancel(); resp.Body.Close(); <-done })
	return e
}

func (e *atkEvents) first(typ string, gen uint64) (time.Time, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ev := range e.evs {
		if ev.Type == typ && ev.Generation == gen {
			return ev.Time, true
		}
	}
	return time.Time{}, false
}

// atkWorktreeAttack runs one attack on the worktree: gen 1 runs body (with
// the hammer, ready when it touches $ATTACK_OUT/ready), gen 2 is announced;
// gen 1 must be dead and unanswered, and the announcement either starts
// gen 2 with the snapshot saved or fails closed with RESTORE_FAILED; the
// outcome is logged.
func atkWorktreeAttack(t *testing.T, body string) {
	f := newWTFixture(t)
	a := newAtkRig(t, shimOpts{args: []string{"--git-timeout", "5s", "--restore-timeout", "30s"}})
	g1 := a.script(f.bin, "gen1.sh", body)
	var r1 api.StartResult
	a.s.MustCtl(&r1, f.startArgs(1, append(a.harnessArgs(), "--", g1, f.baseline)...)...)
	a.waitReady(1, 30*time.Second)

	x := a.announce(1, 90*time.Second, f.startArgs(2, "--", "sleep", "1000")...)
	window := a.checkGone(x, 1, r1.Cgroup, a.out)
	var r2 api.StartResult
	switch code := atkErrCode(x.errs); {
	case x.code == 0:
		if err := json.Unmarshal([]byte(x.out), &r2); err != nil || len(r2.Fenced) != 1 {
			t.Fatalf("start 2: %q (%v)", x.out, err)
		}
		rep := r2.Fenced[0]
		if rep.SnapshotRef == "" || rep.Survivors != 0 || rep.Error != nil {
			t.Errorf("gen 2 started but the fence report is not a clean one: %+v", rep)
		}
		t.Logf("outcome: gen 2 running, snapshot %s; fence ms %v; killed %d survivors %d", rep.SnapshotRef, rep.DurationsMS, rep.Killed, rep.Survivors)
	case x.code == 4 && code == api.CodeRestoreFailed:
		var st api.Status
		a.s.MustCtl(&st, "status")
		if st.State != api.StateFailed || st.Pid != 0 {
			t.Errorf("status after RESTORE_FAILED: %+v", st)
		}
		t.Logf("outcome: RESTORE_FAILED (exit 4): %s", strings.TrimSpace(x.errs))
	default:
		t.Errorf("announcement: exit %d (-2: hung), code %q, %s; want 0 or 4 RESTORE_FAILED", x.code, code, strings.TrimSpace(x.errs))
	}
	t.Logf("announcement took %v; fencing began %v after it was sent; grants between the two: %d", x.took, x.began.Sub(x.sent), window)
	a.checkServing()
	t.Logf("SIGTERM to exit: %v", a.stop())
}

// 1. A FIFO where shim's git (or shim) would read: .git/config, and the
// baseline commit's loose object. Before the fix the pre-fence baseline
// lookup blocked on it forever, holding the announcement lock.
func TestAttackFIFOInTheGitDir(t *testing.T) {
	t.Run("config", func(t *testing.T) {
		atkWorktreeAttack(t, `
hammer
rm -f .git/config && mkfifo .git/config || exit 1
touch "$ATTACK_OUT/ready"
exec sleep 1000
`)
	})
	t.Run("baseline-object", func(t *testing.T) {
		atkWorktreeAttack(t, `
hammer
obj=.git/objects/$(printf %s "$1" | cut -c1-2)/$(printf %s "$1" | cut -c3-)
[ -f "$obj" ] || exit 1
rm -f "$obj" && mkfifo "$obj" || exit 1
touch "$ATTACK_OUT/ready"
exec sleep 1000
`)
	})
}

// 2. The baseline's object deleted, and .git a gitfile pointing inside the
// worktree: before the fix, BAD_REQUEST before anything was frozen.
func TestAttackBaselineUnresolvable(t *testing.T) {
	t.Run("object-deleted", func(t *testing.T) {
		atkWorktreeAttack(t, `
hammer
obj=.git/objects/$(printf %s "$1" | cut -c1-2)/$(printf %s "$1" | cut -c3-)
rm "$obj" || exit 1
touch "$ATTACK_OUT/ready"
exec sleep 1000
`)
	})
	t.Run("gitfile-inside", func(t *testing.T) {
		atkWorktreeAttack(t, `
hammer
mv .git .inner-git && printf 'gitdir: .inner-git\n' > .git || exit 1
touch "$ATTACK_OUT/ready"
exec sleep 1000
`)
	})
}

// atkTmpfs mounts a tmpfs of size at a fresh temp dir and unmounts it at
// the end. The mounts of this machine are private (nothing propagates);
// shim's own mount namespace is a copy made after the mount.
func atkTmpfs(t *testing.T, size string) string {
	t.Helper()
	d := credDir(t, -1) // traversable: the harness must reach cred.sock in it
	if err := unix.Mount("tmpfs", d, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+size+",mode=0755"); err != nil {
		testutil.Need(t, false, "cannot mount a tmpfs: "+err.Error())
	}
	t.Cleanup(func() {
		if err := unix.Unmount(d, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", d, err)
		}
	})
	return d
}

func atkFree(t testing.TB, dir string) uint64 {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return st.Bavail * uint64(st.Bsize)
}

func atkSize(p string) int64 {
	st, err := os.Stat(p)
	if err != nil {
		return -1
	}
	return st.Size()
}

// 3. The runtime dir's filesystem filled by the harness: through its stdout
// (capped at --log-max) and through a world-writable dir on the same
// filesystem (not capped: the reserve keeps room for state.json and the
// audit record).
func TestAttackRuntimeDirFull(t *testing.T) {
	const logMax = 1 << 20
	t.Run("capped", func(t *testing.T) {
		mnt := atkTmpfs(t, "32m")
		rd, fill := filepath.Join(mnt, "run"), filepath.Join(mnt, "fill")
		for _, d := range []string{rd, fill} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		os.Chmod(fill, 0o1777)
		a := newAtkRig(t, shimOpts{runtimeDir: rd, args: []string{"--log-max", strconv.Itoa(logMax)}})
		g1 := a.script(a.out, "fill.sh", `
hammer
cat /dev/zero &
# Keep the filesystem full: whatever shim frees is taken again.
while :; do
	cat /dev/zero >> "$1/fill" 2>/dev/null
	[ -e "$ATTACK_OUT/ready" ] || touch "$ATTACK_OUT/ready"
	sleep 0.01
done
`)
		var r1 api.StartResult
		a.s.MustCtl(&r1, a.plainArgs(1, "--", g1, fill)...)
		a.waitReady(1, 30*time.Second)
		stdout := filepath.Join(rd, "gen", "1", "stdout")
		eventually(t, 30*time.Second, "the filesystem full and gen 1's stdout past the cap", func() bool {
			var rec api.Generation
			out, _, code := atkCtl(rd, 10*time.Second, "generation", "--generation", "1")
			return code == 0 && json.Unmarshal([]byte(out), &rec) == nil && rec.StdoutDropped > logMax && atkFree(t, mnt) == 0
		})

		// The hammer's requests keep shim writing audit records on the full
		// filesystem: 300 more rounds (some 100 KiB of records), or until
		// they made shim give up its reserve and the harness took that too.
		// A round is four execs (two of shim) beside two cats that keep
		// both CPUs busy: 4 rounds a second on a slow 2-vCPU VM, so the
		// deadline is minutes, not the one minute a fast machine needs.
		audit, reserve, asked := filepath.Join(rd, "audit.jsonl"), filepath.Join(rd, "reserve"), filepath.Join(a.out, "asked")
		auditFull, askedFull := atkSize(audit), atkSize(asked)
		eventually(t, 5*time.Minute, "300 hammer rounds on the full filesystem, or the reserve spent", func() bool {
			return atkSize(asked) >= askedFull+300 || atkSize(reserve) < 0 && atkFree(t, mnt) == 0
		})
		t.Logf("before the announcement: %d bytes free, reserve file %d bytes (-1: gone), audit.jsonl %d -> %d bytes, %d hammer rounds since the filesystem was full",
			atkFree(t, mnt), atkSize(reserve), auditFull, atkSize(audit), atkSize(asked)-askedFull)
		x := a.announce(1, 60*time.Second, a.plainArgs(2, "--", "sleep", "1000")...)
		window := a.checkGone(x, 1, r1.Cgroup, a.out)
		if x.code != 0 {
			t.Errorf("announcing gen 2 on a full runtime dir: exit %d %s", x.code, strings.TrimSpace(x.errs))
		} else {
			var r2 api.StartResult
			json.Unmarshal([]byte(x.out), &r2)
			if len(r2.Fenced) == 1 {
				t.Logf("fence ms %v; killed %d survivors %d", r2.Fenced[0].DurationsMS, r2.Fenced[0].Killed, r2.Fenced[0].Survivors)
			}
		}
		var st struct {
			Highest uint64 `json:"highest"`
		}
		if b, err := os.ReadFile(filepath.Join(rd, "state.json")); err != nil || json.Unmarshal(b, &st) != nil || st.Highest != 2 {
			t.Errorf("state.json does not hold token 2: %+v (%v)", st, err)
		}
		var rec api.Generation
		if out, errs, code := atkCtl(rd, 10*time.Second, "generation", "--generation", "1"); code != 0 || json.Unmarshal([]byte(out), &rec) != nil {
			t.Errorf("gen 1's record: exit %d %s", code, errs)
		}
		if rec.StdoutDropped <= 0 {
			t.Errorf("gen 1's record shows stdout_dropped %d, want > 0", rec.StdoutDropped)
		}
		if n := atkSize(stdout); n > logMax {
			t.Errorf("gen 1's stdout file is %d bytes, over --log-max %d", n, logMax)
		}
		t.Logf("stdout kept %d bytes, dropped %d; announcement %v; grants between sending and fencing: %d",
			atkSize(stdout), rec.StdoutDropped, x.took, window)
		a.checkServing()
		t.Logf("SIGTERM to exit: %v", a.stop())
	})
	// Without the cap the harness's stdout alone fills the filesystem: the
	// attack works where the guarantee is absent.
	t.Run("control-uncapped", func(t *testing.T) {
		mnt := atkTmpfs(t, "32m")
		rd := filepath.Join(mnt, "run")
		if err := os.Mkdir(rd, 0o755); err != nil {
			t.Fatal(err)
		}
		a := newAtkRig(t, shimOpts{runtimeDir: rd, args: []string{"--log-max", "-1"}})
		a.s.MustCtl(nil, a.plainArgs(1, "--", "cat", "/dev/zero")...)
		stdout := filepath.Join(rd, "gen", "1", "stdout")
		eventually(t, 30*time.Second, "the filesystem full through stdout", func() bool {
			return atkFree(t, mnt) == 0 && atkSize(stdout) > 8*logMax
		})
		t.Logf("control: stdout grew to %d bytes and the filesystem has 0 bytes free", atkSize(stdout))
	})
}

// atkBombPy forks until fork fails (every pid of shim's namespace taken),
// then asks the broker in a loop over cred.sock (no fork needed; each
// request logged in out/asks) and takes every pid that frees up. argv:
// cred.sock, out dir.
const atkBombPy = `
import os, signal, socket, sys, time
sock, out = sys.argv[1], sys.argv[2]
def child():
    while True:
        signal.pause()
n = 0
while True:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        child()
    n += 1
with open(out + "/ready.tmp", "w") as f:
    f.write(str(n))
os.rename(out + "/ready.tmp", out + "/ready")
req = b"shim-credential/1 get\nprotocol=https\nhost=attack.invalid\npath=repo\n\n"
while True:
    try:
        with open(out + "/asks", "a") as f:
            f.write("%d %d\n" % (os.getpid(), time.time_ns()))
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(sock)
        s.sendall(req)
        s.shutdown(socket.SHUT_WR)
        s.recv(4096)
        s.close()
    except OSError:
        pass
    try:
        if os.fork() == 0:
            child()
    except OSError:
        pass
`

// atkSetPidMax sets pid_max of shim's pid namespace to n from a process
// the test starts inside it. Only on Linux 6.14+, where pid_max is per pid
// namespace: on an older kernel the same write would change the machine's.
func atkSetPidMax(t *testing.T, s *Shim, n int) {
	t.Helper()
	var u unix.Utsname
	unix.Uname(&u)
	var major, minor int
	fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor)
	testutil.Need(t, major > 6 || major == 6 && minor >= 14, "needs Linux 6.14+ (pid_max per pid namespace)")
	nsenter := testutil.NeedTool(t, "nsenter")
	host, _ := os.ReadFile("/proc/sys/kernel/pid_max")
	out, err := exec.Command(nsenter, "-t", strconv.Itoa(s.Cmd.Process.Pid), "-p", "-m", "--", "/bin/sh", "-c",
		fmt.Sprintf("echo %d > /proc/sys/kernel/pid_max && cat /proc/sys/kernel/pid_max", n)).CombinedOutput()
	if after, _ := os.ReadFile("/proc/sys/kernel/pid_max"); string(after) != string(host) {
		os.WriteFile("/proc/sys/kernel/pid_max", host, 0)
		t.Fatalf("writing pid_max in shim's namespace changed the machine's (%q -> %q); restored", host, after)
	}
	if err != nil || strings.TrimSpace(string(out)) != strconv.Itoa(n) {
		t.Fatalf("set pid_max %d in shim's pid namespace: %v %s", n, err, out)
	}
}

// 5a. Every pid of the sandbox taken by the harness, which hammers
// cred.sock while the test asks for status in a loop: shim must not crash
// (Go's `fatal error: newosproc`), and each announcement kills everything.
// Several rounds in one shim.
func TestAttackPidExhaustion(t *testing.T) {
	const rounds, pidMax = 5, 400 // the kernel's minimum is 301
	a := newAtkRig(t, shimOpts{})
	atkSetPidMax(t, a.s, pidMax)
	bomb := script(t, credDir(t, -1), "bomb.py", "")
	if err := os.WriteFile(bomb, []byte(atkBombPy), 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(a.rd, "cred.sock")
	start := func(gen int) ([]string, string) {
		out := credDir(t, wtUID)
		return a.plainArgs(gen, "--", "/usr/bin/python3", bomb, sock, out), out
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var once sync.Once
	halt := func() { once.Do(func() { close(stop) }); wg.Wait() }
	var statusOK, statusFailed int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, _, code := atkCtl(a.rd, 30*time.Second, "status"); code == 0 {
				statusOK++
			} else {
				statusFailed++
			}
		}
	}()
	defer halt()

	args, out := start(1)
	var r api.StartResult
	a.s.MustCtl(&r, args...)
	for k := 1; k <= rounds; k++ {
		eventually(t, 60*time.Second, fmt.Sprintf("round %d: every pid taken", k), func() bool {
			_, err := os.Stat(filepath.Join(out, "ready"))
			return err == nil
		})
		forked, _ := os.ReadFile(filepath.Join(out, "ready"))
		grantsBefore, asks := len(atkGrants(a.rd, uint64(k))), out
		next := []string(nil)
		if k < rounds {
			next, out = start(k + 1)
		} else {
			next = a.plainArgs(k+1, "--", "sleep", "1000")
		}
		cg := r.Cgroup
		x := a.announce(uint64(k), 60*time.Second, next...)
		if x.code != 0 {
			t.Fatalf("round %d: announcing gen %d: exit %d %s", k, k+1, x.code, strings.TrimSpace(x.errs))
		}
		r = api.StartResult{}
		if err := json.Unmarshal([]byte(x.out), &r); err != nil || len(r.Fenced) != 1 {
			t.Fatalf("round %d: start result %q", k, x.out)
		}
		rep := r.Fenced[0]
		if rep.Survivors != 0 || rep.Error != nil {
			t.Errorf("round %d: fence report %+v", k, rep)
		}
		a.checkGone(x, uint64(k), cg, asks)
		t.Logf("round %d: harness forked %s children; broker answered it %d times under exhaustion; fence killed %d, survivors %d, ms %v",
			k, forked, grantsBefore, rep.Killed, rep.Survivors, rep.DurationsMS)
	}
	halt()
	select {
	case <-a.s.done:
		t.Fatalf("shim exited under pid exhaustion (code %d)", a.s.sb.ExitCode())
	default:
	}
	for _, bad := range []string{"fatal error", "newosproc", "failed to create new OS thread"} {
		if strings.Contains(a.s.Log.String(), bad) {
			t.Errorf("shim's log has %q", bad)
		}
	}
	t.Logf("ctl status during the rounds: %d answered, %d failed", statusOK, statusFailed)
	if statusFailed > 0 {
		t.Errorf("ctl status failed %d times under pid exhaustion", statusFailed)
	}
	a.checkServing()
	t.Logf("SIGTERM to exit: %v", a.stop())
}

// atkMemoryCgroup creates a cgroup v1 memory cgroup under the test's own
// (this machine is a hybrid cgroup host: the cgroup2 mount has no memory
// controller) with limit bytes; it is removed at the end, once shim's pid
// namespace is gone.
func atkMemoryCgroup(t *testing.T, limit int64) string {
	t.Helper()
	rel := ""
	b, _ := os.ReadFile("/proc/self/cgroup")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.SplitN(line, ":", 3); len(f) == 3 && f[1] == "memory" {
			rel = f[2]
		}
	}
	var st unix.Statfs_t
	v1 := unix.Statfs("/sys/fs/cgroup/memory", &st) == nil && st.Type == unix.CGROUP_SUPER_MAGIC
	testutil.Need(t, rel != "" && v1, "no cgroup v1 memory controller at /sys/fs/cgroup/memory")
	dir := filepath.Join("/sys/fs/cgroup/memory", rel, randName("shim-it-oom-"))
	if err := os.Mkdir(dir, 0o755); err != nil {
		testutil.Need(t, false, "cannot create a v1 memory cgroup: "+err.Error())
	}
	t.Cleanup(func() {
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := os.Remove(dir)
			if err == nil || os.IsNotExist(err) {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("v1 memory cgroup %s left behind: %v", dir, err)
				return
			}
			time.Sleep(20 * time.Millisecond) // the kernel empties it once shim's namespace is gone
		}
	})
	if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0); err != nil {
		t.Fatalf("memory.limit_in_bytes: %v", err)
	}
	return dir
}

// atkOOMKills reads oom_kill from a v1 memory cgroup's memory.oom_control.
func atkOOMKills(dir string) int {
	b, _ := os.ReadFile(filepath.Join(dir, "memory.oom_control"))
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// atkAllocPy starts n allocators that each grow by step bytes (every page
// touched) until killed, then asks the broker in a loop. argv: out, n, step,
// cred.sock.
const atkAllocPy = `
import os, socket, sys, time
out, n, step, sock = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
for i in range(n):
    if os.fork() == 0:
        open("%s/alloc.%d" % (out, os.getpid()), "w").close()
        hold = []
        while True:
            b = bytearray(step)
            for off in range(0, step, 4096):
                b[off] = 1
            hold.append(b)
            time.sleep(0.01)
open(out + "/ready", "w").close()
req = b"shim-credential/1 get\nprotocol=https\nhost=attack.invalid\npath=repo\n\n"
while True:
    try:
        with open(out + "/asks", "a") as f:
            f.write("%d %d\n" % (os.getpid(), time.time_ns()))
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(sock)
        s.sendall(req)
        s.shutdown(socket.SHUT_WR)
        s.recv(4096)
        s.close()
    except OSError:
        pass
    time.sleep(0.02)
`

// 5b. Many small allocators in a memory-limited sandbox: the OOM killer
// must pick harness processes, never shim (PID 1: oom_score_adj -1000, its
// children 0; or the children 1000 where shim may not lower its own).
func TestAttackOOM(t *testing.T) {
	const limit = 256 << 20
	mem := atkMemoryCgroup(t, limit)
	a := newAtkRig(t, shimOpts{})
	shimPid := a.s.Cmd.Process.Pid
	if err := os.WriteFile(filepath.Join(mem, "cgroup.procs"), []byte(strconv.Itoa(shimPid)), 0); err != nil {
		t.Fatalf("move shim into %s: %v", mem, err)
	}
	adj, _ := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", shimPid))
	alloc := script(t, credDir(t, -1), "alloc.py", "")
	if err := os.WriteFile(alloc, []byte(atkAllocPy), 0o755); err != nil {
		t.Fatal(err)
	}
	var r1 api.StartResult
	a.s.MustCtl(&r1, a.plainArgs(1, "--", "/usr/bin/python3", alloc, a.out, "16", strconv.Itoa(8<<20), filepath.Join(a.rd, "cred.sock"))...)
	eventually(t, 120*time.Second, "3 OOM kills in the memory cgroup", func() bool { return atkOOMKills(mem) >= 3 })

	select {
	case <-a.s.done:
		t.Fatalf("shim died in the OOM (exit %d); oom_score_adj was %s", a.s.sb.ExitCode(), adj)
	default:
	}
	childAdj := ""
	for _, pid := range atkGenProcs(a.s, 1) {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid)); err == nil {
			childAdj = strings.TrimSpace(string(b))
		}
	}
	// The allocators never exit on their own: every one dead (a zombie:
	// the harness does not reap them) was a victim. The kill is counted
	// when the OOM killer picks its victim, which takes a while longer to
	// die (longer on a loaded machine): wait for one, not for a count
	// taken at the moment of the third kill.
	var files []string
	dead := 0
	victims := func() bool {
		files, _ = filepath.Glob(filepath.Join(a.out, "alloc.*"))
		dead = 0
		for _, f := range files {
			nspid := strings.TrimPrefix(filepath.Ext(f), ".")
			st, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/proc/%s/stat", shimPid, nspid))
			if i := strings.LastIndexByte(string(st), ')'); os.IsNotExist(err) || i > 0 && len(st) > i+2 && st[i+2] == 'Z' {
				dead++
			}
		}
		return dead > 0
	}
	eventually(t, 60*time.Second, "an allocator dead after the OOM kills (if none dies, who was killed?)", victims)
	t.Logf("shim oom_score_adj %s, harness %s; OOM kills %d; allocators killed %d of %d", strings.TrimSpace(string(adj)), childAdj, atkOOMKills(mem), dead, len(files))
	a.checkServing()

	x := a.announce(1, 60*time.Second, a.plainArgs(2, "--", "sleep", "1000")...)
	if x.code != 0 {
		t.Errorf("announcing gen 2 after the OOM: exit %d %s", x.code, strings.TrimSpace(x.errs))
	}
	var r2 api.StartResult
	if json.Unmarshal([]byte(x.out), &r2) == nil && len(r2.Fenced) == 1 {
		t.Logf("fence: killed %d survivors %d ms %v", r2.Fenced[0].Killed, r2.Fenced[0].Survivors, r2.Fenced[0].DurationsMS)
		if r2.Fenced[0].Survivors != 0 {
			t.Errorf("survivors: %d", r2.Fenced[0].Survivors)
		}
	}
	a.checkGone(x, 1, r1.Cgroup, a.out)
	t.Logf("SIGTERM to exit: %v", a.stop())
}

// atkDaemonSh asks the broker in a loop, logging each request's pid (the
// one the broker sees: the sh that execs the helper) and start time, and a
// tick per answer; it keeps the stdout and stderr it inherited, as a daemon
// that did not close them does. argv: out dir.
const atkDaemonSh = `
OUT=$1
while :; do
	sh -c 'echo "$$ $(date +%s%N)" >> "$1/asks"; exec "$ATTACK_SHIM" credential get < "$1/req" > /dev/null' sh "$OUT"
	echo tick >> "$OUT/daemon.log"
	sleep 0.01
done
`

// atkAskLog is a harness's request log: for each pid (the broker's peer),
// when each of its requests began.
type atkAskLog map[int][]time.Time

// atkAsks reads dir/asks: lines "PID UNIX_NANOS".
func atkAsks(dir string) atkAskLog {
	m := atkAskLog{}
	for _, line := range readLines(filepath.Join(dir, "asks")) {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		pid, err1 := strconv.Atoi(f[0])
		ns, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 == nil && err2 == nil {
			m[pid] = append(m[pid], time.Unix(0, ns))
		}
	}
	return m
}

// begun is when the request the broker answered in g began: the latest
// request of g's pid begun before the answer was recorded.
func (l atkAskLog) begun(g atkGrant) (time.Time, bool) {
	var best time.Time
	for _, at := range l[g.pid] {
		if !at.After(g.at) && at.After(best) {
			best = at
		}
	}
	return best, !best.IsZero()
}

// atkGrantsAfterExit counts the answers to requests of gen begun after its
// harness exited, the answers recorded after the exit (a request in flight
// at the exit may be among those) and those recorded before.
func atkGrantsAfterExit(rd, dir string, gen uint64, exited time.Time) (begunAfter, recordedAfter, before int) {
	log := atkAsks(dir)
	for _, g := range atkGrants(rd, gen) {
		if at, ok := log.begun(g); ok && at.After(exited) {
			begunAfter++
		}
		if g.at.After(exited) {
			recordedAfter++
		} else {
			before++
		}
	}
	return
}

// 6. A harness that exits leaving a setsid daemon that keeps asking for
// the credential: `wait` returns only once the daemon is dead, and the
// broker answers it nothing after the harness exited. With --linger the
// daemon is kept, frozen in host mode, until the next announcement kills it.
func TestAttackExitLeavesNothing(t *testing.T) {
	run := func(t *testing.T, linger bool) {
		a := newAtkRig(t, shimOpts{})
		bin := credDir(t, -1)
		daemon := script(t, bin, "daemon.sh", atkDaemonSh)
		g1 := script(t, bin, "gen1.sh", `
printf 'protocol=https\nhost=attack.invalid\npath=repo\n\n' > "$ATTACK_OUT/req"
setsid "$1" "$ATTACK_OUT" &
while [ "$(wc -l < "$ATTACK_OUT/daemon.log" 2>/dev/null || echo 0)" -lt 3 ]; do sleep 0.01; done
exit 0
`)
		extra := []string{}
		if linger {
			extra = append(extra, "--linger")
		}
		var r1 api.StartResult
		a.s.MustCtl(&r1, a.plainArgs(1, append(extra, "--", g1, daemon)...)...)
		out, errs, code := atkCtl(a.rd, 60*time.Second, "wait", "--generation", "1")
		returned := time.Now()
		var exit api.Exit
		if code != 0 || json.Unmarshal([]byte(out), &exit) != nil {
			t.Fatalf("ctl wait --generation 1: exit %d %s %s", code, out, errs)
		}
		log := filepath.Join(a.out, "daemon.log")
		t.Logf("wait returned %v after the harness exited", returned.Sub(exit.ExitedAt))

		if !linger {
			if _, err := os.Stat(r1.Cgroup); !os.IsNotExist(err) {
				t.Errorf("wait returned while gen 1's cgroup %s is still there (%v)", r1.Cgroup, err)
			}
			if pids := atkGenProcs(a.s, 1); len(pids) != 0 {
				t.Errorf("wait returned while %d processes of gen 1 live: %v", len(pids), pids)
			}
			// Its cgroup is gone, so the daemon cannot write; show it.
			n := atkSize(log)
			for i := 0; i < 10; i++ {
				time.Sleep(50 * time.Millisecond)
				if m := atkSize(log); m != n {
					t.Fatalf("the daemon's log grew from %d to %d bytes after wait returned", n, m)
				}
			}
		} else {
			// Lingering in host mode: the daemon is kept, frozen (the
			// sandbox's network cannot be taken from it otherwise): its
			// processes are there and it does nothing.
			if pids := atkGenProcs(a.s, 1); len(pids) == 0 {
				t.Errorf("--linger: the daemon is gone after the exit")
			}
			n := atkSize(log)
			for i := 0; i < 10; i++ {
				time.Sleep(50 * time.Millisecond) // an observation window, not a synchronisation
				if m := atkSize(log); m != n {
					t.Fatalf("the lingering daemon acts after the exit: its log grew from %d to %d bytes", n, m)
				}
			}
		}
		begun, recorded, before := atkGrantsAfterExit(a.rd, a.out, 1, exit.ExitedAt)
		if before == 0 {
			t.Errorf("the daemon got no credential before the harness exited: the hammer proves nothing")
		}
		if begun != 0 {
			t.Errorf("the broker answered %d of the daemon's requests begun after the harness exited (%d answers recorded after the exit)", begun, recorded)
		}
		t.Logf("grants to gen 1: %d before its exit, %d recorded after it (%d of requests begun after it)", before, recorded, begun)
		if !linger {
			a.checkServing()
			t.Logf("SIGTERM to exit: %v", a.stop())
			return
		}

		x := a.announce(1, 60*time.Second, a.plainArgs(2, "--", "sleep", "1000")...)
		if x.code != 0 {
			t.Fatalf("announcing gen 2: exit %d %s", x.code, strings.TrimSpace(x.errs))
		}
		var r2 api.StartResult
		json.Unmarshal([]byte(x.out), &r2)
		if len(r2.Fenced) != 1 || r2.Fenced[0].Killed == 0 || r2.Fenced[0].Survivors != 0 {
			t.Errorf("the fence of the lingering generation: %+v", r2.Fenced)
		} else {
			t.Logf("fence of the lingering daemon: state before %s, killed %d, survivors %d, ms %v",
				r2.Fenced[0].StateBefore, r2.Fenced[0].Killed, r2.Fenced[0].Survivors, r2.Fenced[0].DurationsMS)
		}
		a.checkGone(x, 1, r1.Cgroup, a.out)
		if begun, _, _ := atkGrantsAfterExit(a.rd, a.out, 1, exit.ExitedAt); begun != 0 {
			t.Errorf("the lingering daemon got %d answers to requests begun after the harness exited", begun)
		}
		a.checkServing()
		t.Logf("SIGTERM to exit: %v", a.stop())
	}
	t.Run("exit", func(t *testing.T) { run(t, false) })
	t.Run("linger", func(t *testing.T) { run(t, true) })
}

// 8. A worktree named for the first time after a generation ran there:
// gen 1 (no --worktree) plants a core.fsmonitor and hooks in .git; gen 2 is
// the first announcement to name the worktree. The registration is late,
// its trusted config leaves the planted keys out, and no git of shim or of
// gen 2 runs the payload. Control: plain git in a copy of what gen 1 left
// runs it.
func TestAttackLateRegistration(t *testing.T) {
	f := newWTFixture(t)
	a := newAtkRig(t, shimOpts{})
	g1 := a.script(f.bin, "plant.sh", `
hammer
P="$ATTACK_OUT/payload.sh"
printf '#!/bin/sh\necho "payload $(pwd) $*" >> "%s/marker"\nexit 0\n' "$ATTACK_OUT" > "$P" && chmod 755 "$P" || exit 1
git config core.fsmonitor "$P" || exit 1
for h in post-checkout post-index-change reference-transaction pre-commit; do
	printf '#!/bin/sh\n"%s" hook-%s\n' "$P" "$h" > ".git/hooks/$h" && chmod 755 ".git/hooks/$h" || exit 1
done
echo "gen 1 was here" >> README.md
touch "$ATTACK_OUT/ready"
exec sleep 1000
`)
	args := append([]string{"start", "--generation", "1", "--user", fmt.Sprintf("%d:%d", wtUID, wtUID), "--cwd", f.wt,
		"--env", "HOME=" + f.home, "--env", "PATH=/usr/bin:/bin"}, a.harnessArgs()...)
	var r1 api.StartResult
	a.s.MustCtl(&r1, append(args, "--", g1)...)
	a.waitReady(1, 30*time.Second)

	// Control: plain git, as the worktree's owner, in a copy of what gen 1
	// left, runs the planted fsmonitor.
	marker := filepath.Join(a.out, "marker")
	cp := filepath.Join(f.work, "copy")
	if out, err := exec.Command("cp", "-a", f.wt, cp).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	plain := exec.Command("git", "status", "--porcelain")
	plain.Dir, plain.Env = cp, []string{"PATH=/usr/bin:/bin", "HOME=" + f.home, "GIT_CONFIG_NOSYSTEM=1"}
	plain.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: wtUID, Gid: wtUID, Groups: []uint32{}}}
	plain.Run()
	if b, _ := os.ReadFile(marker); !strings.Contains(string(b), "payload "+cp+" ") {
		t.Fatalf("control: plain git in a copy did not run the planted fsmonitor; marker %q", b)
	}

	g2 := script(t, f.bin, "gen2.sh", gen2Script)
	x := a.announce(1, 90*time.Second, f.startArgs(2, "--", g2, f.out)...)
	window := a.checkGone(x, 1, r1.Cgroup, a.out)
	if x.code != 0 {
		t.Fatalf("announcing gen 2 with the worktree: exit %d %s", x.code, strings.TrimSpace(x.errs))
	}
	var r2 api.StartResult
	if err := json.Unmarshal([]byte(x.out), &r2); err != nil || len(r2.Fenced) != 1 {
		t.Fatalf("start 2: %q", x.out)
	}
	eventually(t, 20*time.Second, "gen 2's git status done", func() bool {
		_, err := os.Stat(filepath.Join(f.out, "gen2.done"))
		return err == nil
	})
	rep := r2.Fenced[0]
	if w := rep.Worktree; w == nil || w.Registration == nil || !w.Registration.Late {
		t.Errorf("the fence report's worktree registration does not say registered_late: %+v", w)
	} else {
		t.Logf("fence: registration %+v; snapshot %s; ms %v", *w.Registration, rep.SnapshotRef, rep.DurationsMS)
		if !strings.Contains(strings.Join(w.Registration.Dropped, " "), "fsmonitor") {
			t.Errorf("dropped %v does not name core.fsmonitor", w.Registration.Dropped)
		}
	}
	if r2.Worktree == nil || !r2.Worktree.Late {
		t.Errorf("the start result's registration does not say registered_late: %+v", r2.Worktree)
	}
	for _, line := range readLines(marker) {
		if strings.HasPrefix(line, "payload "+f.wt+" ") {
			t.Errorf("the planted payload ran in the worktree: %q", line)
		}
	}
	if cfg := readString(t, filepath.Join(f.wt, ".git", "config")); strings.Contains(cfg, "fsmonitor") {
		t.Errorf(".git/config after the fence still has the fsmonitor:\n%s", cfg)
	}
	if b, err := os.ReadFile(filepath.Join(f.wt, ".git", "hooks", "post-checkout")); err == nil && strings.Contains(string(b), "payload") {
		t.Errorf("the planted post-checkout hook is still there")
	}
	t.Logf("grants between sending and fencing: %d; announcement %v", window, x.took)
	a.checkServing()
	t.Logf("SIGTERM to exit: %v", a.stop())
}
