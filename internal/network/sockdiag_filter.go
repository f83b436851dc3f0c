package network

import (
	"fmt"
	"slices"

	"golang.org/x/sys/unix"
)

// The sock_diag requests: the netlink message and the kernel-side filter
// that keeps the sockets of a set of cgroups.

// request builds a netlink message: header, inet_diag_req_v2, optional
// bytecode attribute, and for a protocol above 255 (MPTCP) the protocol
// attribute.
func request(typ, flags uint16, seq uint32, family uint8, proto uint16, ext uint8, id *sockID, cgroupID cgroupSet) []byte {
	n := unix.SizeofNlMsghdr + sizeofReqV2
	if len(cgroupID) != 0 {
		n += unix.SizeofNlAttr + cgroupID.bytecodeLen()
	}
	if proto > 0xff {
		n += unix.SizeofNlAttr + 4
	}
	b := make([]byte, n)
	native.PutUint32(b[0:], uint32(n))
	native.PutUint16(b[4:], typ)
	native.PutUint16(b[6:], flags)
	native.PutUint32(b[8:], seq)
	r := b[unix.SizeofNlMsghdr:]
	r[0], r[2] = family, ext
	if proto <= 0xff {
		r[1] = uint8(proto)
	}
	if id == nil {
		native.PutUint32(r[4:], ^uint32(0)) // idiag_states: all
	}
	if id != nil {
		id.put(r[8:])
	} else {
		native.PutUint32(r[8+40:], inetDiagNoCookie)
		native.PutUint32(r[8+44:], inetDiagNoCookie)
	}
	a := r[sizeofReqV2:]
	if len(cgroupID) != 0 {
		putCgroupFilter(a, cgroupID)
		a = a[unix.SizeofNlAttr+cgroupID.bytecodeLen():]
	}
	if proto > 0xff {
		native.PutUint16(a[0:], unix.SizeofNlAttr+4)
		native.PutUint16(a[2:], inetDiagReqProtocol)
		native.PutUint32(a[4:], uint32(proto))
	}
	return b
}

// checkCgroupSet refuses a filter of no cgroup, of too many, or of id 0:
// the kernel reports cgroup 0 for every TIME_WAIT and request socket of
// the namespace, never a generation's.
func checkCgroupSet(ids []uint64) error {
	if len(ids) == 0 || len(ids) > maxCgroupSet {
		return errorf(CodeBadRequest, nil, fmt.Sprintf("destroy sockets: %d cgroups (1 to %d)", len(ids), maxCgroupSet))
	}
	if slices.Contains(ids, 0) {
		return errorf(CodeBadRequest, nil, "destroy sockets: cgroup id 0")
	}
	return nil
}

// cgroupSet is the cgroups a dump keeps the sockets of.
type cgroupSet []uint64

func (c cgroupSet) has(id uint64) bool { return slices.Contains(c, id) }

// bytecodeLen is the length of the set's filter: per cgroup a condition
// (an inet_diag_bc_op and the u64 id) and a jump (an op).
func (c cgroupSet) bytecodeLen() int { return len(c) * (sizeofBytecode + 4) }

// putCgroupFilter writes the request attribute that keeps the sockets of
// the cgroups of set only into a. Per cgroup: a condition whose match
// steps to its jump, which jumps to the end (accept), and whose miss steps
// over the jump to the next condition; the last miss jumps 4 past the end
// (reject). A condition's yes is a byte and a jump's no 16 bits, so any
// number of cgroups fits (the kernel's audit walks the ops by their yes:
// each is its op's length, so every op is visited and every no lands on
// one).
func putCgroupFilter(a []byte, set cgroupSet) {
	n := set.bytecodeLen()
	native.PutUint16(a[0:], uint16(unix.SizeofNlAttr+n))
	native.PutUint16(a[2:], inetDiagReqBytecode)
	const block = sizeofBytecode + 4
	for i, id := range set {
		op := a[unix.SizeofNlAttr+i*block:]
		no := block
		if i == len(set)-1 {
			no = block + 4
		}
		op[0], op[1] = inetDiagBCCgroupCond, sizeofBytecode
		native.PutUint16(op[2:], uint16(no))
		native.PutUint64(op[4:], id)
		jmp := op[sizeofBytecode:]
		jmp[0], jmp[1] = inetDiagBCJmp, 4
		native.PutUint16(jmp[2:], uint16(n-i*block-sizeofBytecode)) // from the jump to the end
	}
}
