package runtime

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/errs"
	"github.com/shimdev/shim/internal/gitguard"
)

// apiLimits is l as the API reports it (nil when it sets nothing).
func apiLimits(l cgroup.Limits) *api.Limits {
	if l == (cgroup.Limits{}) {
		return nil
	}
	return &api.Limits{MemoryMax: l.MemoryMax, PidsMax: l.PidsMax, CPUMax: l.CPUMax}
}

// harnessEnv is exactly the env the supervisor gave, plus PATH and HOME
// defaults and SHIM_GENERATION; nothing of shim's own environment.
func harnessEnv(req api.StartRequest, home string) []string {
	env := append([]string{}, req.Env...)
	has := func(k string) bool {
		for _, kv := range env {
			if strings.HasPrefix(kv, k+"=") {
				return true
			}
		}
		return false
	}
	if !has("PATH") {
		env = append(env, "PATH="+defaultPath)
	}
	if !has("HOME") && home != "" {
		env = append(env, "HOME="+home)
	}
	return append(env, "SHIM_GENERATION="+strconv.FormatUint(req.Generation, 10))
}

// proxyEnv is the network's proxy variables, except that a NO_PROXY or
// no_proxy the supervisor set wins: in an isolated namespace a direct
// connection reaches only the generation's own loopback, so the list cannot
// widen what the harness reaches; it lets the supervisor send an allowed
// loopback destination of the sandbox (e.g. --allow 127.0.0.1:8080 with
// NO_PROXY=localhost,::1) through the proxy. The proxy variables themselves
// always come from shim.
func proxyEnv(netEnv, reqEnv []string) []string {
	set := map[string]bool{}
	for _, kv := range reqEnv {
		if k, _, ok := strings.Cut(kv, "="); ok && (k == "NO_PROXY" || k == "no_proxy") {
			set[k] = true
		}
	}
	if len(set) == 0 {
		return netEnv
	}
	out := make([]string, 0, len(netEnv))
	for _, kv := range netEnv {
		k, _, _ := strings.Cut(kv, "=")
		if (k == "NO_PROXY" || k == "no_proxy") && (set["NO_PROXY"] || set["no_proxy"]) {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// lookPath finds file on the harness's PATH (not shim's).
func lookPath(file string, env []string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil
	}
	path := defaultPath
	for _, kv := range env {
		if strings.HasPrefix(kv, "PATH=") {
			path = kv[5:]
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			continue // "" and "." would be shim's cwd, not the harness's (os/exec's ErrDot)
		}
		p := filepath.Join(dir, file)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found on the harness's PATH", file)
}

// lookupUser parses "UID[:GID]" or "NAME[:GROUP]"; "" runs as shim's user.
// Supplementary groups are always dropped.
func lookupUser(spec string) (*syscall.Credential, string, error) {
	if spec == "" {
		return nil, "", nil
	}
	name, grp, hasGroup := strings.Cut(spec, ":")
	var uid, gid uint64
	home := ""
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		uid, gid = n, n
		if u, err := user.LookupId(name); err == nil {
			gid, _ = strconv.ParseUint(u.Gid, 10, 32)
			home = u.HomeDir
		}
	} else {
		u, err := user.Lookup(name)
		if err != nil {
			return nil, "", errs.New(api.CodeBadRequest, "user %q: %v", name, err)
		}
		uid, _ = strconv.ParseUint(u.Uid, 10, 32)
		gid, _ = strconv.ParseUint(u.Gid, 10, 32)
		home = u.HomeDir
	}
	if hasGroup {
		if n, err := strconv.ParseUint(grp, 10, 32); err == nil {
			gid = n
		} else {
			g, err := user.LookupGroup(grp)
			if err != nil {
				return nil, "", errs.New(api.CodeBadRequest, "group %q: %v", grp, err)
			}
			gid, _ = strconv.ParseUint(g.Gid, 10, 32)
		}
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, home, nil
}

// reachableBy says why the harness user cred cannot connect to the unix
// socket at path, or returns nil: it needs search permission on every
// directory above the socket and write permission on the socket, with the
// harness's uid and primary gid only (supplementary groups are dropped).
// Root can always connect. A directory or socket with a POSIX ACL is not
// judged (the mode bits do not tell), so an ACL never causes a refusal.
func reachableBy(path string, cred *syscall.Credential) error {
	if cred == nil || cred.Uid == 0 {
		return nil
	}
	may := func(p string, bit uint32) error {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return fmt.Errorf("stat %s: %v", p, err)
		}
		if n, _ := unix.Getxattr(p, "system.posix_acl_access", nil); n > 0 {
			return nil
		}
		ok := st.Mode&bit != 0
		switch {
		case st.Uid == cred.Uid:
			ok = st.Mode&(bit<<6) != 0
		case st.Gid == cred.Gid:
			ok = st.Mode&(bit<<3) != 0
		}
		if !ok {
			return fmt.Errorf("uid %d gid %d cannot use %s (mode %#o, owner %d:%d); make the runtime dir and its parents searchable by the harness user",
				cred.Uid, cred.Gid, p, st.Mode&0o7777, st.Uid, st.Gid)
		}
		return nil
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	for dir := filepath.Dir(abs); ; dir = filepath.Dir(dir) {
		if err := may(dir, 0o1); err != nil {
			return err
		}
		if dir == "/" {
			break
		}
	}
	return may(abs, 0o2)
}

// validateStart checks and normalises a start request.
func validateStart(req *api.StartRequest) error {
	if req.Generation == 0 {
		return errs.New(api.CodeBadRequest, "generation must be a positive integer")
	}
	switch {
	case len(req.Command) == 0:
		req.Idle = true // no harness: a generation for tool calls
	case req.Idle:
		return errs.New(api.CodeBadRequest, "an idle generation has no command")
	case req.Command[0] == "":
		return errs.New(api.CodeBadRequest, "command is required")
	}
	if _, err := leaseOf(req.LeaseMS); err != nil {
		return err
	}
	if req.Branch != "" && (req.Worktree == "" || !gitguard.ValidBranch(req.Branch)) {
		return errs.New(api.CodeBadRequest, "branch %q needs a worktree and a valid branch name", req.Branch)
	}
	switch req.Network {
	case "":
		req.Network = api.NetworkHost
	case api.NetworkHost, api.NetworkNone, api.NetworkIsolated:
	default:
		return errs.New(api.CodeBadRequest, "network must be host, none or isolated, not %q", req.Network)
	}
	if len(req.Allow) > 0 && req.Network != api.NetworkIsolated {
		return errs.New(api.CodeBadRequest, "allow needs network isolated")
	}
	for _, p := range []struct{ name, v string }{{"worktree", req.Worktree}, {"cwd", req.Cwd}} {
		if p.v != "" && !filepath.IsAbs(p.v) {
			return errs.New(api.CodeBadRequest, "%s must be an absolute path, not %q", p.name, p.v)
		}
	}
	if (req.Baseline != "" || len(req.KeepPaths) > 0 || req.IncludeIgnored) && req.Worktree == "" {
		return errs.New(api.CodeBadRequest, "baseline, keep_paths and include_ignored need a worktree")
	}
	if req.Baseline != "" {
		if err := validRevision(req.Baseline); err != nil {
			return err
		}
	}
	for _, p := range req.KeepPaths {
		if p == "" || filepath.IsAbs(p) || strings.HasPrefix(filepath.Clean(p), "..") {
			return errs.New(api.CodeBadRequest, "keep path %q must be relative to the worktree and inside it", p)
		}
	}
	for _, kv := range req.Env {
		if !strings.Contains(kv, "=") {
			return errs.New(api.CodeBadRequest, "env entry %q is not K=V", kv)
		}
	}
	// The broker's own validation: an invalid credential is refused here
	// rather than dropped at grant time, which would start a harness
	// without it.
	if _, err := credsOf(req.Credentials); err != nil {
		return err
	}
	if l := req.Limits; l != nil && (l.MemoryMax < 0 || l.PidsMax < 0) {
		return errs.New(api.CodeBadRequest, "limits must not be negative")
	}
	return nil
}

// validRevision checks a baseline's syntax only (nothing is read: the
// revision is resolved once the generations it fences are dead).
func validRevision(rev string) error {
	bad := len(rev) > 1024 || strings.HasPrefix(rev, "-")
	for _, r := range rev {
		bad = bad || r <= ' ' || r == 0x7f
	}
	if bad {
		return errs.New(api.CodeBadRequest, "invalid baseline revision %q", rev)
	}
	return nil
}
