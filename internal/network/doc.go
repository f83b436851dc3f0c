// Package network gives each harness generation its network and, at a
// fence, takes it away including what is already in flight.
//
// New gives a generation host networking (shared), "none" (its own network
// namespace with loopback only) or "isolated" (its own namespace whose only
// way out is a veth to shim's HTTP CONNECT / plain-HTTP egress proxy with an
// allowlist). Network.Run starts the harness inside the namespace;
// Network.Cut is the network half of the fence's cut step.
//
// Closing a socket or deleting a link is not a cut. The kernel keeps
// flushing the send queue of a frozen or killed process's socket, and a
// proxy that closes its upstream gracefully sends everything it buffered
// before its FIN: a request written just before the freeze still lands
// seconds after the fence. So Cut aborts instead: every proxied connection
// is closed with SO_LINGER 0 on both sides (RST, queues dropped), and every
// TCP socket of the generation's cgroup is destroyed through sock_diag
// (DestroySockets: SOCK_DESTROY, which also sends an RST and drops the send
// queue). Each connection open at the cut is reported as an api.Connection, with what
// the kernel and the proxy knew about it, and whether a request may already
// have reached its server whole (api.Connection.InFlight).
//
// DestroySockets needs Linux 5.9 (cgroup socket filter), CONFIG_INET_DIAG_DESTROY
// and CAP_NET_ADMIN in the target namespace; sockets a harness closed
// itself just before the freeze (orphans still flushing) are aborted from
// Linux 6.11 on. An MPTCP connection is aborted through its TCP subflows
// and reported with its MPTCP-level queue (CONFIG_INET_MPTCP_DIAG); its
// peer is reset with MP_FASTCLOSE where shim can take the socket from its
// process (pidfd_getfd, Linux 5.6, and the right to ptrace it).
package network
