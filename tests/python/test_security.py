"""The Python client's TLS, mutual TLS and bearer token options against a
real klserve started with --tls_cert, --tls_key, --tls_client_ca and
--auth_token_file, with certificates made here by openssl."""

import os
import subprocess

import grpc
import pytest

import klserve
from conftest import Server
from reference import indexer_kl_reference
from test_client import check, dense_problem

TOKEN = "py test token 0123456789abcdef"  # spaces are allowed


def openssl(*args, cwd):
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True,
                          text=True)
    assert done.returncode == 0, "openssl %s: %s" % (args[0], done.stderr)


def make_ca(d, name):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
            name + ".key", "-out", name + ".pem", "-days", "2",
            "-subj", "/CN=" + name, "-addext",
            "basicConstraints=critical,CA:TRUE", "-addext",
            "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def make_leaf(d, name, ca, extensions):
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", name + ".key", "-out", name + ".csr",
            "-subj", "/CN=" + name, cwd=d)
    (d / (name + ".ext")).write_text("\n".join(extensions) + "\n")
    openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem",
            "-CAkey", ca + ".key", "-CAcreateserial", "-out", name + ".pem",
            "-days", "2", "-extfile", name + ".ext", cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "ca")
    make_ca(d, "other_ca")
    make_leaf(d, "server", "ca", [
        "basicConstraints=CA:FALSE", "extendedKeyUsage=serverAuth",
        "subjectAltName=DNS:klserve.test,DNS:localhost,IP:127.0.0.1"])
    make_leaf(d, "client", "ca", [
        "basicConstraints=CA:FALSE", "extendedKeyUsage=clientAuth"])
    (d / "token").write_text(TOKEN + "\n")
    (d / "empty.pem").write_text("")
    return d


@pytest.fixture(scope="module")
def secure_server(pki):
    srv = Server("--tls_cert=%s" % (pki / "server.pem"),
                 "--tls_key=%s" % (pki / "server.key"),
                 "--tls_client_ca=%s" % (pki / "ca.pem"),
                 "--auth_token_file=%s" % (pki / "token"),
                 client_options=dict(
                     tls_ca_file=str(pki / "ca.pem"),
                     tls_cert_file=str(pki / "client.pem"),
                     tls_key_file=str(pki / "client.key"),
                     auth_token=TOKEN))
    yield srv
    assert srv.stop() == 0, "".join(srv.log)


def refused(srv, **options):
    """The KlserveError of a server_info call with `options` (no retries)."""
    with srv.client(max_attempts=1, deadline=10.0, **options) as c:
        with pytest.raises(klserve.KlserveError) as e:
            c.server_info()
    return e.value


def test_mutual_tls_and_token_compute_the_reference_unary_and_streamed(
        secure_server):
    problem = dense_problem(31, batch=2, heads=2, rows=5, keys=9)
    ref = indexer_kl_reference(**problem, causal=True)
    with secure_server.client() as c:
        assert c.health()
        assert c.server_info().backend in ("cpu", "cuda")
        for stream in (False, True):
            r = c.compute_loss(**problem, causal=True, stream=stream)
            assert r.streamed is stream
            check(r, ref)


def test_the_server_name_override_checks_the_certificate(secure_server):
    # The target is an IP; the certificate also names klserve.test.
    with secure_server.client(tls_server_name="klserve.test") as c:
        assert c.server_info().backend
    e = refused(secure_server, tls_server_name="not-in-the-cert.test")
    assert e.code == grpc.StatusCode.UNAVAILABLE


def test_missing_and_wrong_tokens_are_unauthenticated(secure_server):
    e = refused(secure_server, auth_token=None)
    assert e.code == grpc.StatusCode.UNAUTHENTICATED
    assert "missing" in e.details
    e = refused(secure_server, auth_token="not-the-token")
    assert e.code == grpc.StatusCode.UNAUTHENTICATED
    assert "wrong token" in e.details
    with secure_server.client(auth_token="not-the-token") as c:
        with pytest.raises(klserve.KlserveError) as err:
            c.compute_loss(**dense_problem(32), stream=True)
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_health_needs_no_token(secure_server):
    with secure_server.client(auth_token=None) as c:
        assert c.health()


def test_plaintext_wrong_ca_and_no_client_certificate_are_refused(
        secure_server, pki):
    e = refused(secure_server, tls_ca_file=None, tls_cert_file=None,
                tls_key_file=None)
    assert e.code == grpc.StatusCode.UNAVAILABLE
    # The bare transport failure comes with what to do about it.
    assert "tls_ca_file" in e.details, e.details
    e = refused(secure_server, tls_ca_file=str(pki / "other_ca.pem"))
    assert e.code == grpc.StatusCode.UNAVAILABLE
    e = refused(secure_server, tls_cert_file=None, tls_key_file=None)
    assert e.code == grpc.StatusCode.UNAVAILABLE
    assert "tls_cert_file" in e.details, e.details


def test_a_host_alone_is_taken_over_tls(pki):
    # Over TLS, gRPC's port for a name (443) may well be a proxy's; the
    # plaintext refusal (test_client.py) must not reach it.
    klserve.Client("klserve.test", tls_ca_file=str(pki / "ca.pem")).close()


def test_bad_security_options_name_the_option(pki, tmp_path):
    fifo = tmp_path / "ca.fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.pem"
    huge.write_bytes(b"x" * ((1 << 20) + 1))
    blank = tmp_path / "blank.pem"
    blank.write_text(" \n\t\n")
    cases = [
        (dict(tls_cert_file=str(pki / "client.pem"),
              tls_key_file=str(pki / "client.key")), "need tls_ca_file"),
        (dict(tls_server_name="x"), "need tls_ca_file"),
        (dict(tls_ca_file=str(pki / "ca.pem"),
              tls_cert_file=str(pki / "client.pem")), "set both or neither"),
        (dict(tls_ca_file=str(pki / "missing.pem")), "tls_ca_file: cannot read"),
        (dict(tls_ca_file=str(pki / "empty.pem")), "tls_ca_file: .* is empty"),
        (dict(tls_ca_file=str(blank)), "tls_ca_file: .* is empty"),
        # Read whole, /dev/zero filled the memory; a FIFO waited for a writer.
        (dict(tls_ca_file="/dev/zero"), "tls_ca_file: .* not a regular file"),
        (dict(tls_ca_file=str(fifo)), "tls_ca_file: .* not a regular file"),
        (dict(tls_ca_file=str(pki)), "tls_ca_file: .* not a regular file"),
        (dict(tls_ca_file=str(huge)), "tls_ca_file: .* larger than 1048576"),
        (dict(tls_ca_file="/proc/sys/kernel/hostname"),
         "tls_ca_file: .* procfs or sysfs"),
        (dict(tls_ca_file="/proc/self/status"),
         "tls_ca_file: .* procfs or sysfs"),
        # Not PEM, or not of its kind: gRPC took them and every handshake
        # failed with "empty address list".
        (dict(tls_ca_file=str(pki / "client.key")),
         "tls_ca_file: .* holds no PEM certificate"),
        (dict(tls_ca_file=str(pki / "ca.pem"),
              tls_cert_file=str(pki / "client.pem"),
              tls_key_file=str(pki / "client.pem")),
         "tls_key_file: .* holds no PEM private key"),
        (dict(tls_ca_file=__file__), "tls_ca_file: .* holds no PEM"),
        (dict(auth_token=""), "auth_token"),
        (dict(auth_token="new\nline"), "auth_token"),
        (dict(auth_token="caf\u00e9"), "auth_token"),
    ]
    for options, message in cases:
        with pytest.raises(ValueError, match=message):
            klserve.Client("127.0.0.1:1", **options)
