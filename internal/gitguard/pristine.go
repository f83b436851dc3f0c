package gitguard

import (
	"bytes"
	"context"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// savePristine copies (trusted) or builds (late) the metadata into
// StateDir/pristine, via a temporary directory renamed into place so a
// crash leaves no half copy, and returns the state describing it.
//
//shimlint:allow atpaths: the state dir is shim's own (root, 0700)
func (g *Guard) savePristine(ctx context.Context, opts RegisterOptions) (*state, error) {
	gfd, err := openDir(g.gitDir)
	if err != nil {
		return nil, errorf(CodeWorktreeRefused, err, "open git dir")
	}
	defer unix.Close(gfd)
	if _, err := lstatAt(gfd, "commondir"); err == nil {
		return nil, errorf(CodeWorktreeRefused, nil, "%s has a commondir file: linked worktrees are not supported", g.gitDir)
	}
	s := &state{Version: stateVersion, Worktree: g.name, GitDir: g.stateGitDir(g.gitDir), RegisteredAt: time.Now().UTC(), Late: opts.Late}
	if s.Head, err = g.readHead(gfd, opts.Late); err != nil {
		return nil, err
	}
	tmp := g.stateFile(pristineDir + ".tmp")
	pfd, err := newDir(tmp)
	if err != nil {
		return nil, errorf(CodeInternal, err, "create %s", tmp)
	}
	defer unix.Close(pfd)
	if opts.Late {
		err = g.buildLateMetadata(ctx, gfd, pfd, s, opts.RemoteURLs)
	} else {
		err = g.copyMetadata(ctx, gfd, pfd, s)
	}
	if err != nil {
		return nil, err
	}
	// The refs as they are now are the trusted namespace (read only:
	// registration writes nothing into the worktree).
	if refsSupported(gfd) {
		read, err := g.readRefs(gfd, false)
		if err != nil {
			return nil, errorf(CodeWorktreeRefused, err, "read %s/refs", g.gitDir)
		}
		if err := g.saveTrustedRefs(read.refs); err != nil {
			return nil, errorf(CodeInternal, err, "save the trusted refs")
		}
	}
	final := g.stateFile(pristineDir)
	if err := os.RemoveAll(final); err != nil {
		return nil, errorf(CodeInternal, err, "clear %s", final)
	}
	if err := os.Rename(tmp, final); err != nil {
		return nil, errorf(CodeInternal, err, "save pristine copy")
	}
	return s, nil
}

// newDir creates path (ours, in StateDir) afresh, 0700, and opens it.
//
//shimlint:allow atpaths: the state dir is shim's own (root, 0700)
func newDir(path string) (int, error) {
	if err := os.RemoveAll(path); err != nil {
		return -1, err
	}
	if err := os.Mkdir(path, 0o700); err != nil {
		return -1, err
	}
	return openDir(path)
}

// readHead returns the content of HEAD, which must be valid; a late
// registration also requires a branch under refs/heads/ or a detached
// commit (a harness could have pointed HEAD at any ref, e.g. one of shim's,
// which every restore would then move to the baseline).
func (g *Guard) readHead(gfd int, late bool) (string, error) {
	head, _, err := readFileAt(gfd, "HEAD", 4096)
	if err != nil || !validHead(string(head)) {
		return "", errorf(CodeWorktreeRefused, err, "%s/HEAD is missing or invalid", g.gitDir)
	}
	h := string(head)
	if ref, ok := strings.CutPrefix(strings.TrimSpace(h), "ref: "); ok && late && !strings.HasPrefix(ref, "refs/heads/") {
		return "", errorf(CodeWorktreeRefused, nil, "%s/HEAD names %s, not a branch; a late registration does not take it over", g.gitDir, ref)
	}
	return h, nil
}

// copyMetadata is the trusted registration: config, config.worktree,
// objects/info/alternates, hooks/, info/ and the index are copied as they
// are.
func (g *Guard) copyMetadata(ctx context.Context, gfd, pfd int, s *state) error {
	data, err := g.copyFile(gfd, pfd, "config", "config", true)
	if err != nil {
		return err
	}
	// Filter drivers of the pristine config, read by git itself (no
	// includes) from the bytes just copied.
	out, err := g.configList(ctx, data)
	if err != nil {
		return errorf(CodeWorktreeRefused, err, "read %s/config", g.gitDir)
	}
	s.Filters, s.Includes = parseConfigList(out)
	if data, err = g.copyFile(gfd, pfd, "config.worktree", "config.worktree", false); err != nil {
		return err
	}
	s.HasConfigWorktree = data != nil
	if s.HasAlternates, err = g.copyAlternates(gfd, pfd); err != nil {
		return err
	}
	for _, d := range []struct {
		name string
		has  *bool
	}{{"hooks", &s.HasHooks}, {"info", &s.HasInfo}} {
		tree := map[string]fileEntry{}
		if err := readTreeAt(gfd, d.name, "", tree); err != nil {
			if isNotExist(err) {
				continue
			}
			return errorf(CodeWorktreeRefused, err, "read %s/%s", g.gitDir, d.name)
		}
		*d.has = true
		if err := writeTreeAt(pfd, d.name, tree, 0o700, -1, -1); err != nil {
			return errorf(CodeInternal, err, "save %s", d.name)
		}
	}
	s.HasIndex, err = g.copyIndex(gfd)
	return err
}

// copyFile copies the git dir's name into the pristine copy as dst and
// returns its content (nil when it is absent and not required).
func (g *Guard) copyFile(gfd, pfd int, name, dst string, required bool) ([]byte, error) {
	data, st, err := readFileAt(gfd, name, 16<<20)
	if err != nil {
		if isNotExist(err) && !required {
			return nil, nil
		}
		return nil, errorf(CodeWorktreeRefused, err, "read %s/%s", g.gitDir, name)
	}
	if data == nil {
		data = []byte{}
	}
	return data, writeFileAt(pfd, dst, data, st.Mode&0o7777, -1, -1, nil)
}

// copyAlternates copies objects/info/alternates, if there is one.
func (g *Guard) copyAlternates(gfd, pfd int) (bool, error) {
	ofd, err := openDirAt(gfd, "objects")
	if err != nil {
		return false, nil
	}
	defer unix.Close(ofd)
	ifd, err := openDirAt(ofd, "info")
	if err != nil {
		return false, nil
	}
	defer unix.Close(ifd)
	data, st, err := readFileAt(ifd, "alternates", 1<<20)
	if err != nil {
		return false, nil
	}
	if err := writeFileAt(pfd, "alternates", data, st.Mode, -1, -1, nil); err != nil {
		return false, errorf(CodeInternal, err, "save alternates")
	}
	return true, nil
}

// copyIndex saves the trusted index: git's own stat record of the files at
// registration. Snapshots and resets start from it rather than from the
// index the harness leaves, whose entries it may have forged.
func (g *Guard) copyIndex(gfd int) (bool, error) {
	data, st, err := readFileAt(gfd, "index", 1<<31)
	if isNotExist(err) {
		return false, nil
	}
	if err != nil {
		return false, errorf(CodeWorktreeRefused, err, "read %s/index", g.gitDir)
	}
	mt := st.Mtim
	if err := writeFileAtomic(g.stateFile(trustedIndex), data, &mt); err != nil {
		return false, errorf(CodeInternal, err, "save index")
	}
	return true, nil
}

// buildLateMetadata is the late registration: a pristine config of the
// minimal safe set (lateConfig), an empty hooks directory, info/exclude
// only; alternates, config.worktree and the index are not taken over.
// Everything left out goes to s.Dropped.
func (g *Guard) buildLateMetadata(ctx context.Context, gfd, pfd int, s *state, remoteURLs map[string]string) error {
	data, _, err := readFileAt(gfd, "config", 16<<20)
	if err != nil {
		return errorf(CodeWorktreeRefused, err, "read %s/config", g.gitDir)
	}
	out, err := g.configList(ctx, data)
	if err != nil {
		return errorf(CodeWorktreeRefused, err, "read %s/config", g.gitDir)
	}
	cfg, dropped := lateConfig(parseConfigEntries(out), remoteURLs)
	if _, err := g.configList(ctx, cfg); err != nil {
		return errorf(CodeInternal, err, "the minimal config shim wrote does not parse")
	}
	if err := writeFileAt(pfd, "config", cfg, 0o644, -1, -1, nil); err != nil {
		return errorf(CodeInternal, err, "save config")
	}
	s.Dropped = dropped
	for _, name := range []string{"config.worktree", "index"} {
		if _, err := lstatAt(gfd, name); err == nil {
			s.Dropped = append(s.Dropped, name)
		}
	}
	if g.hasAlternates(gfd) {
		s.Dropped = append(s.Dropped, "objects/info/alternates")
	}
	s.Dropped = append(s.Dropped, dirEntriesDropped(gfd, "hooks", "", func(n string) bool { return strings.HasSuffix(n, ".sample") })...)
	if err := writeTreeAt(pfd, "hooks", map[string]fileEntry{}, 0o700, -1, -1); err != nil {
		return errorf(CodeInternal, err, "save hooks")
	}
	s.HasHooks = true
	exclude, excluded := g.lateExclude(gfd)
	s.Dropped = append(s.Dropped, dirEntriesDropped(gfd, "info", excluded, nil)...)
	if exclude != nil {
		s.HasInfo = true
		if err := writeTreeAt(pfd, "info", map[string]fileEntry{"exclude": {data: exclude, mode: 0o644}}, 0o700, -1, -1); err != nil {
			return errorf(CodeInternal, err, "save info")
		}
	}
	return nil
}

// hasAlternates reports whether objects/info/alternates exists (as anything).
func (g *Guard) hasAlternates(gfd int) bool {
	ofd, err := openDirAt(gfd, "objects")
	if err != nil {
		return false
	}
	defer unix.Close(ofd)
	ifd, err := openDirAt(ofd, "info")
	if err != nil {
		return false
	}
	defer unix.Close(ifd)
	_, err = lstatAt(ifd, "alternates")
	return err == nil
}

// lateExclude returns info/exclude when it is a regular file, and "exclude"
// then (the name dirEntriesDropped skips).
func (g *Guard) lateExclude(gfd int) ([]byte, string) {
	ifd, err := openDirAt(gfd, "info")
	if err != nil {
		return nil, ""
	}
	defer unix.Close(ifd)
	data, _, err := readFileAt(ifd, "exclude", 1<<20)
	if err != nil {
		return nil, ""
	}
	if data == nil {
		data = []byte{}
	}
	return data, "exclude"
}

// dirEntriesDropped lists "<dir>/<name>" for the entries of the git dir's
// dir except keep and those silent reports true for; a dir that is a
// symlink or a file is "<dir>" itself.
func dirEntriesDropped(gfd int, dir, keep string, silent func(string) bool) []string {
	fd, err := openDirAt(gfd, dir)
	if err != nil {
		if isNotExist(err) {
			return nil
		}
		return []string{dir}
	}
	defer unix.Close(fd)
	names, err := readDirNames(fd)
	if err != nil {
		return []string{dir}
	}
	var out []string
	for _, n := range names {
		if n != keep && (silent == nil || !silent(n)) {
			out = append(out, dir+"/"+n)
		}
	}
	return sortedCopy(out)
}

// configList parses config file content with hardened git: from stdin,
// outside any repository, without includes, so git opens no file of the
// worktree.
func (g *Guard) configList(ctx context.Context, data []byte) ([]byte, error) {
	return g.git(ctx, gitOpts{stdin: bytes.NewReader(data), noRepo: true}, "config", "--file", "-", "--no-includes", "-z", "--list")
}

// parseConfigList reads `git config -z --list` output and returns the filter
// driver names and whether include directives are present.
func parseConfigList(out []byte) (filters []string, includes bool) {
	seen := map[string]bool{}
	for _, rec := range bytes.Split(out, []byte{0}) {
		key, _, _ := strings.Cut(string(rec), "\n")
		lk := strings.ToLower(key)
		if strings.HasPrefix(lk, "include.") || strings.HasPrefix(lk, "includeif.") {
			includes = true
		}
		if !strings.HasPrefix(lk, "filter.") {
			continue
		}
		rest := key[len("filter."):]
		i := strings.LastIndexByte(rest, '.')
		if i <= 0 {
			continue
		}
		name := rest[:i]
		if !seen[name] && validFilterName(name) {
			seen[name] = true
			filters = append(filters, name)
		}
	}
	return filters, includes
}

// validFilterName rejects names that could not be passed as a -c key.
func validFilterName(n string) bool {
	return n != "" && !strings.ContainsAny(n, "=\n\x00")
}
