package runtime

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/errs"
)

// What an announcement is checked for before anything is fenced, so that a
// supervisor's mistake gets the same answer whatever runs, and what is
// checked only after the freeze.
//
//   - The request alone (validateStart, validGenerations): BAD_REQUEST.
//   - What no harness can sway (vetStart): its user and group (root's
//     /etc/passwd and /etc/group), shim's --lower-group, the credential
//     socket's reach (the runtime dir is root's), the limits' syntax and
//     controllers. Refused in every state, nothing fenced, the token where
//     it was.
//   - The worktree's shape and the command (checkShape): a few stat calls,
//     no git, nothing opened. A harness of a live older generation may
//     have changed either (in the scan isolation it writes the sandbox
//     itself), so a failure never spares it: with no live older
//     generation the announcement is refused before anything, otherwise
//     the older generations are fenced all the same and it is then
//     refused with the same code (the worktree) or started as usual if the
//     command is there after the restore (launch.start looks again).
//   - The worktree's git metadata and the baseline, read only once nothing
//     older runs: RESTORE_FAILED (restoreFailed), whether or not there was
//     anything to fence.

// validGenerations refuses a generation (or if_current) above
// api.MaxGeneration, and the worktree "/".
func validGenerations(n uint64, ifCurrent *uint64, worktree string) error {
	if n > api.MaxGeneration {
		return errs.New(api.CodeBadRequest, "generation %d is above %d (2^53-1, the largest every JSON client holds exactly)", n, uint64(api.MaxGeneration))
	}
	if ifCurrent != nil && *ifCurrent > api.MaxGeneration {
		return errs.New(api.CodeBadRequest, "if_current %d is above %d (2^53-1)", *ifCurrent, uint64(api.MaxGeneration))
	}
	if worktree != "" && filepath.Clean(worktree) == "/" {
		return errs.New(api.CodeBadRequest, "worktree must not be /")
	}
	return nil
}

// vetStart checks what req needs that no harness can have changed; see
// above.
func (rt *Runtime) vetStart(req api.StartRequest) error {
	cred, _, err := lookupUser(req.User)
	if err != nil {
		return err
	}
	if rt.layers != nil && cred != nil {
		if lg := rt.layers.LowerGroup(); lg != 0 && cred.Gid == lg {
			return errs.New(api.CodeBadRequest, "gid %d is shim's --lower-group (it enters the locked checkouts): no harness may have it", lg)
		}
	}
	if len(req.Credentials) > 0 {
		if err := reachableBy(filepath.Join(rt.cfg.RuntimeDir, "cred.sock"), cred); err != nil {
			return errs.New(api.CodeStartFailed, "credentials cannot be served to the harness: %v", err)
		}
	}
	if req.Limits == nil {
		return nil
	}
	l := cgroup.Limits{MemoryMax: req.Limits.MemoryMax, PidsMax: req.Limits.PidsMax, CPUMax: req.Limits.CPUMax}
	if err := l.Validate(); err != nil {
		return errs.New(api.CodeBadRequest, "limits: %v", err)
	}
	have := rt.groups.Controllers()
	for _, c := range []struct {
		name string
		set  bool
	}{{"memory", l.MemoryMax > 0}, {"pids", l.PidsMax > 0}, {"cpu", l.CPUMax != ""}} {
		if c.set && !have[c.name] {
			return errs.New(api.CodeControllerMissing, "controller %s is not enabled for generations (mode %s, cgroup root %s): "+
				"drop the limit, or enable the controller in the root's cgroup.subtree_control", c.name, rt.groups.Mode(), rt.groups.Root())
		}
	}
	return nil
}

// checkShape is launcher's starter.checkShape: the worktree is an
// existing directory, named without a symlink, with a .git directory (a
// repository's objects and refs) or gitfile; the command is on the
// harness's PATH, or, named by an absolute path, an executable file.
func (l *launcher) checkShape(req api.StartRequest) error {
	if req.Worktree != "" {
		if err := worktreeShape(req.Worktree); err != nil {
			return err
		}
	}
	if len(req.Command) == 0 {
		return nil
	}
	cmd := req.Command[0]
	path, err := lookPath(cmd, harnessEnv(req, ""))
	if err == nil && filepath.IsAbs(path) {
		var st os.FileInfo
		if st, err = os.Stat(path); err == nil && (!st.Mode().IsRegular() || st.Mode()&0o111 == 0) {
			err = fmt.Errorf("%s is not an executable file", path)
		}
	}
	if err != nil {
		return errs.New(api.CodeStartFailed, "%v", err)
	}
	return nil
}

// worktreeShape is checkShape's worktree.
func worktreeShape(path string) error {
	p := filepath.Clean(path)
	resolved, err := filepath.EvalSymlinks(p)
	if err != nil {
		return errs.New(api.CodeWorktreeRefused, "worktree %s does not exist: %v", p, unwrapPath(err))
	}
	if resolved != p {
		return errs.New(api.CodeWorktreeRefused, "worktree %s resolves to %s: name the checkout itself, not a path through a symlink", p, resolved)
	}
	if st, err := os.Lstat(p); err != nil || !st.IsDir() {
		return errs.New(api.CodeWorktreeRefused, "worktree %s is not a directory", p)
	}
	dotgit := filepath.Join(p, ".git")
	st, err := os.Lstat(dotgit)
	switch {
	case err != nil:
		return errs.New(api.CodeWorktreeRefused, "worktree %s is not a git worktree: %v", p, unwrapPath(err))
	case st.Mode().IsRegular():
		return nil // a gitfile: registration checks where it points
	case !st.IsDir():
		return errs.New(api.CodeWorktreeRefused, "worktree %s is not a git worktree: %s is neither a directory nor a gitfile", p, dotgit)
	}
	for _, d := range []string{"objects", "refs"} {
		if st, err := os.Lstat(filepath.Join(dotgit, d)); err != nil || !st.IsDir() {
			return errs.New(api.CodeWorktreeRefused, "worktree %s is not a git worktree: %s has no %s directory", p, dotgit, d)
		}
	}
	return nil
}

// unwrapPath is a *PathError's errno alone (the message names the path).
func unwrapPath(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

// refusal is the answer admit gives a before anything is fenced, or nil:
// its vetStart refusal, else its checkShape failure when no older
// generation is live (live: one is, and may have caused it).
func (a *announcement) refusal(live bool) error {
	if a.refused != nil {
		return a.refused
	}
	if a.shape != nil && !live {
		return a.shape
	}
	return nil
}

// liveBelowLocked reports whether a generation older than n still has
// processes (not emptied or quiesced). rt.mu held.
func (rt *Runtime) liveBelowLocked(n uint64) bool {
	for m, g := range rt.gens {
		if m < n && g.state != stEmptied && g.state != stQuiesced {
			return true
		}
	}
	return false
}

// dropRefusedWorktree takes a worktree checkShape refused out of an
// admitted announcement, which fences the live older generations all the
// same: their restores do not go there (their own worktrees are restored
// as always). It returns the refusal, answered once they are fenced.
func (a *announcement) dropRefusedWorktree() error {
	if a.shape == nil || api.CodeOf(a.shape) != api.CodeWorktreeRefused {
		return nil
	}
	a.worktree, a.baseline, a.fetch = "", "", nil
	return a.shape
}

// refusedAfterFence answers an announcement whose worktree was refused
// once the live older generations are fenced, and records it.
func (rt *Runtime) refusedAfterFence(a *announcement, refused error, fenced []api.FenceReport) error {
	err := errs.New(api.CodeOf(refused), "%v; %s", refused, fencedNote(fenced))
	rt.audit.Record(a.kind+"_failed", a.n, map[string]any{"error": err.Error()}, true)
	rt.events.publish(api.EventFailed, a.n, &api.FailedData{Error: asAPIError(err)})
	return err
}

// restoreFailed is an error found in the announcement's worktree once
// nothing older runs (its registration, its git metadata, its baseline):
// RESTORE_FAILED in every state, saying what was fenced.
func restoreFailed(err error, fenced []api.FenceReport, format string, args ...any) error {
	code := api.CodeOf(err)
	switch code {
	case api.CodeWorktreeRefused, api.CodeBadRequest, api.CodeNotFound, api.CodeInternal:
		code = api.CodeRestoreFailed
	}
	return errs.New(code, "%s: %v; %s", fmt.Sprintf(format, args...), err, fencedNote(fenced))
}

// fencedNote says what an announcement that did not start fenced first.
func fencedNote(fenced []api.FenceReport) string {
	var gens []string
	for _, r := range fenced {
		gens = append(gens, fmt.Sprint(r.Generation))
	}
	switch {
	case len(gens) == 0:
		return "nothing older was fenced"
	case len(gens) == 1:
		return "generation " + gens[0] + " was fenced first: nothing of it runs"
	}
	return "generations " + strings.Join(gens, ", ") + " were fenced first: nothing of them runs"
}
