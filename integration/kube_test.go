package integration

// The Kubernetes pod (issue 26, item 5): images/kube/shim-pod.yaml played
// with `podman kube play` (no cluster): shim is the sandbox container's
// PID 1, the supervisor container announces generations through the
// control socket in the shared emptyDir and reads the fence report.

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
)

func TestKubePodPlay(t *testing.T) {
	c := matrixCase{name: "podman kube play", tool: "podman", runtime: "runc"}
	if why := matrixWhy(c); why != "" {
		if os.Getenv("SHIM_REQUIRE_INTEGRATION") == "1" {
			t.Fatalf("kube play cannot run (%s) but SHIM_REQUIRE_INTEGRATION=1", why)
		}
		t.Skip(why)
	}
	e := newMatrixEngine(t, c)
	data, err := os.ReadFile("../images/kube/shim-pod.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pod := randName("shim-pod-")
	manifest := strings.ReplaceAll(string(data), "image: localhost/shim-sandbox:dev", "image: "+e.img)
	manifest = strings.Replace(manifest, "name: shim-sandbox\n", "name: "+pod+"\n", 1)
	// podman 4.3 makes an emptyDir a named volume, by the volume's name:
	// two pods of one manifest on one host would share the socket's dir.
	manifest = strings.ReplaceAll(manifest, "shim-run", pod+"-run")
	dir := t.TempDir()
	yaml := filepath.Join(dir, "pod.yaml")
	if err := os.WriteFile(yaml, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	// This host's hard rlimits are below podman's defaults (see
	// matrixUlimits) and crun cannot run on its hybrid cgroups: a
	// containers.conf of the test's own says so (kube play has no --ulimit).
	conf := filepath.Join(dir, "containers.conf")
	lim := matrixUlimits()
	if err := os.WriteFile(conf, []byte("[containers]\ndefault_ulimits = [\""+lim[1]+"\", \""+lim[3]+"\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CONTAINERS_CONF", conf)
	// podman builds its infra (pause) image locally for the pod; remove it
	// after unless it was there before (best effort: a pod of another run
	// may hold it).
	pauseBefore, _, _ := e.cmd("", "images", "-q", "localhost/podman-pause")
	t.Cleanup(func() {
		if strings.TrimSpace(pauseBefore) == "" {
			if ids, _, _ := e.cmd("", "images", "-q", "localhost/podman-pause"); strings.TrimSpace(ids) != "" {
				e.cmd("", append([]string{"rmi"}, strings.Fields(ids)...)...)
			}
		}
	})
	// kube play has no --cgroup-parent: the pod's cgroup is
	// /libpod_parent/<pod id>, which podman 4.3 leaves behind (with
	// /libpod_parent and its conmon when this test made them).
	_, lpErr := os.Stat("/sys/fs/cgroup/unified/libpod_parent")
	_, lpErr2 := os.Stat("/sys/fs/cgroup/libpod_parent")
	hadLibpodParent := lpErr == nil || lpErr2 == nil
	var podID string
	t.Cleanup(func() {
		if podID != "" {
			removeCgroupEverywhere(t, filepath.Join("/libpod_parent", podID))
		}
		if !hadLibpodParent {
			// Emptied only: rmdir fails on one another run still uses.
			for _, rel := range []string{"/libpod_parent/conmon", "/libpod_parent"} {
				ds, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", rel))
				for _, d := range append(ds, filepath.Join("/sys/fs/cgroup", rel)) {
					os.Remove(d)
				}
			}
		}
	})
	t.Cleanup(func() {
		if t.Failed() {
			out, errs, _ := e.cmd("", "logs", pod+"-sandbox")
			t.Logf("sandbox logs:\n%s%s", out, errs)
		}
		e.cmd("", "kube", "down", yaml)
		e.cmd("", "pod", "rm", "-f", pod)
		e.cmd("", "volume", "rm", "-f", pod+"-run")
	})
	out, errs, code := e.cmd("", "kube", "play", "--network", "none", yaml)
	if id, _, _ := e.cmd("", "pod", "inspect", "-f", "{{.ID}}", pod); strings.TrimSpace(id) != "" {
		podID = strings.TrimSpace(id)
	}
	if code != 0 {
		t.Fatalf("podman kube play: exit %d: %s%s", code, out, errs)
	}
	sandbox := &matrixBox{t: t, e: e, Name: pod + "-sandbox"}
	super := &matrixBox{t: t, e: e, Name: pod + "-supervisor"}
	ctl := func(v any, args ...string) {
		t.Helper()
		super.ctl(v, append([]string{"--runtime-dir", "/run/shim"}, args...)...)
	}
	var st api.Status
	eventually(t, 60*time.Second, "shim answers the supervisor through the emptyDir", func() bool {
		_, _, code := super.Exec("", "shim", "ctl", "--runtime-dir", "/run/shim", "status")
		return code == 0
	})
	ctl(&st, "status")
	t.Logf("kube pod: mode %s (%s), isolation %s (%s)", st.Mode, st.ModeReason, st.Isolation.Mode, st.Isolation.Reason)
	if st.ShimPid != 1 {
		t.Errorf("shim is not PID 1 of the sandbox container: %+v", st)
	}
	const wt = "/workspace/repo"
	sandbox.MustExec("agent", "sh", "-c", "mkdir -p "+wt+" && cd "+wt+" && git init -q -b main && echo base > f && git add f && "+
		"git -c user.name=a -c user.email=a@b commit -qm base")
	ctl(nil, "start", "--generation", "1", "--user", "1000:1000", "--worktree", wt, "--", "sh", "-c",
		"cd "+wt+" && echo edit > f && echo new > n && sh -c 'setsid sh -c \"while :; do sleep 0.2; done\" &' & sleep 1000")
	eventually(t, 30*time.Second, "gen 1 running", func() bool {
		var g api.Status
		ctl(&g, "status")
		return g.State == "running"
	})
	var r2 api.StartResult
	ctl(&r2, "start", "--generation", "2", "--user", "1000:1000", "--worktree", wt, "--", "true")
	if len(r2.Fenced) != 1 || r2.Fenced[0].Survivors != 0 || r2.Fenced[0].SnapshotRef != "refs/shim/abandoned/1" {
		t.Fatalf("fence report: %+v", r2.Fenced)
	}
	t.Logf("kube pod fence: killed %d, survivors %d, %s, durations %v", r2.Fenced[0].Killed, r2.Fenced[0].Survivors,
		r2.Fenced[0].SnapshotRef, r2.Fenced[0].DurationsMS)
	if got := strings.TrimSpace(sandbox.MustExec("agent", "git", "-C", wt, "show", "refs/shim/abandoned/1:n")); got != "new" {
		t.Errorf("snapshot n = %q", got)
	}
	// The harness's uid cannot drive shim from the supervisor's container.
	if _, _, code := super.Exec("1000", "shim", "ctl", "--runtime-dir", "/run/shim", "status"); code == 0 {
		t.Errorf("uid 1000 in the supervisor's container reached shim")
	}
}
