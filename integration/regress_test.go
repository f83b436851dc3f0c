package integration

// Regressions of what an adversarial review of the issue-8 fence found:
// the daemon of an exited harness kept the network in host mode; the
// runtime dir's reserve was spent once and never taken back; garbage on
// cred.sock grew the audit log without bound.

import (
	"bufio"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
)

// revListener records when each TCP connection was accepted on 127.0.0.1.
type revListener struct {
	ln  net.Listener
	mu  sync.Mutex
	at  []time.Time
	txt []string
}

func revListen(t *testing.T) *revListener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &revListener{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			now := time.Now()
			go func() {
				defer c.Close()
				c.SetReadDeadline(time.Now().Add(2 * time.Second))
				line, _ := bufio.NewReader(c).ReadString('\n')
				l.mu.Lock()
				l.at = append(l.at, now)
				l.txt = append(l.txt, strings.TrimSpace(line))
				l.mu.Unlock()
			}()
		}
	}()
	return l
}

func (l *revListener) port() string { return strconv.Itoa(l.ln.Addr().(*net.TCPAddr).Port) }

// sentAfter counts the lines whose sender's timestamp ("daemon <unix ns>")
// is after t0.
func (l *revListener) sentAfter(t0 time.Time) (n int, last time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, txt := range l.txt {
		f := strings.Fields(txt)
		if len(f) != 2 || f[0] != "daemon" {
			continue
		}
		ns, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		if at := time.Unix(0, ns); at.After(t0) {
			n++
			if at.After(last) {
				last = at
			}
		}
	}
	return
}

const revDaemon = `#!/bin/bash
OUT=$1; PORT=$2
while :; do
	{ exec 3<>/dev/tcp/127.0.0.1/$PORT && echo "daemon $(date +%s%N)" >&3; exec 3>&-; } 2>/dev/null
	echo tick >> "$OUT/daemon.log"
	sleep 0.05
done
`

// A: host mode, the harness exits leaving a setsid daemon: does the daemon
// still reach the network after the exit ("its network cut at once")?
func TestRegressExitDaemonNetwork(t *testing.T) {
	for _, linger := range []bool{false, true} {
		name := "grace"
		if linger {
			name = "linger"
		}
		t.Run(name, func(t *testing.T) {
			srv := revListen(t)
			a := newAtkRig(t, shimOpts{})
			bin := credDir(t, -1)
			d := filepath.Join(bin, "daemon.sh")
			os.WriteFile(d, []byte(revDaemon), 0o755)
			g1 := script(t, bin, "gen1.sh", `
setsid /bin/bash "$1" "$ATTACK_OUT" "$2" </dev/null >/dev/null 2>&1 &
while [ "$(wc -l < "$ATTACK_OUT/daemon.log" 2>/dev/null || echo 0)" -lt 3 ]; do sleep 0.01; done
exit 0
`)
			extra := []string{}
			if linger {
				extra = append(extra, "--linger")
			}
			var r1 api.StartResult
			a.s.MustCtl(&r1, a.plainArgs(1, append(extra, "--", g1, d, srv.port())...)...)
			out, errs, code := atkCtl(a.rd, 60*time.Second, "wait", "--generation", "1")
			returned := time.Now()
			var exit api.Exit
			if code != 0 || json.Unmarshal([]byte(out), &exit) != nil {
				t.Fatalf("wait: %d %s %s", code, out, errs)
			}
			if exit.CutAt == nil {
				t.Fatalf("the exit record has no cut_at: %+v", exit)
			}
			time.Sleep(3 * time.Second)
			// The daemon stamps each connection with the time it sent it:
			// between the harness's exit and the cut (the freeze) it still
			// ran; after the cut nothing of it may reach the network. (Counted
			// by the daemon's own clock: a connection made before the cut may
			// be accepted after it.)
			n, last := srv.sentAfter(*exit.CutAt)
			t.Logf("%s: wait returned %v after exit; cut %v after exit; %d connections from gen 1's daemon sent after the cut (last %v after it)",
				name, returned.Sub(exit.ExitedAt), exit.CutAt.Sub(exit.ExitedAt), n, last.Sub(*exit.CutAt))
			if n > 0 {
				t.Errorf("FINDING: the daemon of an exited harness opened %d new connections after the cut (host mode)", n)
			}
		})
	}
}

// B: the reserve is one-shot: gen 1 fills the runtime dir's filesystem
// through a world-writable dir and leaves the file behind; fence 2 uses the
// reserve; the reserve is never retaken; a benign gen 2 writes 12 MiB of
// output; fence 3 (and every later one) cannot persist its token.
func TestRegressReserveOneShot(t *testing.T) {
	mnt := atkTmpfs(t, "48m")
	rd, fill := filepath.Join(mnt, "run"), filepath.Join(mnt, "fill")
	for _, d := range []string{rd, fill} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(fill, 0o1777)
	a := newAtkRig(t, shimOpts{runtimeDir: rd})
	g1 := a.script(a.out, "fill.sh", `
cat /dev/zero >> "$1/fill" 2>/dev/null
touch "$ATTACK_OUT/ready"
exec sleep 1000
`)
	var r1 api.StartResult
	a.s.MustCtl(&r1, a.plainArgs(1, "--", g1, fill)...)
	eventually(t, 30*time.Second, "full", func() bool {
		_, err := os.Stat(filepath.Join(a.out, "ready"))
		return err == nil && atkFree(t, mnt) == 0
	})
	reserve := filepath.Join(rd, "reserve")
	t.Logf("full: reserve %d bytes", atkSize(reserve))
	x := a.announce(1, 60*time.Second, a.plainArgs(2, "--", "/bin/sh", "-c", "head -c 12582912 /dev/zero; exec sleep 1000")...)
	t.Logf("fence 2: exit %d %s; free after %d; reserve file %d bytes", x.code, strings.TrimSpace(x.errs), atkFree(t, mnt), atkSize(reserve))
	if x.code != 0 {
		t.Fatalf("fence 2 failed already")
	}
	// Its 12 MiB are written or dropped. What it leaves free depends on
	// when shim gave its reserve up and took it again: the test fills the
	// rest, so fences 3 and 4 meet a full filesystem every time.
	eventually(t, 30*time.Second, "gen 2's output written or dropped", func() bool {
		var rec api.Generation
		out, _, code := a.s.Ctl("generation", "--generation", "2")
		dropped := code == 0 && json.Unmarshal([]byte(out), &rec) == nil && rec.StdoutDropped > 0
		return dropped || atkSize(filepath.Join(rd, "gen", "2", "stdout")) >= 12<<20
	})
	fillUp(t, filepath.Join(fill, "by-the-test"))
	t.Logf("gen 2 stdout %d bytes; free %d; reserve %d", atkSize(filepath.Join(rd, "gen", "2", "stdout")), atkFree(t, mnt), atkSize(reserve))
	for gen := 3; gen <= 4; gen++ {
		x := a.announce(uint64(gen-1), 60*time.Second, a.plainArgs(gen, "--", "sleep", "1000")...)
		t.Logf("fence %d: exit %d code %s (%v)", gen, x.code, atkErrCode(x.errs), x.took)
		if x.code != 0 {
			t.Errorf("FINDING: announcement %d failed on the filesystem gen 1 filled: exit %d %s", gen, x.code, strings.TrimSpace(x.errs))
		}
	}
	st := a.checkServing()
	t.Logf("status: generation %d state %s error %+v", st.Generation, st.State, st.Error)
}

// fillUp writes zeros to path until its filesystem is full.
func fillUp(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	for n := len(buf) / 2; n > 0; n /= 2 { // the last partial blocks
		f.Write(buf[:n])
	}
}

const revAuditFlood = `
import os, socket, sys, time
sock, n = sys.argv[1], int(sys.argv[2])
for i in range(n - 1):
    if os.fork() == 0:
        break
while True:
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock)
        s.sendall(b"x\n")
        s.close()
    except OSError:
        pass
`

// C: how fast can a harness grow audit.jsonl through cred.sock alone?
func TestRegressAuditFlood(t *testing.T) {
	a := newAtkRig(t, shimOpts{})
	py := filepath.Join(a.out, "flood.py")
	os.WriteFile(py, []byte(revAuditFlood), 0o644)
	audit := filepath.Join(a.rd, "audit.jsonl")
	var r1 api.StartResult
	a.s.MustCtl(&r1, a.plainArgs(1, "--", "/usr/bin/python3", py, filepath.Join(a.rd, "cred.sock"), "4")...)
	time.Sleep(time.Second)
	s0, t0 := atkSize(audit), time.Now()
	time.Sleep(10 * time.Second)
	s1, d := atkSize(audit), time.Since(t0)
	t.Logf("audit.jsonl grew %d bytes in %v: %.1f KiB/s, %.0f MiB/hour", s1-s0, d, float64(s1-s0)/d.Seconds()/1024, float64(s1-s0)/d.Seconds()*3600/(1<<20))
	st := time.Now()
	out, _, code := atkCtl(a.rd, 30*time.Second, "status")
	t.Logf("status under flood: exit %d in %v (%d bytes)", code, time.Since(st), len(out))
	x := a.announce(1, 60*time.Second, a.plainArgs(2, "--", "sleep", "1000")...)
	t.Logf("fence under flood: exit %d in %v", x.code, x.took)
}
