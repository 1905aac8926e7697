"""What a Client reads from its gRPC target: a DNS-form target's port and
the default one, and whether the target reaches this host (for shared
memory)."""

import ipaddress
from typing import Optional


# Schemes whose targets gRPC checks itself: a port is the DNS form's only.
_OTHER_SCHEMES = ("unix", "unix-abstract", "ipv4", "ipv6", "vsock", "xds",
                  "google-c2p", "passthrough")


def _dns_host_port(target: str) -> Optional[str]:
    """The host[:port] of a target of the DNS form (no scheme, or dns:);
    None for other schemes."""
    host = target
    # grpcio reads schemes in any case (the C++ client's gRPC does not).
    if host.lower().startswith("dns:"):
        host = host[len("dns:"):]
        if host.startswith("//"):
            slash = host.find("/", 2)
            if slash < 0:
                return None
            host = host[slash + 1:]
    elif host.split(":", 1)[0].lower() in _OTHER_SCHEMES:
        return None
    elif "://" in host:  # a URI of another scheme: gRPC's
        return None
    return host


def bad_port(target: str) -> Optional[str]:
    """The port of a DNS-form host:port target when it is not a number
    from 1 to 65535, http or https (gRPC takes a port past 65535 modulo
    65536, and another word as 0, and connects there); otherwise None."""
    host = _dns_host_port(target)
    if host is None or ":" not in host:
        return None
    port = host.rsplit(":", 1)[1]
    if port.isascii() and port.isdigit() and 1 <= int(port) <= 65535:
        return None
    return None if port in ("http", "https") else port


def with_default_port(target: str) -> Optional[str]:
    """Where `target` names a host without a port ("localhost", "10.0.0.1",
    "[::1]", a bare "::1", each also after "dns:" or "dns://authority/"),
    the host:port to give instead; otherwise None."""
    host = _dns_host_port(target)
    if host is None:
        return None
    if not host.strip():
        return None
    # An empty port ("localhost:", "[::1]:") is none; an IPv6 address may
    # end in "::" itself.
    if host.endswith(":") and (host.endswith("]:") or host.count(":") == 1):
        host, target = host[:-1], target[:-1]
    prefix = target[:len(target) - len(host)]
    if host.startswith("["):
        return None if "]:" in host else target + ":50051"
    colons = host.count(":")
    if colons == 1:
        return None
    # No colon: a name or an IPv4 address. Several: an IPv6 address, whose
    # port needs the brackets.
    return (target + ":50051" if colons == 0 else
            "%s[%s]:50051" % (prefix, host))


def is_local_target(target: str) -> bool:
    """Whether a gRPC target reaches this host: a Unix socket, localhost, a
    loopback address (127.0.0.0/8, ::1), with or without the dns:, ipv4:
    or ipv6: scheme."""
    if target.startswith(("unix:", "unix-abstract:")):
        return True
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if target.startswith(scheme):
            target = target[len(scheme):]
            break
    if target.startswith("["):
        host = target[1:target.find("]")] if "]" in target else target[1:]
    elif target.count(":") == 1:
        host = target.split(":", 1)[0]
    else:
        host = target  # a bare host, or a bare IPv6 address
    host = host.lower().rstrip(".")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
