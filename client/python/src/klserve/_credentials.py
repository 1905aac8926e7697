"""The files and token a Client authenticates with: TLS credentials read
from PEM files by the C++ client's rules (auth/credential_file.h), and the
bearer token's call metadata."""

import os
import re
import stat
from typing import Optional, Tuple

import grpc


# The largest credential file read, as the C++ client's reader bounds it
# (auth/credential_file.h): a PEM chain of a few dozen certificates.
_MAX_CREDENTIAL_FILE_BYTES = 1 << 20


def _kernel_filesystem(st_dev: int) -> Optional[str]:
    """Either "proc" or "sysfs" when the device st_dev is a mount of that kernel
    filesystem (per /proc/self/mountinfo: Python's statvfs has no f_type),
    else None."""
    where = "%d:%d" % (os.major(st_dev), os.minor(st_dev))
    try:
        with open("/proc/self/mountinfo", encoding="utf-8",
                  errors="replace") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) > 2 and fields[2] == where and " - " in line:
                    kind = line.split(" - ", 1)[1].split()[0]
                    if kind in ("proc", "sysfs"):
                        return kind
    except OSError:
        pass  # no procfs to ask: nothing of it to refuse either
    return None


def _read_file(field: str, path: str) -> bytes:
    """A regular file's bytes (a symlink to one counts), at most
    _MAX_CREDENTIAL_FILE_BYTES: a path to /dev/zero must not fill the
    memory, nor one to a FIFO wait for a writer. The C++ reader's rules
    (auth/credential_file.h), and whitespace alone counts as empty."""
    def unreadable(why):
        return ValueError("%s: cannot read %r: %s" % (field, path, why))

    try:
        # The type before opening, and again once open (the path may have
        # changed in between).
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise unreadable("not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY |
                     os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            opened = os.fstat(f.fileno())
            if not stat.S_ISREG(opened.st_mode):
                raise unreadable("not a regular file")
            # They pass for regular files, but the kernel writes them.
            if _kernel_filesystem(opened.st_dev) is not None:
                raise unreadable("a file of procfs or sysfs")
            data = f.read(_MAX_CREDENTIAL_FILE_BYTES + 1)
    except OSError as e:
        raise unreadable(e) from e
    if len(data) > _MAX_CREDENTIAL_FILE_BYTES:
        raise unreadable("larger than %d bytes" % _MAX_CREDENTIAL_FILE_BYTES)
    if not data.strip():
        raise ValueError("%s: %r is empty" % (field, path))
    return data


# A PEM block: its label and what lies up to its END line.
_PEM_BLOCK = re.compile(rb"-----BEGIN ([^-\r\n]*)-----(.*?)(?=-----END|\Z)",
                        re.S)
_CERTIFICATE_LABELS = (b"CERTIFICATE", b"X509 CERTIFICATE",
                       b"TRUSTED CERTIFICATE")


def _read_pem(field: str, path: str, private_key: bool) -> bytes:
    """_read_file, and ValueError unless the file holds a PEM block of
    certificates or, with `private_key`, of a private key that is not
    encrypted (the C++ ReadPemFile's rule): gRPC would take any bytes, fail
    every handshake and say only that no address worked; it takes no
    passphrase."""
    pem = _read_file(field, path)
    encrypted = False
    for label, block in _PEM_BLOCK.findall(pem):
        if not private_key:
            if label in _CERTIFICATE_LABELS:
                return pem
        elif label.endswith(b"PRIVATE KEY"):
            if (label == b"ENCRYPTED PRIVATE KEY" or
                    b"Proc-Type: 4,ENCRYPTED" in block):
                encrypted = True
            else:
                return pem
    if encrypted:
        raise ValueError("%s: %r holds an encrypted private key, and gRPC "
                         "takes no passphrase: decrypt it (openssl pkey -in "
                         "KEY -out PLAIN)" % (field, path))
    raise ValueError(
        "%s: %r holds no PEM %s" % (field, path, "private key (a -----BEGIN "
                                    "... PRIVATE KEY----- block)"
                                    if private_key else "certificate (a "
                                    "-----BEGIN CERTIFICATE----- block)"))


def channel_credentials(ca_file: Optional[str], cert_file: Optional[str],
                        key_file: Optional[str], server_name: Optional[str]
                        ) -> Optional[grpc.ChannelCredentials]:
    """TLS credentials, or None for plaintext."""
    if not ca_file:
        if cert_file or key_file or server_name:
            raise ValueError("tls_cert_file, tls_key_file, tls_server_name: "
                             "need tls_ca_file")
        return None
    if bool(cert_file) != bool(key_file):
        raise ValueError("tls_cert_file, tls_key_file: set both or neither")
    return grpc.ssl_channel_credentials(
        root_certificates=_read_pem("tls_ca_file", ca_file, False),
        private_key=(_read_pem("tls_key_file", key_file, True)
                     if key_file else None),
        certificate_chain=(_read_pem("tls_cert_file", cert_file, False)
                           if cert_file else None))


def token_metadata(token: Optional[str]) -> Tuple[Tuple[str, str], ...]:
    """The call metadata carrying the bearer token (none without one)."""
    if token is None:
        return ()
    # The server's rule for its token file (it goes in a gRPC header).
    if not token or not all(0x20 <= ord(ch) <= 0x7E for ch in token):
        raise ValueError("auth_token: must be non-empty printable ASCII")
    return (("authorization", "Bearer " + token),)
