package vmchan

import (
	"fmt"
	"strconv"
	"strings"
)

// Kinds of Spec.
const (
	KindVsock     = "vsock"     // AF_VSOCK: listen on PORT, or dial CID:PORT
	KindSerial    = "serial"    // a virtio-serial port of the guest, by name
	KindUnix      = "unix"      // a unix socket (shim.sock, or a VMM's end of a serial port)
	KindVsockUDS  = "vsock-uds" // Firecracker's hybrid vsock: a unix socket and a port
	CIDHost       = 2           // VMADDR_CID_HOST: the only peer a vsock listener admits
	CIDLocal      = 1           // VMADDR_CID_LOCAL: the guest itself, through the loopback transport
	maxVsockCID   = 1<<32 - 1
	maxVsockPort  = 1<<32 - 2 // VMADDR_PORT_ANY is 2^32-1
	maxSerialName = 255
)

// Spec is one channel: what --listen and --connect name.
type Spec struct {
	Kind string
	CID  uint32 // vsock dial
	Port uint32 // vsock, vsock-uds
	Name string // serial: the port's name; unix, vsock-uds: the socket's path
}

func (s Spec) String() string {
	switch s.Kind {
	case KindVsock:
		if s.CID != 0 {
			return fmt.Sprintf("vsock:%d:%d", s.CID, s.Port)
		}
		return fmt.Sprintf("vsock:%d", s.Port)
	case KindVsockUDS:
		return fmt.Sprintf("vsock-uds:%s:%d", s.Name, s.Port)
	}
	return s.Kind + ":" + s.Name
}

// ParseListen parses what shim init --listen takes: vsock:PORT or
// serial:NAME.
func ParseListen(v string) (Spec, error) {
	kind, rest, _ := strings.Cut(v, ":")
	switch kind {
	case KindVsock:
		port, err := parsePort(rest)
		if err != nil {
			return Spec{}, fmt.Errorf("--listen %q: %v (want vsock:PORT)", v, err)
		}
		return Spec{Kind: KindVsock, Port: port}, nil
	case KindSerial:
		if rest == "" || len(rest) > maxSerialName || strings.ContainsAny(rest, "/\x00") || rest == "." || rest == ".." {
			return Spec{}, fmt.Errorf("--listen %q: want serial:NAME, NAME a virtio-serial port's name (no slash)", v)
		}
		return Spec{Kind: KindSerial, Name: rest}, nil
	}
	return Spec{}, fmt.Errorf("--listen %q: want vsock:PORT or serial:NAME", v)
}

// ParseConnect parses what shim ctl --connect takes: vsock:CID:PORT,
// unix:PATH, vsock-uds:PATH:PORT or serial:PATH (the host's unix socket
// of a guest's virtio-serial port: QEMU's chardev, Cloud Hypervisor's
// socket; one connection at a time).
func ParseConnect(v string) (Spec, error) {
	kind, rest, _ := strings.Cut(v, ":")
	switch kind {
	case KindVsock:
		c, p, ok := strings.Cut(rest, ":")
		cid, err := strconv.ParseUint(c, 10, 32)
		if !ok || err != nil || cid > maxVsockCID {
			return Spec{}, fmt.Errorf("--connect %q: want vsock:CID:PORT", v)
		}
		port, err := parsePort(p)
		if err != nil {
			return Spec{}, fmt.Errorf("--connect %q: %v", v, err)
		}
		return Spec{Kind: KindVsock, CID: uint32(cid), Port: port}, nil
	case KindUnix, KindSerial:
		if rest == "" {
			return Spec{}, fmt.Errorf("--connect %q: want %s:PATH", v, kind)
		}
		return Spec{Kind: kind, Name: rest}, nil
	case KindVsockUDS:
		i := strings.LastIndexByte(rest, ':')
		if i <= 0 {
			return Spec{}, fmt.Errorf("--connect %q: want vsock-uds:PATH:PORT", v)
		}
		port, err := parsePort(rest[i+1:])
		if err != nil {
			return Spec{}, fmt.Errorf("--connect %q: %v", v, err)
		}
		return Spec{Kind: KindVsockUDS, Name: rest[:i], Port: port}, nil
	}
	return Spec{}, fmt.Errorf("--connect %q: want vsock:CID:PORT, unix:PATH, vsock-uds:PATH:PORT or serial:PATH", v)
}

func parsePort(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == 0 || n > maxVsockPort {
		return 0, fmt.Errorf("port %q is not a number from 1 to %d", s, uint64(maxVsockPort))
	}
	return uint32(n), nil
}
