// Package creds gives each harness generation its credentials and its
// network, and takes both away again at a fence.
//
// Credentials: the supervisor hands shim a list of Credential values with the
// start request; a Broker holds them in memory only and answers git's
// credential-helper requests on cred.sock. The harness never sees a secret in
// its environment or on disk: HarnessEnv configures git to run
// `shim credential get` (HelperMain), which asks the broker over the socket.
// The broker identifies the caller by SO_PEERCRED and answers only processes
// of the current, running generation whose request matches a grant. Revoke is
// the credential half of the fence's cut step.
//
// Network: NewNetwork gives a generation host networking (shared), "none"
// (its own network namespace with loopback only) or "isolated" (its own
// namespace whose only way out is a veth to shim's HTTP CONNECT / plain-HTTP
// egress proxy with an allowlist). Network.Run starts the harness inside the
// namespace; Network.Cut is the network half of the fence's cut step.
//
// Secrets never appear in logs, audit records, errors or JSON produced by
// this package: Credential formats and marshals itself redacted.
package creds
