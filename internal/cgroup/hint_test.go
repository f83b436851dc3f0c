package cgroup

import (
	"strings"
	"testing"
)

// What mode_reason tells a person where no run flag gives cgroup2: a
// kernel without cgroups (gVisor), a user namespace (rootless podman).
func TestHintBeyondFlags(t *testing.T) {
	container := host{pidnsInit: true, sysAdmin: true, netAdmin: true, self: procCgroups{unified: "/"}}
	cases := []struct {
		name string
		edit func(*host)
		want string
	}{
		{"gVisor", func(h *host) { h.noCgroup, h.initialNS = true, true }, "no cgroups at all"},
		{"rootless", func(h *host) { h.userNS = true }, "in a user namespace (rootless)"},
		{"rootless without cgroupns", func(h *host) { h.userNS, h.initialNS = true, true }, "run with --cgroupns=private for cgroup2"},
		{"full", func(h *host) {}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := container
			c.edit(&h)
			got := h.hint()
			if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
				t.Errorf("hint %q, want one with %q", got, c.want)
			}
		})
	}
	if !isIdentityMap([]byte("         0          0 4294967295\n")) || isIdentityMap([]byte("0 1001 1\n1 400000 65536\n")) {
		t.Errorf("isIdentityMap")
	}
}
