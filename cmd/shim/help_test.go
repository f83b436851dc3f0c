package main

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionOf(t *testing.T) {
	info := func(main string, settings ...string) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) {
			bi := &debug.BuildInfo{}
			bi.Main.Version = main
			for i := 0; i+1 < len(settings); i += 2 {
				bi.Settings = append(bi.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
			}
			return bi, true
		}
	}
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	rev := "0123456789abcdef0123456789abcdef01234567"
	for _, tc := range []struct {
		stamped string
		info    func() (*debug.BuildInfo, bool)
		want    string
	}{
		{"v1.2.3-4-gabc-dirty", info("", "vcs.revision", rev), "v1.2.3-4-gabc-dirty"},
		{"dev", info("(devel)", "vcs.revision", rev, "vcs.modified", "false"), "dev-0123456789ab"},
		{"dev", info("(devel)", "vcs.revision", rev, "vcs.modified", "true"), "dev-0123456789ab-dirty"},
		{"dev", info("v0.4.0"), "v0.4.0"},
		{"dev", info("(devel)"), "dev"},
		{"dev", none, "dev"},
	} {
		if got := versionOf(tc.stamped, tc.info); got != tc.want {
			t.Errorf("versionOf(%q): %q, want %q", tc.stamped, got, tc.want)
		}
	}
}

func TestInitSaysRootWhenItIsNot(t *testing.T) {
	if err := needRoot(0); err != nil {
		t.Errorf("root: %v", err)
	}
	err := needRoot(65534)
	if err == nil || !strings.Contains(err.Error(), "must run as root") || !strings.Contains(err.Error(), "65534") || len(err.Error()) > 200 {
		t.Errorf("uid 65534: %v", err)
	}
}
