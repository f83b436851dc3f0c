package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/client"
)

// leaseFor is how long the lease test's supervisor leases a generation
// (KeepLease renews every third of it while it is "alive"): long enough that
// a loaded machine never lets it run out before the test stops renewing,
// short against the push (about 25 s through the slow server).
const leaseFor = 8 * time.Second

// The supervisor's gap, closed by a lease: a generation pushes 2.5 MiB
// through a slow server and hammers the credential broker while its
// supervisor renews the lease; then the supervisor "dies" (stops renewing)
// mid-push. The lease runs out: the generation is suspended (frozen, then
// cut), the push in flight is aborted and never lands, the broker answers
// no request begun after the suspension, and nothing is killed. A renewal
// resumes it (the broker answers it again); a newer announcement fences it
// as usual. The control, the same push frozen without a cut landing, is
// TestAttackInFlightPushControl.
func TestLeaseRunsOutMidPush(t *testing.T) {
	for _, mode := range []string{"host", "isolated"} {
		t.Run(mode, func(t *testing.T) {
			pw := credSecret("lease")
			srv := atkGitServer(t, gitServerOpts{Accounts: map[string]gitAccount{"bot": {Password: pw, Branch: "main"}}})
			proxy := startAtkSlowProxy(t, srv.HostPort, 1<<10, 0) // 2.5 MiB in about 25 s
			url := "http://" + proxy.Addr + "/repo.git"
			a := newAtkRig(t, shimOpts{}, map[string]string{"protocol": "http", "host": proxy.Addr, "path": "repo.git", "username": "bot", "password": pw})
			netArgs := []string{"--lease", leaseFor.String()}
			if mode == "isolated" {
				netArgs = append(netArgs, "--network", "isolated", "--allow", proxy.Addr, "--env", "NO_PROXY=localhost,::1")
			}
			g1 := a.script(credDir(t, -1), "push.sh", atkPushSh)
			var r1 api.StartResult
			a.s.MustCtl(&r1, a.plainArgs(1, append(netArgs, "--", g1, url)...)...)

			// The supervisor, alive: it renews in-process.
			c := client.New(a.rd)
			alive, cancel := context.WithCancel(context.Background())
			renewed := make(chan error, 1)
			go func() { renewed <- c.KeepLease(alive, 1, leaseFor) }()
			a.waitReady(1, 60*time.Second)
			eventually(t, 60*time.Second, "the push uploading", func() bool { return proxy.maxUp() > atkPushTrigger })
			cancel() // the supervisor is gone
			if err := <-renewed; err != nil {
				t.Fatalf("the supervisor's renewals: %v", err)
			}

			var rec api.Generation
			eventually(t, 30*time.Second, "generation 1 suspended", func() bool {
				out, _, code := a.s.Ctl("generation", "--generation", "1")
				return code == 0 && jsonInto(out, &rec) && rec.Lease != nil && rec.Lease.Suspended && rec.Lease.Cut != nil
			})
			l := rec.Lease
			if rec.State != api.StateSuspended || l.Killed || l.Error != nil || l.Suspensions != 1 {
				t.Fatalf("generation 1 after its lease ran out: state %s lease %+v", rec.State, *l)
			}
			if n := countProcs(r1.Cgroup); n == 0 {
				t.Fatal("a suspension killed the generation")
			}
			if ev, _ := os.ReadFile(filepath.Join(r1.Cgroup, "cgroup.events")); !strings.Contains(string(ev), "frozen 1") {
				t.Fatalf("generation 1 is not frozen: %s", ev)
			}
			listed := false
			for _, cn := range l.Cut.Connections {
				listed = listed || strings.HasSuffix(cn.Remote, proxy.Addr) || cn.Target == proxy.Addr
			}
			if !listed {
				t.Errorf("the suspension's cut lists no connection to %s: %+v", proxy.Addr, l.Cut)
			}

			// The push in flight never lands.
			how := atkWaitSettled(t, proxy, srv)
			if got := srv.Ref("refs/heads/main"); got != srv.Seed {
				t.Errorf("main is %s after the lease ran out (seed %s): the push landed", got, srv.Seed)
			}
			// The broker answered no request begun after the suspension began.
			at := *l.SuspendedAt
			log := atkAsks(a.out)
			for _, g := range atkGrants(a.rd, 1) {
				if begun, known := log.begun(g); known && begun.After(at) {
					t.Errorf("the broker answered a request begun %v after the suspension (pid %d)", begun.Sub(at), g.pid)
				}
			}
			before := len(atkGrants(a.rd, 1))

			// The supervisor is back: a renewal resumes the generation.
			res, err := c.Renew(context.Background(), 1, 0)
			if err != nil || !res.Resumed || res.State != api.StateRunning {
				t.Fatalf("renewal: %+v %v", res, err)
			}
			eventually(t, 30*time.Second, "the broker answering generation 1 again", func() bool { return len(atkGrants(a.rd, 1)) > before })
			if ev, _ := os.ReadFile(filepath.Join(r1.Cgroup, "cgroup.events")); !strings.Contains(string(ev), "frozen 0") {
				t.Fatalf("generation 1 is still frozen after the renewal: %s", ev)
			}

			x := a.announce(1, 60*time.Second, a.plainArgs(2, "--", "sleep", "1000")...)
			var r2 api.StartResult
			if x.code != 0 || !jsonInto(x.out, &r2) || len(r2.Fenced) != 1 || r2.Fenced[0].Survivors != 0 {
				t.Fatalf("announcing gen 2: exit %d %s %s", x.code, x.out, x.errs)
			}
			a.checkGone(x, 1, r1.Cgroup, a.out)
			t.Logf("%s: push ended %q after %d bytes; suspension cut %+v", mode, how, proxy.maxUp(), l.Cut.DurationsMS)
			a.stop()
		})
	}
}

// jsonInto decodes s into v and reports whether it could.
func jsonInto(s string, v any) bool { return json.Unmarshal([]byte(s), v) == nil }
