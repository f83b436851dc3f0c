package gitguard

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/internal/creds"
)

// FetchRefPrefix is where a fetched branch lands:
// refs/shim/remote/<remote>/<branch>. Shim owns that namespace; the user's
// refs/remotes/* and the remote itself are never written.
const FetchRefPrefix = "refs/shim/remote/"

// DefaultFetchTimeout bounds one fetch when FetchSpec.Timeout is 0.
const DefaultFetchTimeout = 60 * time.Second

// maxRemoteCommits caps FetchReport.RemoteCommits.
const maxRemoteCommits = 50

// fetchProtocols are the transports a fetch may use. https and http carry
// the supervisor's credentials (matched by protocol, so an https credential
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
	// Credentials are the supervisor's; the one that matches the remote's
	// URL (creds.Match: protocol, host, path prefix) is offered to that URL
	// only, as an Authorization header in the fetching git's environment.
	Credentials []creds.Credential
	// Timeout bounds the fetch; 0 is DefaultFetchTimeout.
	Timeout time.Duration
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
type RemoteCommit struct {
	Commit  string `json:"commit"`
	Subject string `json:"subject"`
}

// FetchReport is the "fetch" part of a Report. A fetch that failed is
// reported in Error; it never fails the restore.
type FetchReport struct {
	Remote string `json:"remote"`
	Branch string `json:"branch"`
	// URL is the remote's URL from the pristine config (after url.*.insteadOf),
	// without userinfo.
	URL string `json:"url,omitempty"`
	// Ref is where the branch was fetched to: refs/shim/remote/<remote>/<branch>.
	Ref string `json:"ref,omitempty"`
	// Authenticated is true when one of the supervisor's credentials
	// matched the URL and was offered.
	Authenticated bool `json:"authenticated"`
	// FetchedCommit is the commit the remote branch pointed at.
	FetchedCommit string `json:"fetched_commit,omitempty"`
	// Baseline is the commit it is compared with.
	Baseline string `json:"baseline,omitempty"`
	// RemoteMoved is true when FetchedCommit is neither the baseline nor an
	// ancestor of it: the remote gained commits after the baseline, most
	// likely pushed by the abandoned generation.
	RemoteMoved bool `json:"remote_moved"`
	// RemoteCommits are those commits (fetched ^baseline), newest first,
	// at most 50; RemoteCommitCount counts all of them.
	RemoteCommits          []RemoteCommit `json:"remote_commits,omitempty"`
	RemoteCommitCount      int            `json:"remote_commit_count"`
	RemoteCommitsTruncated bool           `json:"remote_commits_truncated,omitempty"`
	// Error says why the fetch or the comparison failed ("" when it did not).
	Error      string  `json:"error,omitempty"`
	DurationMS float64 `json:"duration_ms"`
}

// RestoreOption changes one Restore.
type RestoreOption func(*restoreOpts)

type restoreOpts struct{ fetch *FetchSpec }

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
		return nil, errorf(CodeBadRequest, nil, "baseline %q is not a commit in %s", baseline, g.wt)
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
	var secrets []string
	fail := func(format string, args ...any) *FetchReport {
		rep.Error = scrubSecrets(fmt.Sprintf(format, args...), secrets)
		rep.DurationMS = ms(time.Since(t))
		return rep
	}
	if err := spec.Validate(); err != nil {
		return fail("%v", err)
	}
	if rep.Branch == "" {
		b, ok := strings.CutPrefix(g.pristineBranch(), "refs/heads/")
		if !ok || b == "" {
			return fail("no branch to fetch: the registered HEAD names no branch (%s); announce the fetch with a branch", strings.TrimSpace(g.st.Head))
		}
		rep.Branch = b
	}
	rep.Ref = FetchRefPrefix + rep.Remote + "/" + rep.Branch
	if g.st.Includes {
		// An included file may be one the harness can edit (url rewrites,
		// http.proxy, http.sslCAInfo): no secret goes out under it.
		return fail("the registered config includes other files; shim does not fetch with a configuration it cannot vouch for")
	}

	// The URL, from the pristine config: the remote must be configured (an
	// unknown name would be taken as a path), and ls-remote --get-url
	// applies url.*.insteadOf exactly as the fetch will.
	if _, err := g.git(ctx, gitOpts{quiet: true}, "config", "--no-includes", "--get", "remote."+rep.Remote+".url"); err != nil {
		return fail("remote %q has no url in the registered config", rep.Remote)
	}
	out, err := g.git(ctx, gitOpts{}, "ls-remote", "--get-url", "--", rep.Remote)
	if err != nil {
		return fail("url of remote %q: %v", rep.Remote, err)
	}
	rawURL := strings.TrimSpace(string(out))
	u, scheme, err := parseRemoteURL(rawURL)
	if err != nil {
		return fail("remote %q: %v", rep.Remote, err)
	}
	if u.User != nil {
		if p, ok := u.User.Password(); ok && p != "" {
			secrets = append(secrets, p, url.QueryEscape(p), url.PathEscape(p))
		}
	}
	rep.URL = redactURL(u)

	// The credential, as an Authorization header scoped to this URL
	// (http.<url>.extraHeader), in the fetching git's environment only:
	// not in its argv, not on disk, not in the harness's environment.
	var env []string
	if (scheme == "https" || scheme == "http") && !hasPassword(u) {
		user := ""
		if u.User != nil {
			user = u.User.Username()
		}
		if c, ok := creds.Match(spec.Credentials, scheme, u.Host, strings.TrimPrefix(u.Path, "/"), user); ok {
			basic := base64.StdEncoding.EncodeToString([]byte(c.Username + ":" + c.Password))
			secrets = append(secrets, c.Password, basic)
			scoped := *u
			scoped.User = nil
			env = append(env,
				"GIT_CONFIG_COUNT=1",
				"GIT_CONFIG_KEY_0=http."+scoped.String()+".extraHeader",
				"GIT_CONFIG_VALUE_0=Authorization: Basic "+basic)
			rep.Authenticated = true
		}
	}

	cfg := make([]string, 0, len(fetchProtocols)+12)
	for _, p := range fetchProtocols {
		if p == scheme {
			cfg = append(cfg, "protocol."+p+".allow=always")
		} else {
			cfg = append(cfg, "protocol."+p+".allow=never")
		}
	}
	cfg = append(cfg,
		"http.followRedirects=false", // the header goes to this URL only
		"fetch.prune=false", "fetch.pruneTags=false",
		"remote."+rep.Remote+".prune=false", "remote."+rep.Remote+".pruneTags=false",
		"fetch.recurseSubmodules=false", "fetch.writeCommitGraph=false",
		"fetch.showForcedUpdates=false", "fetch.output=compact",
	)
	timeout := spec.Timeout
	if timeout == 0 {
		timeout = DefaultFetchTimeout
	}
	fctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// --refmap= : the command-line refspec updates nothing else (no
	// opportunistic refs/remotes/<remote>/<branch>); '+' because the
	// remote may have been force-pushed and the ref is shim's.
	_, err = g.git(fctx, gitOpts{network: true, env: env, config: cfg},
		"fetch", "--quiet", "--no-tags", "--no-prune", "--no-write-fetch-head", "--no-recurse-submodules",
		"--no-auto-gc", "--refmap=", "--", rep.Remote, "+refs/heads/"+rep.Branch+":"+rep.Ref)
	if err != nil {
		if fctx.Err() != nil && ctx.Err() == nil {
			return fail("fetch %s of %s timed out after %s", rep.Branch, rep.URL, timeout)
		}
		return fail("fetch %s of %s: %v", rep.Branch, rep.URL, err)
	}
	res, err := g.lookup(ctx, []string{rep.Ref + "^{commit}"})
	if err != nil || res[0].typ != "commit" {
		return fail("fetched %s is not a commit (%v)", rep.Ref, err)
	}
	rep.FetchedCommit = res[0].oid
	if rep.FetchedCommit != baseline {
		out, err := g.git(ctx, gitOpts{}, "rev-list", "--count", rep.FetchedCommit, "^"+baseline, "--")
		if err != nil {
			return fail("compare %s with the baseline: %v", rep.Ref, err)
		}
		rep.RemoteCommitCount, _ = strconv.Atoi(strings.TrimSpace(string(out)))
	}
	rep.RemoteMoved = rep.RemoteCommitCount > 0
	if rep.RemoteMoved {
		out, err := g.git(ctx, gitOpts{config: []string{"log.showSignature=false"}}, "log", "-z", "--no-decorate",
			"--no-show-signature", "--no-color", "--format=%H%x00%s", "--max-count="+strconv.Itoa(maxRemoteCommits),
			rep.FetchedCommit, "^"+baseline, "--")
		if err != nil {
			return fail("list the remote's commits: %v", err)
		}
		f := bytes.Split(bytes.TrimSuffix(out, []byte{0}), []byte{0})
		for i := 0; i+1 < len(f); i += 2 {
			subj := string(f[i+1])
			if len(subj) > 200 {
				subj = subj[:200] + "…"
			}
			rep.RemoteCommits = append(rep.RemoteCommits, RemoteCommit{Commit: string(f[i]), Subject: subj})
		}
		rep.RemoteCommitsTruncated = rep.RemoteCommitCount > len(rep.RemoteCommits)
	}
	rep.DurationMS = ms(time.Since(t))
	return rep
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

// scrubSecrets replaces every secret in s (git's stderr may quote a URL).
func scrubSecrets(s string, secrets []string) string {
	for _, sec := range secrets {
		if len(sec) >= 4 {
			s = strings.ReplaceAll(s, sec, "[REDACTED]")
		}
	}
	return s
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
