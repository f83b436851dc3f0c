package gitguard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/shimdev/shim/api"
	"golang.org/x/sys/unix"
)

// FetchRefPrefix is where a fetched branch lands:
// refs/shim/remote/<remote>/<branch>. Shim owns that namespace; the user's
// refs/remotes/* and the remote itself are never written.
const FetchRefPrefix = "refs/shim/remote/"

// DefaultFetchTimeout bounds one fetch when FetchSpec.Timeout is 0.
const DefaultFetchTimeout = 60 * time.Second

// maxRemoteCommits caps FetchReport.RemoteCommits.
const maxRemoteCommits = 50

// fetchProtocols are the transports a fetch may use. https and http may
// carry a credential (FetchAuth, asked by protocol, so an https credential
// never goes over http); file is a local or mounted repository (tests, a
// mirror). Not ssh: shim holds no keys (the credentials are HTTP ones) and
// ssh would run a command from the config (core.sshCommand stays false).
// Not git:// (unauthenticated, unencrypted), ext:: or fd:: (they run or
// borrow processes), nor any remote helper.
var fetchProtocols = []string{"https", "http", "file", "ssh", "git", "ext", "fd", "ftp", "ftps"}

// FetchSpec asks Restore (WithFetch) or Fetch to fetch one branch of a
// remote before the reset and report whether the remote moved past the
// baseline.
type FetchSpec struct {
	// Remote is the name of a remote of the registered config; "" is
	// "origin". Its URL is read from the pristine config, never from what
	// the harness left.
	Remote string
	// Branch is the remote branch (without refs/heads/); "" is the branch
	// the pristine HEAD names.
	Branch string
	// Auth, if set, lets the fetch authenticate over http(s); nil is an
	// anonymous fetch.
	Auth *FetchAuth
	// Timeout bounds the fetch; 0 is DefaultFetchTimeout.
	Timeout time.Duration
}

// FetchAuth is how the fetching git gets a credential: from a git
// credential helper the caller names (in shim, `shim credential`, which
// asks the broker; the runtime makes the broker answer that git's cgroup).
// The secret travels from the helper to git over the helper's stdout only:
// it is never in the environment or argv of any process, shim's own git
// included.
type FetchAuth struct {
	// Has reports whether a credential exists for this URL (protocol,
	// host, path without leading slash, username from the URL or ""); only
	// then is the helper configured.
	Has func(protocol, host, path, username string) bool
	// Helper is the credential helper command line git runs
	// (credential.helper value, e.g. "!'/usr/local/bin/shim' credential"),
	// and Env the variables it needs (e.g. the socket path) — never a
	// secret.
	Helper string
	Env    []string
}

// Validate checks the remote and branch names (BAD_REQUEST).
func (s FetchSpec) Validate() error {
	if s.Remote != "" {
		if why := validRefPart(s.Remote); why != "" {
			return errorf(CodeBadRequest, nil, "fetch remote %q: %s", s.Remote, why)
		}
	}
	if s.Branch != "" {
		if why := validRefPart(strings.TrimPrefix(s.Branch, "refs/heads/")); why != "" {
			return errorf(CodeBadRequest, nil, "fetch branch %q: %s", s.Branch, why)
		}
	}
	if s.Timeout < 0 {
		return errorf(CodeBadRequest, nil, "fetch timeout must be >= 0")
	}
	return nil
}

// RemoteCommit is one commit the remote has and the baseline has not.
type RemoteCommit = api.RemoteCommit

// FetchReport is the push check of a fence.
type FetchReport = api.FetchReport

// RestoreOption changes one Restore.
type RestoreOption func(*restoreOpts)

type restoreOpts struct {
	fetch    *FetchSpec
	moveOnly bool
}

// WithSavedSnapshot is for a worktree that holds nothing but a baseline
// while its generation's snapshot exists already (a layer's lower, or a
// worktree restored a moment ago): Restore moves it to the new baseline and
// keeps the snapshot as it is.
func WithSavedSnapshot() RestoreOption {
	return func(o *restoreOpts) { o.moveOnly = true }
}

// WithFetch makes Restore fetch spec's branch after the pristine metadata is
// back and the snapshot is saved, before the reset (step 2b), and report it
// in Report.Fetch. A failed fetch is reported, not returned: an unreachable
// remote must neither keep the abandoned generation's worktree dirty nor the
// next generation from starting.
func WithFetch(spec FetchSpec) RestoreOption {
	return func(o *restoreOpts) { o.fetch = &spec }
}

// Fetch puts the trusted git metadata back (Restore's first step) and then
// fetches spec's branch into refs/shim/remote/<remote>/<branch>, comparing
// it with baseline. Call it only when no harness runs in the worktree: the
// metadata it restores is the harness's too. The error is for a worktree
// that cannot be opened or restored; a fetch that fails is in the report.
func (g *Guard) Fetch(ctx context.Context, baseline string, spec FetchSpec) (*FetchReport, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := validRev(baseline); err != nil {
		return nil, err
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if err := g.open(true); err != nil {
		return nil, err
	}
	gfd, err := openDir(g.gitDir)
	if err != nil {
		return nil, errorf(CodeWorktreeRefused, err, "open git dir")
	}
	defer unix.Close(gfd)
	if _, err := g.removeLeftovers(gfd); err != nil {
		return nil, errorf(CodeRestoreFailed, err, "remove leftovers of a killed git")
	}
	if _, err := g.restoreMetadata(gfd); err != nil {
		return nil, errorf(CodeRestoreFailed, err, "restore git metadata")
	}
	res, err := g.lookup(ctx, []string{baseline + "^{commit}"})
	if err != nil {
		return nil, errorf(CodeInternal, err, "resolve %q", baseline)
	}
	if res[0].typ != "commit" {
		return nil, errorf(CodeBadRequest, nil, "baseline %q is not a commit in %s", baseline, g.name)
	}
	return g.fetch(ctx, res[0].oid, spec), nil
}

// fetch runs the fetch and the comparison. g.mu is held, g is open and the
// pristine metadata is in place; baseline is a full commit id.
func (g *Guard) fetch(ctx context.Context, baseline string, spec FetchSpec) *FetchReport {
	t := time.Now()
	rep := &FetchReport{Remote: spec.Remote, Branch: strings.TrimPrefix(spec.Branch, "refs/heads/"), Baseline: baseline}
	if rep.Remote == "" {
		rep.Remote = "origin"
	}
	f := &fetchRun{g: g, ctx: ctx, spec: spec, rep: rep}
	if err := f.run(); err != nil {
		rep.Error = scrubSecrets(err.Error(), f.secrets)
	}
	rep.DurationMS = ms(time.Since(t))
	return rep
}

// fetchRun is one fetch: the steps below fill rep; secrets are what must
// never appear in its error (a password embedded in the URL).
type fetchRun struct {
	g       *Guard
	ctx     context.Context
	spec    FetchSpec
	rep     *FetchReport
	url     *url.URL
	scheme  string
	secrets []string
}

func (f *fetchRun) run() error {
	if err := f.spec.Validate(); err != nil {
		return err
	}
	if err := f.target(); err != nil {
		return err
	}
	if err := f.remoteURL(); err != nil {
		return err
	}
	if err := f.fetch(); err != nil {
		return err
	}
	return f.compare()
}

// target fills the branch (default: the pristine HEAD's) and the ref it
// lands in, and refuses a config that includes other files.
func (f *fetchRun) target() error {
	rep := f.rep
	if rep.Branch == "" {
		b, ok := strings.CutPrefix(f.g.pristineBranch(), "refs/heads/")
		if !ok || b == "" {
			return fmt.Errorf("no branch to fetch: the registered HEAD names no branch (%s); announce the fetch with a branch", strings.TrimSpace(f.g.st.Head))
		}
		rep.Branch = b
	}
	rep.Ref = FetchRefPrefix + rep.Remote + "/" + rep.Branch
	if f.g.st.Includes {
		// An included file may be one the harness can edit (url rewrites,
		// http.proxy, http.sslCAInfo): no credential goes out under it.
		return errors.New("the registered config includes other files; shim does not fetch with a configuration it cannot vouch for")
	}
	return nil
}

// remoteURL reads the URL from the pristine config: the remote must be
// configured (an unknown name would be taken as a path), and ls-remote
// --get-url applies url.*.insteadOf exactly as the fetch will.
func (f *fetchRun) remoteURL() error {
	g, rep := f.g, f.rep
	if _, err := g.git(f.ctx, gitOpts{quiet: true}, "config", "--no-includes", "--get", "remote."+rep.Remote+".url"); err != nil {
		return fmt.Errorf("remote %q has no url in the registered config", rep.Remote)
	}
	out, err := g.git(f.ctx, gitOpts{}, "ls-remote", "--get-url", "--", rep.Remote)
	if err != nil {
		return fmt.Errorf("url of remote %q: %v", rep.Remote, err)
	}
	u, scheme, err := parseRemoteURL(strings.TrimSpace(string(out)))
	if err != nil {
		return fmt.Errorf("remote %q: %v", rep.Remote, err)
	}
	if u.User != nil {
		if p, ok := u.User.Password(); ok && p != "" {
			f.secrets = append(f.secrets, p, url.QueryEscape(p), url.PathEscape(p))
		}
	}
	f.url, f.scheme = u, scheme
	rep.URL = redactURL(u)
	return nil
}

// authConfig returns the -c settings and environment that give the
// fetching git the caller's credential helper, when FetchAuth has a
// credential for this URL (and the URL carries no password of its own).
// The helper list is reset first, so no helper of the config runs; git
// never prompts (GIT_TERMINAL_PROMPT=0 is in every git's environment).
func (f *fetchRun) authConfig() (cfg, env []string) {
	a, u := f.spec.Auth, f.url
	if a == nil || a.Has == nil || a.Helper == "" || (f.scheme != "https" && f.scheme != "http") || hasPassword(u) {
		return nil, nil
	}
	user := ""
	if u.User != nil {
		user = u.User.Username()
	}
	if !a.Has(f.scheme, u.Host, strings.TrimPrefix(u.Path, "/"), user) {
		return nil, nil
	}
	f.rep.Authenticated = true
	return []string{
		"credential.helper=",
		"credential.helper=" + a.Helper,
		"credential.useHttpPath=true",
		"credential.interactive=never",
	}, append([]string(nil), a.Env...)
}

// transportConfig allows only scheme's protocol and no redirect (the
// credential goes to this URL only).
func transportConfig(scheme string) []string {
	cfg := make([]string, 0, len(fetchProtocols)+16)
	for _, p := range fetchProtocols {
		if p == scheme {
			cfg = append(cfg, "protocol."+p+".allow=always")
		} else {
			cfg = append(cfg, "protocol."+p+".allow=never")
		}
	}
	return append(cfg, "http.followRedirects=false")
}

// RemoteHead asks the remote at rawURL (a FetchReport's URL) where branch
// points now: the push check again, after a settle window. It runs outside
// any repository, so the worktree (the next generation's by then) and its
// config are not read, with the fetch's transport rules and auth. It
// returns "" when the branch does not exist.
func (g *Guard) RemoteHead(ctx context.Context, rawURL, branch string, auth *FetchAuth) (string, error) {
	if why := validRefPart(branch); why != "" {
		return "", errorf(CodeBadRequest, nil, "branch %q: %s", branch, why)
	}
	u, scheme, err := parseRemoteURL(rawURL)
	if err != nil {
		return "", err
	}
	f := &fetchRun{g: g, ctx: ctx, spec: FetchSpec{Auth: auth}, rep: &FetchReport{}, url: u, scheme: scheme}
	authCfg, env := f.authConfig()
	out, err := g.git(ctx, gitOpts{network: true, noRepo: true, env: env, config: append(transportConfig(scheme), authCfg...),
		timeout: DefaultFetchTimeout}, "ls-remote", "--heads", "--", rawURL, "refs/heads/"+branch)
	if err != nil {
		return "", fmt.Errorf("ls-remote %s: %v", redactURL(u), err)
	}
	commit, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\t")
	if commit != "" && !isHex(commit) {
		return "", fmt.Errorf("ls-remote %s: unexpected answer", redactURL(u))
	}
	return commit, nil
}

// fetch runs the one git that has the network: only the URL's protocol is
// allowed, no redirect is followed, nothing but the shim ref is written.
func (f *fetchRun) fetch() error {
	rep := f.rep
	cfg := transportConfig(f.scheme)
	cfg = append(cfg,
		"fetch.prune=false", "fetch.pruneTags=false",
		"remote."+rep.Remote+".prune=false", "remote."+rep.Remote+".pruneTags=false",
		"fetch.recurseSubmodules=false", "fetch.writeCommitGraph=false",
		"fetch.showForcedUpdates=false", "fetch.output=compact",
	)
	authCfg, env := f.authConfig()
	timeout := f.spec.Timeout
	if timeout == 0 {
		timeout = DefaultFetchTimeout
	}
	// --refmap= : the command-line refspec updates nothing else (no
	// opportunistic refs/remotes/<remote>/<branch>); '+' because the
	// remote may have been force-pushed and the ref is shim's.
	_, err := f.g.git(f.ctx, gitOpts{network: true, env: env, config: append(cfg, authCfg...), timeout: timeout},
		"fetch", "--quiet", "--no-tags", "--no-prune", "--no-write-fetch-head", "--no-recurse-submodules",
		"--no-auto-gc", "--refmap=", "--", rep.Remote, "+refs/heads/"+rep.Branch+":"+rep.Ref)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && f.ctx.Err() == nil {
			return fmt.Errorf("fetch %s of %s timed out after %s", rep.Branch, rep.URL, timeout)
		}
		return fmt.Errorf("fetch %s of %s: %v", rep.Branch, rep.URL, err)
	}
	return nil
}

// compare reports whether the fetched commit is past the baseline, and
// lists those commits.
func (f *fetchRun) compare() error {
	g, rep := f.g, f.rep
	res, err := g.lookup(f.ctx, []string{rep.Ref + "^{commit}"})
	if err != nil || res[0].typ != "commit" {
		return fmt.Errorf("fetched %s is not a commit (%v)", rep.Ref, err)
	}
	rep.FetchedCommit = res[0].oid
	if rep.FetchedCommit != rep.Baseline {
		out, err := g.git(f.ctx, gitOpts{}, "rev-list", "--count", rep.FetchedCommit, "^"+rep.Baseline, "--")
		if err != nil {
			return fmt.Errorf("compare %s with the baseline: %v", rep.Ref, err)
		}
		rep.RemoteCommitCount, _ = strconv.Atoi(strings.TrimSpace(string(out)))
	}
	rep.RemoteMoved = rep.RemoteCommitCount > 0
	if !rep.RemoteMoved {
		return nil
	}
	out, err := g.git(f.ctx, gitOpts{config: []string{"log.showSignature=false"}}, "log", "-z", "--no-decorate",
		"--no-show-signature", "--no-color", "--format=%H%x00%s", "--max-count="+strconv.Itoa(maxRemoteCommits),
		rep.FetchedCommit, "^"+rep.Baseline, "--")
	if err != nil {
		return fmt.Errorf("list the remote's commits: %v", err)
	}
	fs := bytes.Split(bytes.TrimSuffix(out, []byte{0}), []byte{0})
	for i := 0; i+1 < len(fs); i += 2 {
		subj := string(fs[i+1])
		if len(subj) > 200 {
			subj = subj[:200] + "…"
		}
		rep.RemoteCommits = append(rep.RemoteCommits, RemoteCommit{Commit: string(fs[i]), Subject: subj})
	}
	rep.RemoteCommitsTruncated = rep.RemoteCommitCount > len(rep.RemoteCommits)
	return nil
}

// parseRemoteURL accepts https, http and file URLs and absolute paths (the
// file transport) and returns the URL and git's protocol name for it.
func parseRemoteURL(raw string) (*url.URL, string, error) {
	if strings.HasPrefix(raw, "/") {
		return &url.URL{Path: raw}, "file", nil
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" || u.Opaque != "" {
		// scp-like "host:path" is ssh; "x::addr" a remote helper.
		return nil, "", errorf(CodeBadRequest, nil, "url is not an https, http or file URL; shim fetches only those (ssh needs keys shim does not hold)")
	}
	s := strings.ToLower(u.Scheme)
	switch s {
	case "https", "http":
		if u.Host == "" {
			return nil, "", errorf(CodeBadRequest, nil, "%s URL without a host", s)
		}
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return nil, "", errorf(CodeBadRequest, nil, "file URL with a host")
		}
	default:
		return nil, "", errorf(CodeBadRequest, nil, "url scheme %q is not fetched; shim fetches https, http and file URLs only", s)
	}
	return u, s, nil
}

func hasPassword(u *url.URL) bool {
	if u.User == nil {
		return false
	}
	_, ok := u.User.Password()
	return ok
}

// redactURL is u without userinfo.
func redactURL(u *url.URL) string {
	c := *u
	c.User = nil
	if c.Scheme == "" {
		return c.Path
	}
	return c.String()
}

// authToken matches what looks like a credential in git's stderr: an
// Authorization header or a Basic/Bearer token, which a server may echo
// back (shim no longer knows the helper's secret, so it cannot look for it).
var authToken = regexp.MustCompile(`(?i)(authorization:[ \t]*[^\n]*|\b(basic|bearer|token)[ \t]+[A-Za-z0-9+/=._~-]{8,})`)

// scrubSecrets replaces every secret in s (git's stderr may quote a URL
// with its password) and anything that looks like an Authorization value.
func scrubSecrets(s string, secrets []string) string {
	for _, sec := range secrets {
		if len(sec) >= 4 {
			s = strings.ReplaceAll(s, sec, "[REDACTED]")
		}
	}
	return authToken.ReplaceAllString(s, "[REDACTED]")
}

// validRefPart checks a remote or branch name against git's ref name rules
// (check-ref-format), a little stricter, and returns why it is refused or "".
func validRefPart(s string) string {
	switch {
	case s == "" || len(s) > 200:
		return "must be 1 to 200 characters"
	case strings.HasPrefix(s, "-") || strings.HasPrefix(s, "/") || strings.HasSuffix(s, "/"):
		return "must not start with - or /, nor end with /"
	case strings.HasSuffix(s, ".") || strings.HasSuffix(s, ".lock"):
		return "must not end with . or .lock"
	case strings.Contains(s, "..") || strings.Contains(s, "//") || strings.Contains(s, "@{") || s == "@":
		return "must not contain .., //, @{ or be @"
	case strings.ContainsAny(s, " ~^:?*[\\"):
		return "must not contain space ~ ^ : ? * [ \\"
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return "must not contain control characters"
		}
	}
	for _, part := range strings.Split(s, "/") {
		if strings.HasPrefix(part, ".") {
			return "no component may start with ."
		}
	}
	return ""
}
