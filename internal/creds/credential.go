package creds

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Credential is one secret the supervisor lets a generation use, e.g. a token
// for https://github.com. It is decoded from the JSON list of
// --credential-file (ParseCredentials) and held in memory by the Broker.
//
// Formatting a Credential with any fmt verb, or marshalling it to JSON, never
// reveals Password: logs, audit records, state files and errors can embed a
// Credential safely. (ctl carries the secret to shim in the start request
// as api.Credential, the wire type.)
type Credential struct {
	Protocol string `json:"protocol"`       // "https"
	Host     string `json:"host"`           // "github.com" or "127.0.0.1:8080"
	Path     string `json:"path,omitempty"` // optional path prefix, matched on segment boundaries
	Username string `json:"username"`
	Password string `json:"password"` // "token" is accepted as an alias when decoding
}

// RedactedCredential is the loggable view of a Credential: everything except
// the secret, plus whether a secret is present.
type RedactedCredential struct {
	Protocol    string `json:"protocol"`
	Host        string `json:"host"`
	Path        string `json:"path,omitempty"`
	Username    string `json:"username"`
	HasPassword bool   `json:"has_password"`
}

// Redacted returns the view of c that may be logged, audited or persisted.
func (c Credential) Redacted() RedactedCredential {
	return RedactedCredential{Protocol: c.Protocol, Host: c.Host, Path: c.Path, Username: c.Username, HasPassword: c.Password != ""}
}

// String describes c without its secret.
func (c Credential) String() string {
	r := c.Redacted()
	s := r.Protocol + "://"
	if r.Username != "" {
		s += r.Username + ":[REDACTED]@"
	}
	s += r.Host
	if r.Path != "" {
		s += "/" + strings.TrimPrefix(r.Path, "/")
	}
	return s
}

// GoString makes %#v redacted as well.
func (c Credential) GoString() string { return "creds.Credential(" + c.String() + ")" }

// Format makes every fmt verb (%v, %+v, %d, %x, ...) print the redacted
// form; without it %+v or %x of a Credential would print the secret.
func (c Credential) Format(f fmt.State, verb rune) {
	if verb == 'v' && f.Flag('#') {
		_, _ = f.Write([]byte(c.GoString()))
		return
	}
	_, _ = f.Write([]byte(c.String()))
}

// MarshalJSON writes the redacted view, so a Credential that ends up in
// state.json, an audit record or a JSON log line carries no secret.
func (c Credential) MarshalJSON() ([]byte, error) { return json.Marshal(c.Redacted()) }

// UnmarshalJSON decodes a credential, accepting "token" as an alias of
// "password". Errors never quote the input.
func (c *Credential) UnmarshalJSON(data []byte) error {
	var w struct {
		Protocol string  `json:"protocol"`
		Host     string  `json:"host"`
		Path     string  `json:"path"`
		Username string  `json:"username"`
		Password *string `json:"password"`
		Token    *string `json:"token"`
	}
	if err := json.Unmarshal(data, &w); err != nil {
		return errors.New("creds: malformed credential object")
	}
	*c = Credential{Protocol: w.Protocol, Host: w.Host, Path: w.Path, Username: w.Username}
	switch {
	case w.Password != nil && w.Token != nil && *w.Password != *w.Token:
		return errors.New("creds: credential has both password and token, and they differ")
	case w.Password != nil:
		c.Password = *w.Password
	case w.Token != nil:
		c.Password = *w.Token
	}
	return nil
}

// ParseCredentials decodes and validates the JSON list of --credential-file
// (or the start request's credentials). Errors name the index and field,
// never a value.
func ParseCredentials(data []byte) ([]Credential, error) {
	var list []Credential
	if err := json.Unmarshal(data, &list); err != nil {
		return nil, errors.New("creds: credentials must be a JSON list of {protocol, host, path, username, password|token}")
	}
	for i := range list {
		if err := list[i].Validate(); err != nil {
			return nil, fmt.Errorf("creds: credential %d: %w", i, err)
		}
	}
	return list, nil
}

// Validate checks that c can ever match a request. Errors never quote the
// secret.
func (c *Credential) Validate() error {
	c.Protocol = strings.ToLower(strings.TrimSpace(c.Protocol))
	c.Host = strings.ToLower(strings.TrimSpace(c.Host))
	c.Path = strings.Trim(strings.TrimSpace(c.Path), "/")
	switch {
	case c.Protocol == "":
		return errors.New("protocol is required")
	case c.Host == "":
		return errors.New("host is required")
	case c.Password == "":
		return errors.New("password (or token) is required")
	case strings.ContainsAny(c.Protocol+c.Host+c.Path+c.Username+c.Password, "\n\x00"):
		return errors.New("fields must not contain newlines or NUL")
	case strings.Contains(c.Host, "/"):
		return errors.New("host must be host[:port], without a path")
	}
	return nil
}

// matches reports whether c answers a git request for protocol/host/path.
// Protocol and host must be equal (case-insensitively); when c has a path
// prefix the request must carry a path that starts with it on a segment
// boundary ("org/repo" matches "org/repo", "org/repo.git", "org/repo/x",
// but not "org/repo-other").
func (c *Credential) matches(protocol, host, path, username string) bool {
	if !strings.EqualFold(c.Protocol, protocol) || !strings.EqualFold(c.Host, host) {
		return false
	}
	if username != "" && c.Username != "" && username != c.Username {
		return false
	}
	if c.Path == "" {
		return true
	}
	p := strings.Trim(path, "/")
	pre := strings.Trim(c.Path, "/")
	if p == pre || strings.HasPrefix(p, pre+"/") {
		return true
	}
	if !strings.HasSuffix(pre, ".git") && (p == pre+".git" || strings.HasPrefix(p, pre+".git/")) {
		return true
	}
	return false
}

// Match returns the credential of list that answers a git request for
// protocol, host and path (and username, when the request names one), by
// the broker's rules: protocol and host equal, the path prefix on a segment
// boundary, and the longest matching path prefix wins. Other holders of the
// supervisor's credentials (shim's own fetch at a fence) use it so that a
// credential is never sent anywhere the broker would not send it.
func Match(list []Credential, protocol, host, path, username string) (Credential, bool) {
	var answer Credential
	best, found := -1, false
	for _, c := range list {
		if c.matches(protocol, host, path, username) && len(c.Path) > best {
			answer, best, found = c, len(c.Path), true
		}
	}
	return answer, found
}
