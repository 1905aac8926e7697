"""The exception every failed klserve call raises."""

import grpc


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

    def __init__(self, code, details, debug_error_string=None):
        super().__init__(code, details)
        self.code = code
        self.details = details
        self.debug_error_string = debug_error_string

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
        return cls(code, details or "", debug)


def invalid_argument(details):
    return KlserveError(grpc.StatusCode.INVALID_ARGUMENT, details)
