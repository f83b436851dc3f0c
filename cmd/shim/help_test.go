package main

import (
	"os"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

// readmeCommands is the README's CLI synopsis, one entry per command
// (a "shim ..." line and its continuation lines).
func readmeCommands(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "### CLI\n")
	j := strings.Index(s[i:], "\nRuntime dir:")
	if i < 0 || j < 0 {
		t.Fatal("README has no CLI synopsis")
	}
	var cmds []string
	for _, line := range strings.Split(s[i:i+j], "\n") {
		l := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(l, "shim "):
			cmds = append(cmds, l)
		case strings.HasPrefix(l, "[") && len(cmds) > 0:
			cmds[len(cmds)-1] += " " + l
		}
	}
	if len(cmds) < 15 {
		t.Fatalf("README's synopsis: %d commands", len(cmds))
	}
	return cmds
}

var (
	flagRE   = regexp.MustCompile(`--[a-z][a-z0-9-]*`)
	ctlVerb  = regexp.MustCompile(`^shim ctl +\[--runtime-dir DIR\] +([a-z]+)`)
	shimVerb = regexp.MustCompile(`shim ([a-z]+)`)
)

// shim --help and shim ctl --help list every verb and flag the README's
// synopsis lists (the ctl ones in both).
func TestHelpListsTheREADMEsSynopsis(t *testing.T) {
	for _, cmd := range readmeCommands(t) {
		var words []string
		if m := ctlVerb.FindStringSubmatch(cmd); m != nil {
			words = append(words, "  "+m[1])
		} else {
			for _, m := range shimVerb.FindAllStringSubmatch(cmd, -1) {
				words = append(words, "shim "+m[1])
			}
		}
		words = append(words, flagRE.FindAllString(cmd, -1)...)
		for _, w := range words {
			if !strings.Contains(usage, w) {
				t.Errorf("shim --help lacks %q (README: %s)", w, cmd)
			}
			if strings.HasPrefix(cmd, "shim ctl") && !strings.Contains(ctlUsage, w) {
				t.Errorf("shim ctl --help lacks %q (README: %s)", w, cmd)
			}
		}
	}
}

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
