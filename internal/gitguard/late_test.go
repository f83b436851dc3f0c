package gitguard

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// armExecCapable plants, as a generation that ran before the registration
// could, metadata that makes plain git run a payload or look elsewhere:
// core.fsmonitor, hooks, an include, a url rewrite, a credential helper,
// core.sshCommand, a filter with info/attributes, and alternates. It also
// sets what a late registration keeps. It returns the url.*.insteadof key.
func armExecCapable(t *testing.T, f *fixture) string {
	t.Helper()
	f.writePayload(t)
	tgit(t, f.wt, "config", "core.fsmonitor", f.payload())
	tgit(t, f.wt, "config", "credential.helper", "!"+f.payload())
	tgit(t, f.wt, "config", "core.sshCommand", f.payload())
	tgit(t, f.wt, "config", "filter.evil.clean", f.payload())
	tgit(t, f.wt, "config", "user.name", `Agent "Smith" \ tab	`)
	inc := filepath.Join(f.outside, "inc.cfg")
	must(t, os.WriteFile(inc, []byte("[alias]\n\tst = !"+f.payload()+"\n"), 0o644))
	tgit(t, f.wt, "config", "include.path", inc)
	decoy := filepath.Join(f.root, "decoy.git")
	tgit(t, f.root, "clone", "-q", "--bare", f.origin, decoy)
	tgit(t, f.wt, "config", "url."+decoy+".insteadOf", f.origin)
	hookScripts(t, f, filepath.Join(f.wt, ".git/hooks"))
	writeFile(t, filepath.Join(f.wt, ".git/info/attributes"), "* filter=evil\n")
	writeFile(t, filepath.Join(f.wt, ".git/info/exclude"), "*.tmp\n")
	writeFile(t, filepath.Join(f.wt, ".git/objects/info/alternates"), filepath.Join(f.origin, "objects")+"\n")
	return "url." + decoy + ".insteadof"
}

// plainGit runs the machine's git as a user would, with no override: the
// attack works against it when the metadata carries one.
func plainGit(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("/usr/bin/git", args...)
	cmd.Dir = dir
	cmd.Env = testEnv(os.TempDir())
	_ = cmd.Run()
}

// lateKept is what a restored config of a late registration may hold.
func lateKept(key string) bool {
	switch key {
	case "core.repositoryformatversion", "core.filemode", "core.symlinks", "core.ignorecase",
		"core.precomposeunicode", "core.logallrefupdates", "core.bare", "extensions.objectformat",
		"user.name", "user.email":
		return true
	}
	section, _, name, ok := splitConfigKey(key)
	return ok && (section == "remote" && (name == "url" || name == "fetch") ||
		section == "branch" && (name == "remote" || name == "merge"))
}

// TestLateRegistrationDropsExecCapableMetadata: a worktree registered late
// (a generation may have written it) keeps only the minimal safe config;
// each planted key, hook, info/attributes and the alternates are dropped
// and listed; after a restore .git/config holds no exec-capable key and
// neither the fsmonitor nor a hook runs under plain `git status` and `git
// commit`. The control, a trusted registration of the same repository,
// keeps them: the attack works there.
func TestLateRegistrationDropsExecCapableMetadata(t *testing.T) {
	ctx := context.Background()

	// Control: trusted.
	c := newFixture(t)
	armExecCapable(t, c)
	gc := c.guard(t, nil)
	if rep, err := gc.RegisterWith(ctx, RegisterOptions{}); err != nil || rep.Late || len(rep.Dropped) > 0 {
		t.Fatalf("trusted registration report %+v %v", rep, err)
	}
	c.commonEdits(t)
	if _, err := gc.Restore(ctx, 1, c.baseline); err != nil {
		t.Fatalf("control restore: %v", err)
	}
	if c.payloadRan() {
		t.Fatal("control: the payload ran during shim's restore")
	}
	plainGit(t, c.wt, "status")
	if !c.payloadRan() {
		t.Fatal("control: plain git status after a trusted registration ran nothing; the test has no teeth")
	}

	// Late.
	f := newFixture(t)
	urlKey := armExecCapable(t, f)
	g, err := New(Config{Worktree: f.wt, StateDir: f.state, Git: "/usr/bin/git"})
	must(t, err)
	rep, err := g.RegisterWith(ctx, RegisterOptions{Late: true})
	if err != nil {
		t.Fatalf("late registration: %v", err)
	}
	t.Logf("dropped: %q", rep.Dropped)
	if !rep.Late {
		t.Error("report not late")
	}
	for _, want := range []string{"core.fsmonitor", "credential.helper", "core.sshcommand", "filter.evil.clean",
		"include.path", urlKey, "hooks/pre-commit", "hooks/post-checkout", "info/attributes",
		"objects/info/alternates", "index"} {
		if !contains(rep.Dropped, want) {
			t.Errorf("dropped %q lacks %q", rep.Dropped, want)
		}
	}
	for _, kept := range []string{"user.name", "remote.origin.url", "core.repositoryformatversion", "info/exclude"} {
		if contains(rep.Dropped, kept) {
			t.Errorf("%s dropped", kept)
		}
	}
	if strings.Contains(strings.Join(rep.Dropped, " "), ".sample") {
		t.Errorf("sample hooks listed: %q", rep.Dropped)
	}

	f.commonEdits(t)
	res, err := g.Restore(ctx, 1, f.baseline)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	if !contains(res.MetadataRestored, "config") || !contains(res.MetadataRestored, "objects/info/alternates") {
		t.Errorf("metadata restored %v", res.MetadataRestored)
	}
	f.assertBaseline(t)
	f.assertSnapshot(t, res)
	for _, kv := range strings.Split(tgit(t, f.wt, "config", "--file", filepath.Join(f.wt, ".git/config"), "--list"), "\n") {
		if k, _, _ := strings.Cut(kv, "="); !lateKept(k) {
			t.Errorf("restored config has %q", kv)
		}
	}
	if got := tgit(t, f.wt, "config", "--file", filepath.Join(f.wt, ".git/config"), "user.name"); got != `Agent "Smith" \ tab` {
		t.Errorf("user.name = %q", got)
	}
	if got := readFileT(t, filepath.Join(f.wt, ".git/info/exclude")); got != "*.tmp\n" {
		t.Errorf("info/exclude = %q", got)
	}
	if ents, err := os.ReadDir(filepath.Join(f.wt, ".git/hooks")); err != nil || len(ents) != 0 {
		t.Errorf("hooks after the restore: %v %v", ents, err)
	}
	for _, p := range []string{".git/info/attributes", ".git/objects/info/alternates"} {
		if _, err := os.Lstat(filepath.Join(f.wt, p)); err == nil {
			t.Errorf("%s still there", p)
		}
	}
	plainGit(t, f.wt, "status")
	plainGit(t, f.wt, "commit", "-q", "--allow-empty", "-m", "x")
	plainGit(t, f.wt, "st")
	if f.payloadRan() {
		b, _ := os.ReadFile(f.marker())
		t.Fatalf("the payload ran after a late registration:\n%s", b)
	}

	// The report is persisted: a second registration, even by a new Guard
	// and without Late, returns it and changes nothing.
	g2, err := New(Config{Worktree: f.wt, StateDir: f.state, Git: "/usr/bin/git"})
	must(t, err)
	rep2, err := g2.RegisterWith(ctx, RegisterOptions{})
	if err != nil || !rep2.Late || strings.Join(rep2.Dropped, ",") != strings.Join(rep.Dropped, ",") {
		t.Errorf("second registration %+v %v, want %+v", rep2, err, rep)
	}
}

// TestLateRegistrationRemotesAndHead: announced remote URLs override and
// add; a remote URL shim would not fetch (ssh, ext::) is dropped; a bad
// announced URL, or remote URLs without Late, is BAD_REQUEST; a HEAD that
// names something other than a branch is refused.
func TestLateRegistrationRemotesAndHead(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	tgit(t, f.wt, "remote", "add", "evil", "ext::sh -c x")
	tgit(t, f.wt, "remote", "add", "scp", "git@example.invalid:x.git")
	tgit(t, f.wt, "remote", "add", "up", "https://example.invalid/up.git")
	g, err := New(Config{Worktree: f.wt, StateDir: f.state, Git: "/usr/bin/git"})
	must(t, err)
	for _, opts := range []RegisterOptions{
		{RemoteURLs: map[string]string{"origin": "file://" + f.origin}},
		{Late: true, RemoteURLs: map[string]string{"origin": "ext::sh -c evil"}},
		{Late: true, RemoteURLs: map[string]string{"origin": "git@example.invalid:x.git"}},
		{Late: true, RemoteURLs: map[string]string{"-x": "https://example.invalid/x.git"}},
	} {
		if _, err := g.RegisterWith(ctx, opts); code(err) != CodeBadRequest {
			t.Errorf("register %+v = %v, want BAD_REQUEST", opts, err)
		}
	}
	if _, err := os.Stat(filepath.Join(f.state, stateFile)); err == nil {
		t.Fatal("state written by a refused registration")
	}
	rep, err := g.RegisterWith(ctx, RegisterOptions{Late: true, RemoteURLs: map[string]string{
		"origin": "file://" + f.origin, "mirror": "https://example.invalid/mirror.git"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"remote.evil.url", "remote.scp.url"} {
		if !contains(rep.Dropped, want) {
			t.Errorf("dropped %q lacks %s", rep.Dropped, want)
		}
	}
	if _, err := g.Restore(ctx, 1, f.baseline); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(f.wt, ".git/config")
	for key, want := range map[string]string{
		"remote.origin.url": "file://" + f.origin, "remote.mirror.url": "https://example.invalid/mirror.git",
		"remote.mirror.fetch": "+refs/heads/*:refs/remotes/mirror/*", "remote.up.url": "https://example.invalid/up.git",
		"branch.main.remote": "origin", "branch.main.merge": "refs/heads/main", "core.bare": "false",
	} {
		if got := tgit(t, f.wt, "config", "--file", cfg, "--get-all", key); got != want {
			t.Errorf("%s = %q, want %q", key, got, want)
		}
	}

	f2 := newFixture(t)
	must(t, os.WriteFile(filepath.Join(f2.wt, ".git/HEAD"), []byte("ref: refs/shim/abandoned/1\n"), 0o644))
	g2, err := New(Config{Worktree: f2.wt, StateDir: f2.state, Git: "/usr/bin/git"})
	must(t, err)
	if _, err := g2.RegisterWith(ctx, RegisterOptions{Late: true}); code(err) != CodeWorktreeRefused {
		t.Errorf("late registration with HEAD on a shim ref = %v, want WORKTREE_REFUSED", err)
	}
}

// TestLateConfig checks the minimal config builder itself: booleans
// normalised, core.bare forced false (and listed), unknown values and keys
// dropped, values quoted so that git reads back exactly what was kept.
func TestLateConfig(t *testing.T) {
	entries := []configEntry{
		{key: "core.repositoryformatversion", value: "0", hasValue: true},
		{key: "core.filemode", hasValue: false},
		{key: "core.bare", value: "yes", hasValue: true},
		{key: "core.symlinks", value: "maybe", hasValue: true},
		{key: "core.logallrefupdates", value: "Always", hasValue: true},
		{key: "core.pager", value: "less", hasValue: true},
		{key: "extensions.objectformat", value: "sha1", hasValue: true},
		{key: "extensions.worktreeconfig", value: "true", hasValue: true},
		{key: "user.email", value: `a"b\c@d`, hasValue: true},
		{key: "remote.o.r.url", value: "https://h/x.git", hasValue: true},
		{key: "remote.o.r.url", value: "/srv/x.git", hasValue: true},
		{key: "remote.o.r.pushurl", value: "https://h/p.git", hasValue: true},
		{key: "remote.o.r.fetch", value: "+refs/heads/*:refs/remotes/o.r/*", hasValue: true},
		{key: "branch.feature/x.merge", value: "refs/heads/feature/x", hasValue: true},
		{key: "branch.feature/x.remote", value: "ext::sh", hasValue: true},
		{key: "alias.st", value: "!sh", hasValue: true},
	}
	cfg, dropped := lateConfig(entries, nil)
	wantDropped := []string{"core.bare", "core.symlinks", "core.pager", "extensions.worktreeconfig",
		"remote.o.r.pushurl", "branch.feature/x.remote", "alias.st"}
	if strings.Join(dropped, ",") != strings.Join(wantDropped, ",") {
		t.Errorf("dropped %q, want %q", dropped, wantDropped)
	}
	f := newFixture(t)
	path := filepath.Join(f.root, "late.cfg")
	must(t, os.WriteFile(path, cfg, 0o644))
	got := tgit(t, f.root, "config", "--file", path, "--list")
	want := strings.Join([]string{
		"core.repositoryformatversion=0", "core.filemode=true", "core.bare=false", "core.logallrefupdates=always",
		"extensions.objectformat=sha1", `user.email=a"b\c@d`,
		"remote.o.r.url=https://h/x.git", "remote.o.r.url=/srv/x.git", "remote.o.r.fetch=+refs/heads/*:refs/remotes/o.r/*",
		"branch.feature/x.merge=refs/heads/feature/x",
	}, "\n")
	if got != want {
		t.Errorf("config reads back as\n%s\nwant\n%s\nfile:\n%s", got, want, cfg)
	}
}
