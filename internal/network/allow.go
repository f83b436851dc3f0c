package network

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// allowEntry is one parsed --allow entry: a host name (lower case, or
// "*.domain" for any subdomain) or IP, and an optional port (0 = the
// default of the request kind: 443 for CONNECT, 80 for plain HTTP).
type allowEntry struct {
	host string
	port int
}

func (a allowEntry) String() string {
	h := a.host
	if strings.Contains(h, ":") {
		h = "[" + h + "]"
	}
	if a.port == 0 {
		return h
	}
	return h + ":" + strconv.Itoa(a.port)
}

func normHost(h string) string {
	h = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(h)), ".")
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if ip := net.ParseIP(h); ip != nil {
		return ip.String()
	}
	return h
}

func parseAllowList(list []string) ([]allowEntry, error) {
	var out []allowEntry
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		e := allowEntry{}
		if h, p, err := net.SplitHostPort(s); err == nil {
			port, perr := strconv.Atoi(p)
			if perr != nil || port < 1 || port > 65535 {
				return nil, errorf(CodeBadRequest, nil, fmt.Sprintf("allow entry %q: bad port", s))
			}
			e.host, e.port = normHost(h), port
		} else {
			e.host = normHost(s)
		}
		if e.host == "" || strings.ContainsAny(e.host, "/ @") || strings.Contains(strings.TrimPrefix(e.host, "*."), "*") {
			return nil, errorf(CodeBadRequest, nil, fmt.Sprintf("allow entry %q: want host[:port]", s))
		}
		out = append(out, e)
	}
	return out, nil
}

// allowed reports whether host:port may be reached; defPort is the port an
// entry without one allows.
func allowed(list []allowEntry, host string, port, defPort int) bool {
	host = normHost(host)
	for _, e := range list {
		p := e.port
		if p == 0 {
			p = defPort
		}
		if p != port {
			continue
		}
		if e.host == host {
			return true
		}
		if d, ok := strings.CutPrefix(e.host, "*."); ok && strings.HasSuffix(host, "."+d) {
			return true
		}
	}
	return false
}
