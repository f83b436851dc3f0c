"""vsock_client: the same verbs over AF_VSOCK (shim init --listen vsock:PORT).

Only the host (CID 2) is admitted by a guest's shim; here no VM runs, so
the test dials CID 1 (this machine itself, VMADDR_CID_LOCAL), which is
refused or unreachable at once and never leaves the machine: the client
must say UNREACHABLE, as for a unix socket nobody listens on."""

import socket

import pytest

from shim_client import Code, ShimError, vsock_client


@pytest.mark.skipif(not hasattr(socket, "AF_VSOCK"), reason="no AF_VSOCK in this Python")
def test_vsock_client_unreachable_is_unreachable():
    c = vsock_client(1, 52000, timeout=10)
    assert c.socket_path == "vsock:1:52000"
    with pytest.raises(ShimError) as e:
        c.health()
    assert e.value.code == Code.UNREACHABLE
