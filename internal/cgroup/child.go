package cgroup

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// Child makes the cgroup <parent>/<name> for one tool call of a
// generation ("proc-<K>"), so that the call's whole tree can be signalled
// or killed alone while the generation's own freeze and kill (both
// hierarchical in cgroup2, and through the tree's processes in cgroup1)
// still cover it.
//
// No controller is enabled in the parent's cgroup.subtree_control, so
// cgroup2's "no internal processes" rule does not apply: the harness (or
// an idle generation's holder) stays in the parent beside its calls, and
// the generation's limits, written on the parent, bound them all. The
// child fails with an error matching fs.ErrExist if it exists; pidns mode
// has no cgroups (Code UNSUPPORTED).
func Child(parent Group, name string) (Group, error) {
	k, ok := strings.CutPrefix(name, "proc-")
	if _, err := strconv.ParseUint(k, 10, 64); !ok || err != nil {
		return nil, newError(CodeBadRequest, nil, fmt.Sprintf("invalid child group name %q (want proc-<K>)", name))
	}
	switch p := parent.(type) {
	case *v2Group:
		c := &v2Group{name: p.name + "/" + name, path: filepath.Join(p.path, name), cg: path.Join(p.cg, name), hasKill: p.hasKill}
		if err := mkdirGroup(c.path); err != nil {
			return nil, err
		}
		return c, nil
	case *v1Group:
		c := &v1Group{name: p.name + "/" + name, path: filepath.Join(p.path, name), cg: path.Join(p.cg, name)}
		if err := mkdirGroup(c.path); err != nil {
			return nil, err
		}
		return c, nil
	}
	return nil, newError(CodeUnsupported, nil, "tool calls need cgroups (cgroup2 or cgroup1 freezer), not mode pidns")
}

func mkdirGroup(p string) error {
	if err := os.Mkdir(p, 0o755); err != nil {
		return fmt.Errorf("create group: %w", err)
	}
	return nil
}
