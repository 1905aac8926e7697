"""The exception every failed klserve call raises."""

import re

import grpc


# Trailing metadata of a call the server refused at its limit of calls in
# flight (--max_concurrent_requests, --max_open_streams): it did not run, and
# may be sent again after a backoff (proto/call_metadata.h).
OVERLOADED_METADATA_KEY = "klserve-overloaded"


class KlserveError(grpc.RpcError):
    """A failed klserve call.

    `code` is the grpc.StatusCode and `details` the server's message (for
    INVALID_ARGUMENT it starts with the offending field, e.g.
    "indexer_scores: ..."). Unlike grpc.Call, both are attributes, not
    methods. Requests the client can already tell are malformed (shapes that
    do not fit together, dtypes the wire has no name for) raise it too, with
    INVALID_ARGUMENT, before anything is sent.

    A subclass of grpc.RpcError, so `except grpc.RpcError` catches it.
    """

    def __init__(self, code, details, debug_error_string=None,
                 overloaded=False):
        super().__init__(code, details)
        self.code = code
        self.details = details
        self.debug_error_string = debug_error_string
        # A refusal at the server's limit of calls in flight: the call did
        # not run, and the client retries it as it does UNAVAILABLE.
        self.overloaded = overloaded

    def __str__(self):
        name = getattr(self.code, "name", str(self.code))
        return "%s: %s" % (name, self.details)

    def __repr__(self):
        return "KlserveError(%s, %r)" % (
            getattr(self.code, "name", self.code), self.details)

    @classmethod
    def from_rpc_error(cls, error):
        """Wraps a grpc.RpcError raised by a call (a grpc.Call)."""
        if isinstance(error, KlserveError):
            return error
        code = error.code() if callable(getattr(error, "code", None)) else (
            grpc.StatusCode.UNKNOWN)
        details = error.details() if callable(
            getattr(error, "details", None)) else str(error)
        debug = None
        if callable(getattr(error, "debug_error_string", None)):
            try:
                debug = error.debug_error_string()
            except Exception:  # pragma: no cover - informational only
                debug = None
        # A call that reaches a server as it shuts down, before any handler
        # took it, ends CANCELLED with gRPC's bare "CANCELLED"
        # (grpc/grpc#41785). Nothing of it ran, and the client only cancels
        # after a local error, which it raises instead: it is UNAVAILABLE,
        # retried and reported as such.
        if code == grpc.StatusCode.CANCELLED and details == "CANCELLED":
            code = grpc.StatusCode.UNAVAILABLE
            details = ("the server shut down before handling the call "
                       "(gRPC: CANCELLED)")
        overloaded = False
        if (code == grpc.StatusCode.RESOURCE_EXHAUSTED and
                callable(getattr(error, "trailing_metadata", None))):
            overloaded = any(key == OVERLOADED_METADATA_KEY
                             for key, _ in error.trailing_metadata() or ())
        return cls(code, details or "", debug, overloaded)


# gRPC's words for a connection that failed below the call: what a TLS
# mismatch looks like from the client.
_TRANSPORT_FAILURES = ("Socket closed", "handshake", "Connection reset",
                       "failed to connect")
# ... and its words for an address where nothing listens (TCP, then a Unix
# socket): TLS is not the question there.
_NOTHING_LISTENS = ("Connection refused", "No such file or directory")


# gRPC's words for a message past a size limit, and the limit.
_MESSAGE_TOO_LARGE = re.compile(
    r"(Sent|Received) message larger than max \(\d+ vs\. (\d+)\)")


def explain_message_limit(error, max_message_bytes):
    """`error` with the limit it met and the way past it added, when it is
    gRPC's RESOURCE_EXHAUSTED for a message too large; otherwise `error`
    itself. `max_message_bytes`: this client's own limit."""
    if error.code != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return error
    match = _MESSAGE_TOO_LARGE.search(error.details)
    if not match:
        return error
    limit = int(match.group(2))
    # Received at this client's own limit: its answer, or the server's
    # refusal at a limit the same as this client's.
    whose = ("this client's max_message_bytes" if match.group(1) == "Sent" else
             "this client's max_message_bytes or the server's "
             "--max_message_bytes" if limit == max_message_bytes else
             "the server's --max_message_bytes")
    return KlserveError(error.code, (
        "%s (%s is %d bytes: stream=True, or a stream_threshold_bytes below "
        "it, sends the tensors in blocks of block_bytes, which must be well "
        "below it too (a projections-form block's answer also carries the "
        "rows of a tile the block before left open); its header carries key "
        "and index_key whole)" % (error.details, whose, limit)),
        error.debug_error_string, error.overloaded)


def explain_unavailable(error, tls, client_certificate):
    """`error` with the likely cause and the option that fixes it added, when
    it is an UNAVAILABLE that gRPC reports as a bare transport failure;
    otherwise `error` itself. `tls`: the client speaks TLS;
    `client_certificate`: it offers a certificate."""
    if error.code != grpc.StatusCode.UNAVAILABLE:
        return error
    if "Failed parsing HTTP/2" in error.details:
        # The answer is not HTTP/2 at all ("HTTP/1.1 400 ..."): a web
        # server answers there, or a TLS proxy that took the plaintext for
        # HTTP/1.
        return KlserveError(
            error.code,
            "%s (something other than a gRPC server answers at this address: "
            "an HTTP/1 server, such as klserve's /metrics port (9464 by "
            "default; its gRPC port is 50051 by default)%s)" %
            (error.details, "" if tls else
             ", or a TLS proxy: then give the client its CA "
             "(Client(tls_ca_file=...))"),
            error.debug_error_string)
    if error.details == "Cancelling all calls":
        # gRPC's word when a server shuts down with the call still on it:
        # klserve does so when its drain (--drain_timeout) runs out.
        return KlserveError(
            error.code,
            "%s (the server stopped while this call was in flight: its drain "
            "after SIGTERM, --drain_timeout, ended first; send the call "
            "again, to the replica that replaces it)" % error.details,
            error.debug_error_string)
    if "Stream removed" in error.details:
        # gRPC's word for a call whose connection closed under it: the call
        # had started, so the address and TLS were right.
        return KlserveError(
            error.code,
            "%s (the connection closed while this call was in flight: the "
            "server was killed or restarted, or the network between cut "
            "it; send the call again)" % error.details,
            error.debug_error_string)
    if not any(words in error.details for words in _TRANSPORT_FAILURES):
        return error
    if any(words in error.details for words in _NOTHING_LISTENS):
        return KlserveError(
            error.code,
            "%s (nothing listens at this address: is the server up, and is "
            "the target right?)" % error.details, error.debug_error_string)
    if not tls:
        hint = ("if the server speaks TLS, give the client the CA that "
                "signed its certificate (Client(tls_ca_file=...))")
    elif not client_certificate:
        hint = ("if the server requires client certificates (mutual TLS), "
                "give the client one with its key (Client(tls_cert_file=..., "
                "tls_key_file=...))")
    else:
        hint = ("check that the server speaks TLS, that its certificate "
                "names the target's host (or set tls_server_name), and that "
                "it trusts the CA of the client certificate")
    return KlserveError(
        error.code,
        "%s (is the server up at this address? %s)" % (error.details, hint),
        error.debug_error_string)


def invalid_argument(details):
    return KlserveError(grpc.StatusCode.INVALID_ARGUMENT, details)
