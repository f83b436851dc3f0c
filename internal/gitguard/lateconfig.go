package gitguard

import (
	"bytes"
	"sort"
	"strings"
)

// configEntry is one record of `git config -z --list`.
type configEntry struct {
	key, value string
	hasValue   bool // "key" alone (a boolean true) has none
}

// parseConfigEntries reads `git config -z --list` output.
func parseConfigEntries(out []byte) []configEntry {
	var es []configEntry
	for _, rec := range bytes.Split(out, []byte{0}) {
		if len(rec) == 0 {
			continue
		}
		k, v, ok := strings.Cut(string(rec), "\n")
		es = append(es, configEntry{key: k, value: v, hasValue: ok})
	}
	return es
}

// lateCoreKeys are the keys of the minimal safe set without a subsection,
// in the order they are written, each with its value check (which returns
// the value to write, or false to drop the key).
var lateCoreKeys = []struct {
	key   string
	value func(v string, has bool) (string, bool)
}{
	{"core.repositoryformatversion", oneOf("0", "1")},
	{"core.filemode", boolValue},
	{"core.bare", func(string, bool) (string, bool) { return "false", true }},
	{"core.symlinks", boolValue},
	{"core.ignorecase", boolValue},
	{"core.precomposeunicode", boolValue},
	{"core.logallrefupdates", func(v string, has bool) (string, bool) {
		if strings.EqualFold(v, "always") {
			return "always", true
		}
		return boolValue(v, has)
	}},
	{"extensions.objectformat", oneOf("sha1", "sha256")},
	{"user.name", plainText},
	{"user.email", plainText},
}

// lateSubKeys are the keys with a subsection (remote or branch name) the
// minimal set keeps; multi marks those git reads every value of.
var lateSubKeys = map[string]struct {
	value func(v string, has bool) (string, bool)
	multi bool
}{
	"remote.url":    {func(v string, _ bool) (string, bool) { return v, acceptableRemoteURL(v) }, true},
	"remote.fetch":  {refspec, true},
	"branch.remote": {func(v string, _ bool) (string, bool) { return v, v == "." || validRefPart(v) == "" }, false},
	"branch.merge": {func(v string, _ bool) (string, bool) {
		r, ok := strings.CutPrefix(v, "refs/")
		return v, ok && validRefPart(r) == ""
	}, false},
}

// lateSection is one [section "sub"] of the minimal config.
type lateSection struct {
	section, sub string
	vars         [][2]string // name, value
}

// lateConfig builds the pristine config of a late registration from the
// current config's entries: the minimal safe set (lateCoreKeys,
// lateSubKeys) with remoteURLs applied; every other key is dropped (listed
// once, in the order found). core.bare is always written false, and listed
// when it said otherwise.
func lateConfig(entries []configEntry, remoteURLs map[string]string) ([]byte, []string) {
	core := map[string]string{}
	var subs []*lateSection
	var dropped []string
	drop := func(k string) {
		if !contains(dropped, k) {
			dropped = append(dropped, k)
		}
	}
	for _, e := range entries {
		section, sub, name, ok := splitConfigKey(e.key)
		if !ok {
			drop(e.key)
			continue
		}
		if sub == "" {
			if v, keep := lateCoreValue(e); keep {
				if e.key == "core.bare" && boolString(e) != "false" {
					drop(e.key)
				}
				core[e.key] = v
			} else {
				drop(e.key)
			}
			continue
		}
		rule, known := lateSubKeys[section+"."+name]
		v, keep := "", false
		if known && validRefPart(sub) == "" {
			v, keep = rule.value(e.value, e.hasValue)
		}
		if !keep || !e.hasValue || strings.ContainsAny(v, "\x00\n\r") {
			drop(e.key)
			continue
		}
		sec := findSection(&subs, section, sub)
		if !rule.multi {
			sec.vars = removeVar(sec.vars, name)
		}
		sec.vars = append(sec.vars, [2]string{name, v})
	}
	applyRemoteURLs(&subs, remoteURLs)
	if _, ok := core["core.bare"]; !ok {
		core["core.bare"] = "false"
	}
	return writeLateConfig(core, subs), dropped
}

// boolString is the boolean an entry says, normalised ("" when it is no
// boolean).
func boolString(e configEntry) string {
	v, _ := boolValue(e.value, e.hasValue)
	return v
}

// lateCoreValue checks an entry without subsection against lateCoreKeys.
func lateCoreValue(e configEntry) (string, bool) {
	for _, k := range lateCoreKeys {
		if k.key == e.key {
			return k.value(e.value, e.hasValue)
		}
	}
	return "", false
}

// applyRemoteURLs replaces every url of each named remote by the
// announced one (adding the remote, with git's default fetch refspec, when
// the config had none).
func applyRemoteURLs(subs *[]*lateSection, remoteURLs map[string]string) {
	names := make([]string, 0, len(remoteURLs))
	for n := range remoteURLs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		sec := findSection(subs, "remote", n)
		sec.vars = append(removeVar(sec.vars, "url"), [2]string{"url", remoteURLs[n]})
		hasFetch := false
		for _, v := range sec.vars {
			hasFetch = hasFetch || v[0] == "fetch"
		}
		if !hasFetch {
			sec.vars = append(sec.vars, [2]string{"fetch", "+refs/heads/*:refs/remotes/" + n + "/*"})
		}
	}
}

// writeLateConfig writes the config file: [core], [extensions], [user],
// then the remotes and branches in the order found.
func writeLateConfig(core map[string]string, subs []*lateSection) []byte {
	var b strings.Builder
	last := ""
	for _, k := range lateCoreKeys {
		v, ok := core[k.key]
		if !ok {
			continue
		}
		section, name, _ := strings.Cut(k.key, ".")
		if section != last {
			b.WriteString("[" + section + "]\n")
			last = section
		}
		b.WriteString("\t" + name + " = " + quoteConfigValue(v) + "\n")
	}
	for _, s := range subs {
		if len(s.vars) == 0 {
			continue
		}
		b.WriteString("[" + s.section + " " + quoteConfigValue(s.sub) + "]\n")
		for _, v := range s.vars {
			b.WriteString("\t" + v[0] + " = " + quoteConfigValue(v[1]) + "\n")
		}
	}
	return []byte(b.String())
}

// splitConfigKey splits "section[.sub].name" as git lists it.
func splitConfigKey(key string) (section, sub, name string, ok bool) {
	i, j := strings.IndexByte(key, '.'), strings.LastIndexByte(key, '.')
	if i <= 0 || j == len(key)-1 {
		return "", "", "", false
	}
	section, name = key[:i], key[j+1:]
	if j > i {
		sub = key[i+1 : j]
	}
	return section, sub, name, true
}

func findSection(subs *[]*lateSection, section, sub string) *lateSection {
	for _, s := range *subs {
		if s.section == section && s.sub == sub {
			return s
		}
	}
	s := &lateSection{section: section, sub: sub}
	*subs = append(*subs, s)
	return s
}

func removeVar(vars [][2]string, name string) [][2]string {
	out := vars[:0]
	for _, v := range vars {
		if v[0] != name {
			out = append(out, v)
		}
	}
	return out
}

// quoteConfigValue quotes a value (or subsection name) for a config file.
func quoteConfigValue(v string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\t", `\t`)
	return `"` + r.Replace(v) + `"`
}

// boolValue normalises a git boolean ("key" alone is true).
func boolValue(v string, has bool) (string, bool) {
	if !has {
		return "true", true
	}
	switch strings.ToLower(v) {
	case "true", "yes", "on", "1":
		return "true", true
	case "false", "no", "off", "0", "":
		return "false", true
	}
	return "", false
}

func oneOf(allowed ...string) func(string, bool) (string, bool) {
	return func(v string, has bool) (string, bool) {
		for _, a := range allowed {
			if has && strings.EqualFold(v, a) {
				return a, true
			}
		}
		return "", false
	}
}

// plainText accepts a value without control characters other than tab.
func plainText(v string, has bool) (string, bool) {
	return v, has && !hasControl(strings.ReplaceAll(v, "\t", " "))
}

// refspec accepts a fetch refspec: no control characters or spaces.
func refspec(v string, has bool) (string, bool) {
	return v, has && v != "" && len(v) <= 1024 && !hasControl(v) && !strings.Contains(v, " ")
}

func hasControl(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return true
		}
	}
	return false
}

// acceptableRemoteURL accepts what the minimal config may name as a
// remote: an https, http or file URL (the transports shim fetches), an
// absolute path, or a path relative to the worktree (./ or ../).
func acceptableRemoteURL(u string) bool {
	if u == "" || len(u) > 4096 || hasControl(u) {
		return false
	}
	if strings.HasPrefix(u, "./") || strings.HasPrefix(u, "../") {
		return true
	}
	_, _, err := parseRemoteURL(u)
	return err == nil
}

// validRemoteURLs checks RegisterOptions.RemoteURLs (BAD_REQUEST).
func validRemoteURLs(urls map[string]string) error {
	for name, u := range urls {
		if why := validRefPart(name); why != "" {
			return errorf(CodeBadRequest, nil, "remote name %q: %s", name, why)
		}
		if !acceptableRemoteURL(u) {
			return errorf(CodeBadRequest, nil, "remote %q: url %q is not an https, http or file URL or a plain path", name, redactIfURL(u))
		}
	}
	return nil
}

// redactIfURL drops userinfo from u when it parses as a URL.
func redactIfURL(u string) string {
	if p, _, err := parseRemoteURL(u); err == nil {
		return redactURL(p)
	}
	if i := strings.LastIndexByte(u, '@'); i >= 0 {
		return "…" + u[i:]
	}
	return u
}

// sortedCopy returns s sorted (a copy).
func sortedCopy(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}

// contains reports whether s holds x.
func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}
