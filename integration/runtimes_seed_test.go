package integration

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
)

// matrixAgent is gen 1 of the seed scenario: it asks the control socket
// for status from inside its generation (and keeps the exit code in its
// worktree, so the snapshot carries it), edits, commits, starts a daemon
// that escapes (setsid, double fork) and pushes in a loop.
const matrixAgent = `
cd /workspace/repo || exit 1
git config user.name agent; git config user.email agent@example.com
shim ctl status >/dev/null 2>&1; echo $? > ctl.rc
echo "gen 1 edit" >> tracked.txt
echo "gen 1 notes" > notes.txt
git commit -qam "gen 1: first commit"
sh -c 'setsid sh -c "while :; do date >> daemon.log; sleep 0.2; done" &' &
i=0
while :; do
	i=$((i+1))
	echo "gen 1 push $i" >> tracked.txt
	git commit -qam "gen 1: push $i"
	git push -q origin HEAD:refs/heads/agent-gen1 2>>push-errors.log
	sleep 0.3
done
`

// matrixGen2 records how it found the worktree in a commit it pushes.
const matrixGen2 = `
cd /workspace/repo || exit 1
{ git rev-parse HEAD; git status --porcelain --untracked-files=all; } > /tmp/gen2-found
git config user.name agent; git config user.email agent@example.com
cp /tmp/gen2-found found.txt
git add found.txt && git commit -qm "gen 2" && git push -q origin HEAD:refs/heads/agent-gen2
`

// matrixProcs lists "pid cmdline" of the container's processes except
// shim (PID 1) and the listing shell; match, when set, keeps only those
// whose cmdline contains it (write it so it does not match itself, e.g.
// "receive-pac[k]" is a grep pattern).
func (b *matrixBox) procs(match string) []string {
	b.t.Helper()
	script := `for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = 1 ] || [ "$p" = $$ ] && continue; c=$(tr '\0' ' ' < $d/cmdline 2>/dev/null) || continue; [ -n "$c" ] && echo "$p $c"; done; true`
	if match != "" {
		script = `for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = $$ ] && continue; tr '\0' ' ' < $d/cmdline 2>/dev/null | grep -q -- '` + match + `' && echo "$p"; done; true`
	}
	out := b.MustExec("", "sh", "-c", script)
	var ps []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l != "" {
			ps = append(ps, l)
		}
	}
	return ps
}

func (b *matrixBox) bare(args ...string) string {
	b.t.Helper()
	return strings.TrimSpace(b.MustExec("", append([]string{"git", "-C", "/srv/git/repo.git"}, args...)...))
}

// matrixSeed runs the seed scenario in b and says which guarantees held
// (each one that did not is also a test error).
func matrixSeed(t *testing.T, b *matrixBox) matrixResult {
	var r matrixResult
	const url = "git://127.0.0.1/repo.git"
	eventually(t, 60*time.Second, "the container's git server up", func() bool {
		_, _, code := b.Exec("agent", "git", "ls-remote", "-q", url)
		return code == 0
	})
	b.MustExec("agent", "git", "clone", "-q", url, "/workspace/repo")
	base := b.bare("rev-parse", "main")
	eventually(t, 60*time.Second, "the start-up probes done", func() bool {
		b.ctl(&r.st, "status")
		return r.st.Isolation.Mode != "probing"
	})
	t.Logf("status: mode %s (%s); isolation %+v", r.st.Mode, r.st.ModeReason, r.st.Isolation)
	if w := b.e.c.wantReason; !strings.Contains(r.st.ModeReason, w) {
		t.Errorf("mode_reason %q lacks %q", r.st.ModeReason, w)
	}
	var weak []string
	for _, w := range r.st.Weakened {
		weak = append(weak, w.Code)
		t.Logf("weakened: %s: %s", w.Code, w.Message)
	}
	if strings.Join(weak, ",") != strings.Join(b.e.c.wantWeak, ",") {
		t.Errorf("status weakened %v, want %v", weak, b.e.c.wantWeak)
	}

	_, errs1, code1 := b.Exec("", "shim", "ctl", "start", "--generation", "1", "--user", "1000:1000", "--cwd", "/workspace/repo",
		"--env", "HOME=/home/agent", "--worktree", "/workspace/repo", "--baseline", base, "--network", "host",
		"--", "sh", "-c", matrixAgent)
	if code1 != 0 {
		t.Fatalf("start gen 1: exit %d: %s", code1, errs1)
	}
	eventually(t, 60*time.Second, "gen 1 pushed twice", func() bool {
		_, _, code := b.Exec("", "git", "-C", "/srv/git/repo.git", "rev-parse", "-q", "--verify", "refs/heads/agent-gen1")
		if code != 0 {
			return false
		}
		n, _ := strconv.Atoi(b.bare("rev-list", "--count", "refs/heads/agent-gen1"))
		return n >= 4 // seed, first commit, push 1, push 2
	})
	eventually(t, 30*time.Second, "gen 1's setsid daemon running", func() bool { return len(b.procs("daemon[.]log")) > 0 })
	// The harness's uid, outside any generation, is refused too, except
	// where the runtime's exec gives it capabilities (said in the row).
	_, errs, code := b.Exec("agent", "shim", "ctl", "status")
	r.refused = code != 0
	if !r.refused && b.e.c.execGetsCaps {
		r.refused, r.execAnswered = true, true
		t.Logf("shim ctl status through exec -u agent was answered (the runtime gives it capabilities)")
	} else if !r.refused {
		t.Errorf("shim ctl status as uid 1000 was answered")
	}
	t.Logf("shim ctl as uid 1000: exit %d %s", code, strings.TrimSpace(errs))

	var r2 api.StartResult
	b.ctl(&r2, "start", "--generation", "2", "--user", "1000:1000", "--cwd", "/workspace/repo",
		"--env", "HOME=/home/agent", "--worktree", "/workspace/repo", "--baseline", base, "--network", "host",
		"--", "sh", "-c", matrixGen2)
	if len(r2.Fenced) != 1 {
		t.Fatalf("gen 2 must fence exactly gen 1: %+v", r2)
	}
	rep := r2.Fenced[0]
	r.survivors, r.killed, r.fenceMS = rep.Survivors, rep.Killed, rep.DurationsMS["total"]
	t.Logf("fence report: killed %d survivors %d snapshot %s durations %v", rep.Killed, rep.Survivors, rep.SnapshotRef, rep.DurationsMS)
	if rep.Survivors != 0 || rep.Killed < 3 {
		t.Errorf("fence report: %+v", rep)
	}
	// Gen 2 is waited for first: in pidns mode (gVisor, rootless) the
	// sweep after its harness exits takes every process of the namespace
	// but shim's own, its service's and its control peers' for gen 2's
	// leftovers, the children of this test's `exec` helpers included
	// (their parent, the exec'd shell, has ppid 0; they do not), and a
	// wait returns only once that sweep is done. An exec helper caught
	// by it once left a wait hanging under runsc.
	var exit api.Exit
	waitOut := b.MustExec("", "shim", "ctl", "wait", "--generation", "2")
	if err := json.Unmarshal([]byte(waitOut), &exit); err != nil || exit.ExitCode != 0 {
		out, _, _ := b.Exec("", "cat", "/run/shim/gen/2/stderr")
		t.Fatalf("gen 2 exit %+v: %s", exit, out)
	}
	// A push gen 1 sent whole before the freeze is the server's to carry
	// out: its branch is read once no receive-pack is left.
	eventually(t, 30*time.Second, "the pushes begun before the fence done", func() bool { return len(b.procs("git receive-pac[k]")) == 0 })
	gen1 := b.bare("rev-parse", "refs/heads/agent-gen1")
	found := strings.Fields(b.bare("show", "refs/heads/agent-gen2:found.txt"))
	r.clean = len(found) == 1 && found[0] == base
	if !r.clean {
		t.Errorf("gen 2 found the worktree at %q, want %s and clean", found, base)
	}
	r.noPush = b.bare("rev-parse", "refs/heads/agent-gen1") == gen1
	if !r.noPush {
		t.Errorf("agent-gen1 moved after the fence")
	}
	notes, _, c1 := b.Exec("agent", "git", "-C", "/workspace/repo", "show", "refs/shim/abandoned/1:notes.txt")
	tracked, _, c2 := b.Exec("agent", "git", "-C", "/workspace/repo", "show", "refs/shim/abandoned/1:tracked.txt")
	ctlRC, _, c3 := b.Exec("agent", "git", "-C", "/workspace/repo", "show", "refs/shim/abandoned/1:ctl.rc")
	r.saved = c1 == 0 && c2 == 0 && strings.Contains(notes, "gen 1 notes") && strings.Contains(tracked, "gen 1 push")
	if !r.saved || rep.SnapshotRef != "refs/shim/abandoned/1" {
		t.Errorf("snapshot: ref %q notes %q tracked %q", rep.SnapshotRef, notes, tracked)
	}
	if c3 != 0 || strings.TrimSpace(ctlRC) == "0" {
		r.refused = false
		t.Errorf("the harness reached the control socket from its generation: exit %q", ctlRC)
	}
	// Nothing of gen 1 is left: only shim and its service (git daemon).
	for _, p := range b.procs("") {
		if !strings.Contains(p, "git-daemon --reuseaddr") {
			r.survivors++
			t.Errorf("process left in the container: %s", p)
		}
	}
	return r
}
