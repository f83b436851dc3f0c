package runtime

import (
	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/errs"
	"github.com/shimdev/shim/internal/network"
)

// newGenNetwork makes generation n's own network (modes none, isolated).
func newGenNetwork(rt *Runtime, n uint64, req api.StartRequest) (genNetwork, error) {
	nw, err := network.New(n, network.Config{
		Mode: network.Mode(req.Network), Allow: req.Allow, Subnet: rt.cfg.Subnet,
		Audit: func(event string, fields map[string]any) { rt.audit.Record(event, n, fields, false) },
		Log:   rt.log.Named("net"),
	})
	if err != nil {
		return nil, err
	}
	l, _ := rt.launch.(*launcher)
	return netAdapter{n: nw, l: l, cgroup2: rt.groups.Mode() == cgroup.ModeCgroup2}, nil
}

// netAdapter is a network.Network as the runtime's genNetwork.
type netAdapter struct {
	n       *network.Network
	l       *launcher
	cgroup2 bool
}

func (a netAdapter) Run(fn func() error) error { return a.n.Run(fn) }
func (a netAdapter) Env() []string             { return a.n.Env() }
func (a netAdapter) Close() error              { return a.n.Close() }

func (a netAdapter) Info() api.NetworkInfo { return a.n.Info() }

func (a netAdapter) Cut(group cgroup.Group) (api.CutReport, error) { return a.cut(group, a.n.Cut) }

func (a netAdapter) Suspend(group cgroup.Group) (api.CutReport, error) {
	return a.cut(group, a.n.Suspend)
}

func (a netAdapter) Resume() { a.n.Resume() }

// cut runs how (Cut or Suspend) with group's cgroup2 id.
func (a netAdapter) cut(group cgroup.Group, how func(uint64) (api.CutReport, error)) (api.CutReport, error) {
	var id uint64                                // 0: no cgroup2 id to tell the generation's sockets by
	if group != nil && a.cgroup2 && a.l != nil { // no launcher: a test's fake
		var err error
		if id, err = a.l.cgroupID(group.Path()); err != nil {
			return api.CutReport{}, err
		}
	}
	return how(id)
}

// abortSockets destroys a host-mode generation's sockets in shim's own
// network namespace (sock_diag, by the cgroup's id) and reports them.
func (l *launcher) abortSockets(groups []cgroup.Group) ([]api.Connection, error) {
	ids := make([]uint64, 0, len(groups))
	for _, g := range groups {
		id, err := l.cgroupID(g.Path())
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return network.DestroySocketsOf(ids, -1)
}

// cgroupID is the cgroup2 id of a generation's cgroup, as it was when the
// generation started (remembered: the directory may be gone by the time a
// fence cuts what an exit already killed, and its orphaned sockets still
// carry the id; ids are never reused).
func (l *launcher) cgroupID(path string) (uint64, error) {
	if l != nil {
		if id, ok := l.ids.Load(path); ok {
			return id.(uint64), nil
		}
	}
	id, err := cgroupID(path)
	if err == nil && l != nil {
		l.ids.Store(path, id)
	}
	return id, err
}

// cgroupID is the cgroup2 id of the cgroup directory at path: its inode
// number, which the kernel reports as each socket's cgroup.
func cgroupID(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, errs.New(api.CodeCutFailed, "cgroup id of %s: %v", path, err)
	}
	return st.Ino, nil
}
