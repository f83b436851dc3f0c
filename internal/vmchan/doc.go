// Package vmchan is shim's control channel across a virtual machine's
// boundary: AF_VSOCK (the channel Firecracker, QEMU and Cloud Hypervisor
// give a guest) and virtio-serial ports, as net.Listeners the control API
// serves, and their dialers for the host side (vsock, and Firecracker's
// hybrid vsock: a unix socket on the host and a "CONNECT PORT" line).
//
// The pitfall it exists for: a vsock listener in the guest is reachable by
// every process of the guest too (through the loopback transport, CID 1,
// or the guest's own CID), and SO_PEERCRED means nothing on it. So the
// only peer a vsock listener admits is the host, CID 2 (Admit), which no
// guest process can be as long as the guest has no host-side transport
// (vhost_vsock): Listen refuses to start when it has one. A virtio-serial
// port has exactly one other end, the host, and shim keeps the guest's
// end open for its whole life: the port admits one opener, so no guest
// process can open it beside shim.
package vmchan
