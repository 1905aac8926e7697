"""klserve.Client: a blocking Python client of the klserve.v1.IndexerKl
service (and grpc.health.v1.Health), the counterpart of the C++
klserve::Client (client/client.h)."""

import dataclasses
import random
import threading
import time
from typing import Dict, Optional

import grpc
import numpy as np

from klserve._errors import KlserveError, explain_unavailable, invalid_argument
from klserve._stream import RequestSlicer, ResponseAssembler
from klserve._tensors import (bool_input, float_input, from_tensor,
                              grad_wire_name, int32_input, to_tensor)

try:
    from klserve.v1 import klserve_pb2 as pb2
    from klserve.v1 import klserve_pb2_grpc as pb2_grpc
except ImportError as e:  # pragma: no cover - a source tree without stubs
    raise ImportError(
        "klserve: the generated stubs (klserve.v1.klserve_pb2) are missing; "
        "install the package (pip install client/python) rather than "
        "importing it from the source tree: " + str(e)) from e

_FLAVORS = {"exact": pb2.FLAVOR_EXACT, "maxtext": pb2.FLAVOR_MAXTEXT}
_REDUCTIONS = {"mean": pb2.REDUCTION_MEAN,
               "mean_valid": pb2.REDUCTION_MEAN_VALID,
               "sum": pb2.REDUCTION_SUM}

# Field -> converter of the request's tensors.
_FLOAT_FIELDS = ("attention_logits", "attention_weights", "indexer_scores")
_INT_FIELDS = ("topk_indices", "segment_ids_q", "segment_ids_kv")
_BOOL_FIELDS = ("attention_mask", "key_padding_mask", "row_valid")


def _enum_option(field, value, names, allowed):
    """An option given as a name (any case) or as the proto enum value."""
    if not isinstance(value, str):
        return value
    if value.lower() not in names:
        raise invalid_argument("options.%s: must be %s, got %r" %
                               (field, allowed, value))
    return names[value.lower()]


_HEALTH_CHECK = "/grpc.health.v1.Health/Check"
_HEALTH_SERVING = 1


@dataclasses.dataclass
class LossResult:
    """The answer to one compute_loss call."""
    loss: float            # c * sum_t KL_t / N (0 when N = 0)
    unscaled_loss: float   # sum_t KL_t / N
    denominator: int       # N
    rows_counted: int
    rows_fully_masked: int
    rows_zero_target: int
    # mean_entropy_p, mean_entropy_q (nats) and, with recall_k,
    # topk_recall; None unless want_diagnostics.
    diagnostics: Optional[Dict[str, float]]
    # dL/d indexer_scores, shaped like them, in grad_dtype; None when
    # want_grad is False.
    grad: Optional[np.ndarray]
    # Each row's unscaled KL, float64 [B, T]; None unless want_row_kl.
    row_kl: Optional[np.ndarray]
    request_id: str = ""
    streamed: bool = False  # whether it went through ComputeLossStream


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    version: str
    backend: str
    device: str
    threads: int
    max_message_bytes: int
    max_tensor_bytes: int
    max_concurrent_requests: int
    input_dtypes: tuple
    grad_dtypes: tuple


@dataclasses.dataclass(frozen=True)
class StepResult:
    """A published step (FinishStep)."""
    indexer_loss: float
    indexer_loss_unscaled: float
    requests: int


def _encode_health_request(service):
    # grpc.health.v1.HealthCheckRequest { string service = 1; }
    data = service.encode("utf-8")
    if not data:
        return b""
    out = bytearray(b"\x0a")
    n = len(data)
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            break
    return bytes(out) + data


def _decode_health_response(data):
    # grpc.health.v1.HealthCheckResponse { ServingStatus status = 1; }
    status, i = 0, 0
    while i < len(data):
        key, i = _varint(data, i)
        field, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, i = _varint(data, i)
            if field == 1:
                status = value
        elif wire_type == 2:
            length, i = _varint(data, i)
            i += length
        elif wire_type == 1:
            i += 8
        elif wire_type == 5:
            i += 4
        else:
            raise ValueError("bad HealthCheckResponse")
    return status


def _varint(data, i):
    value, shift = 0, 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


class _Attempt:
    """What one attempt tells the retry loop."""

    def __init__(self):
        self.may_retry = True  # cleared once a stream delivered a message


def _read_file(field, path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError("%s: cannot read %r: %s" % (field, path, e)) from e
    if not data.strip():
        raise ValueError("%s: %r is empty" % (field, path))
    return data


def _channel_credentials(ca_file, cert_file, key_file, server_name):
    """TLS credentials, or None for plaintext."""
    if not ca_file:
        if cert_file or key_file or server_name:
            raise ValueError("tls_cert_file, tls_key_file, tls_server_name: "
                             "need tls_ca_file")
        return None
    if bool(cert_file) != bool(key_file):
        raise ValueError("tls_cert_file, tls_key_file: set both or neither")
    return grpc.ssl_channel_credentials(
        root_certificates=_read_file("tls_ca_file", ca_file),
        private_key=_read_file("tls_key_file", key_file) if key_file else None,
        certificate_chain=(_read_file("tls_cert_file", cert_file)
                           if cert_file else None))


def _token_metadata(token):
    """The call metadata carrying the bearer token (none without one)."""
    if token is None:
        return ()
    # The server's rule for its token file (it goes in a gRPC header).
    if not token or not all(0x20 <= ord(ch) <= 0x7E for ch in token):
        raise ValueError("auth_token: must be non-empty printable ASCII")
    return (("authorization", "Bearer " + token),)


class Client:
    """A blocking client of klserve.

    Every call runs under `deadline` seconds, counted from its start and
    covering its retries. UNAVAILABLE is retried up to `max_attempts` times
    with exponential backoff (from `initial_backoff` seconds, doubling up to
    `max_backoff`, each wait jittered to between half and all of it); every
    other error raises KlserveError at once with the server's code and
    message. compute_loss sends a request whose tensors exceed
    `stream_threshold_bytes` through ComputeLossStream in blocks of about
    `block_bytes` of rows, the rest as one message. Thread-safe: calls share
    one channel.

    TLS (docs/security.md): `tls_ca_file` (PEM roots) turns it on;
    `tls_cert_file` and `tls_key_file` add a client certificate for mutual
    TLS; `tls_server_name` is the name the server's certificate must carry
    when the target's host is not it. `auth_token` is sent as
    `authorization: Bearer <token>` on every call.
    """

    def __init__(self, target="localhost:50051", *, deadline=120.0,
                 max_message_bytes=1 << 30, max_attempts=5,
                 initial_backoff=0.05, max_backoff=2.0,
                 stream_threshold_bytes=64 << 20, block_bytes=4 << 20,
                 channel_options=(), tls_ca_file=None, tls_cert_file=None,
                 tls_key_file=None, tls_server_name=None, auth_token=None):
        if not target:
            raise ValueError("target: must not be empty")
        if not (deadline > 0 and np.isfinite(deadline)):
            raise ValueError("deadline: must be finite and > 0, got %r" %
                             (deadline,))
        if not 1 <= max_message_bytes <= (1 << 31) - 1:
            raise ValueError("max_message_bytes: must be in [1, 2^31 - 1], "
                             "got %r" % (max_message_bytes,))
        if max_attempts < 1:
            raise ValueError("max_attempts: must be >= 1")
        if not 0 < initial_backoff <= max_backoff:
            raise ValueError("initial_backoff, max_backoff: need 0 < "
                             "initial_backoff <= max_backoff")
        if stream_threshold_bytes < 0:
            raise ValueError("stream_threshold_bytes: must be >= 0")
        if block_bytes < 1:
            raise ValueError("block_bytes: must be >= 1")
        self.target = target
        self.deadline = float(deadline)
        self.max_message_bytes = int(max_message_bytes)
        self.max_attempts = int(max_attempts)
        self.initial_backoff = float(initial_backoff)
        self.max_backoff = float(max_backoff)
        self.stream_threshold_bytes = int(stream_threshold_bytes)
        self.block_bytes = int(block_bytes)
        options = [
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
            # gRPC's own reconnect backoff (1 s at first, then growing) would
            # keep failing the retries fast after the server comes up.
            ("grpc.initial_reconnect_backoff_ms",
             max(1, int(self.initial_backoff * 1000))),
            ("grpc.max_reconnect_backoff_ms",
             max(1, int(self.max_backoff * 1000))),
        ]
        credentials = _channel_credentials(tls_ca_file, tls_cert_file,
                                           tls_key_file, tls_server_name)
        self._tls = tls_ca_file is not None
        self._client_certificate = tls_cert_file is not None
        if tls_server_name:
            options.append(("grpc.ssl_target_name_override", tls_server_name))
        options.extend(channel_options)
        self._metadata = _token_metadata(auth_token)
        if credentials is None:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            self._channel = grpc.secure_channel(target, credentials,
                                                options=options)
        self._stub = pb2_grpc.IndexerKlStub(self._channel)
        self._health = self._channel.unary_unary(
            _HEALTH_CHECK, request_serializer=_encode_health_request,
            response_deserializer=_decode_health_response)
        self._random = random.Random()
        self._random_lock = threading.Lock()

    # -- lifetime ----------------------------------------------------------

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # -- retries -----------------------------------------------------------

    def _with_retries(self, attempt_fn):
        """Runs attempt_fn(timeout_s, attempt) until it returns, raises
        anything but a retriable UNAVAILABLE, or attempts or time run out."""
        deadline = time.monotonic() + self.deadline
        backoff = self.initial_backoff
        tries = 0
        while True:
            tries += 1
            attempt = _Attempt()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KlserveError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                   "Deadline Exceeded")
            try:
                return attempt_fn(remaining, attempt)
            except KlserveError:
                raise
            except grpc.RpcError as e:
                error = KlserveError.from_rpc_error(e)
            if error.code != grpc.StatusCode.UNAVAILABLE:
                raise error
            last = explain_unavailable(error, self._tls,
                                       self._client_certificate)
            if not attempt.may_retry or tries >= self.max_attempts:
                raise last
            with self._random_lock:
                wait = backoff * self._random.uniform(0.5, 1.0)
            if time.monotonic() + wait >= deadline:
                raise last
            time.sleep(wait)
            backoff = min(backoff * 2, self.max_backoff)

    # -- simple calls ------------------------------------------------------

    def health(self, service=""):
        """grpc.health.v1.Health/Check: True when SERVING."""
        status = self._with_retries(
            lambda timeout, _: self._health(service, timeout=timeout,
                                            metadata=self._metadata))
        return status == _HEALTH_SERVING

    def server_info(self):
        """GetServerInfo: version, backend, device and limits."""
        r = self._with_retries(lambda timeout, _: self._stub.GetServerInfo(
            pb2.GetServerInfoRequest(), timeout=timeout,
            metadata=self._metadata))
        return ServerInfo(
            version=r.version, backend=r.backend, device=r.device,
            threads=r.threads, max_message_bytes=r.max_message_bytes,
            max_tensor_bytes=r.max_tensor_bytes,
            max_concurrent_requests=r.max_concurrent_requests,
            input_dtypes=tuple(r.input_dtypes),
            grad_dtypes=tuple(r.grad_dtypes))

    def finish_step(self, run, step):
        """Publishes the run's step now; KlserveError NOT_FOUND when the
        server has no open step `step` for `run`."""
        request = pb2.FinishStepRequest(run=run, step=int(step))
        r = self._with_retries(lambda timeout, _: self._stub.FinishStep(
            request, timeout=timeout, metadata=self._metadata))
        return StepResult(indexer_loss=r.indexer_loss,
                          indexer_loss_unscaled=r.indexer_loss_unscaled,
                          requests=r.requests)

    # -- the loss ----------------------------------------------------------

    def compute_loss(self, indexer_scores, *, attention_logits=None,
                     attention_weights=None, topk_indices=None,
                     segment_ids_q=None, segment_ids_kv=None,
                     attention_mask=None, key_padding_mask=None,
                     row_valid=None, causal=False, q_offset=None,
                     num_keys=None, softmax_scale=None, flavor="exact",
                     reduction="mean", scaling_factor=None, grad_dtype="fp32",
                     want_grad=True, want_row_kl=False,
                     want_diagnostics=False, recall_k=0, run=None, step=None,
                     layer=None, microbatch=None, request_id="",
                     stream=None):
        """The indexer KL loss of one problem (docs/spec.md).

        Arrays are NumPy arrays (or anything np.asarray takes): the float
        inputs float32, float16 or bfloat16 (ml_dtypes.bfloat16; float64 is
        narrowed to float32), topk_indices and segment ids integers (sent as
        int32), masks bool. Exactly one of attention_logits [B, H, T, S|K]
        and attention_weights [B, T, S|K] is the target; topk_indices
        [B, T, K] selects the sparse stage (num_keys = S is then required).
        stream=None streams when the tensors' bytes exceed
        stream_threshold_bytes; True or False forces it. Returns a
        LossResult; raises KlserveError.
        """
        tensors = {}
        given = dict(indexer_scores=indexer_scores,
                     attention_logits=attention_logits,
                     attention_weights=attention_weights,
                     topk_indices=topk_indices, segment_ids_q=segment_ids_q,
                     segment_ids_kv=segment_ids_kv,
                     attention_mask=attention_mask,
                     key_padding_mask=key_padding_mask, row_valid=row_valid)
        if indexer_scores is None:
            raise invalid_argument("indexer_scores: must be given")
        for field, value in given.items():
            if value is None:
                continue
            if field in _FLOAT_FIELDS:
                tensors[field] = float_input(field, value)
            elif field in _INT_FIELDS:
                tensors[field] = int32_input(field, value)
            else:
                tensors[field] = bool_input(field, value)

        options = self._options(
            causal=causal, q_offset=q_offset, num_keys=num_keys,
            softmax_scale=softmax_scale, flavor=flavor, reduction=reduction,
            scaling_factor=scaling_factor, grad_dtype=grad_dtype,
            want_grad=want_grad, want_row_kl=want_row_kl,
            want_diagnostics=want_diagnostics, recall_k=recall_k)
        tags = None
        if any(v is not None for v in (run, step, layer, microbatch)):
            tags = pb2.Tags(run=run or "")
            if step is not None:
                tags.step = int(step)
            if layer is not None:
                tags.layer = int(layer)
            if microbatch is not None:
                tags.microbatch = int(microbatch)

        total_bytes = sum(arr.nbytes for _, arr in tensors.values())
        if stream is None:
            stream = total_bytes > self.stream_threshold_bytes
        if stream:
            return self._compute_streaming(tensors, options, tags,
                                           request_id)
        return self._compute_unary(tensors, options, tags, request_id)

    @staticmethod
    def _options(*, causal, q_offset, num_keys, softmax_scale, flavor,
                 reduction, scaling_factor, grad_dtype, want_grad,
                 want_row_kl, want_diagnostics, recall_k):
        flavor = _enum_option("flavor", flavor, _FLAVORS,
                              "'exact' or 'maxtext'")
        reduction = _enum_option("reduction", reduction, _REDUCTIONS,
                                 "'mean', 'mean_valid' or 'sum'")
        options = pb2.LossOptions(
            causal=bool(causal), num_keys=int(num_keys or 0),
            flavor=int(flavor), reduction=int(reduction),
            grad_dtype=grad_wire_name(grad_dtype), skip_grad=not want_grad,
            want_row_kl=bool(want_row_kl),
            want_diagnostics=bool(want_diagnostics),
            recall_k=int(recall_k or 0))
        if q_offset is not None:
            options.q_offset = int(q_offset)
        if softmax_scale is not None:
            options.softmax_scale = float(softmax_scale)
        if scaling_factor is not None:
            options.scaling_factor = float(scaling_factor)
        return options

    def _compute_unary(self, tensors, options, tags, request_id):
        request = pb2.ComputeLossRequest(request_id=request_id,
                                         options=options)
        if tags is not None:
            request.tags.CopyFrom(tags)
        for field, (name, arr) in tensors.items():
            getattr(request, field).CopyFrom(to_tensor(pb2, name, arr))
        response = self._with_retries(
            lambda timeout, _: self._stub.ComputeLoss(
                request, timeout=timeout, metadata=self._metadata))
        grad = (from_tensor(response.grad, "grad")
                if response.HasField("grad") and response.grad.dtype else None)
        row_kl = (from_tensor(response.row_kl, "row_kl")
                  if response.HasField("row_kl") and response.row_kl.dtype
                  else None)
        return _result(response, grad, row_kl, streamed=False)

    def _compute_streaming(self, tensors, options, tags, request_id):
        slicer = RequestSlicer(tensors)
        block_rows = slicer.block_rows_for(self.block_bytes)
        header = slicer.make_header(pb2, request_id, tags, options)

        def requests():
            yield pb2.ComputeLossStreamRequest(header=header)
            for block in slicer.blocks(pb2, block_rows):
                yield pb2.ComputeLossStreamRequest(block=block)

        def attempt(timeout, state):
            assembler = ResponseAssembler(
                tensors["indexer_scores"][1].shape)
            result = None
            # grpc consumes the request iterator on its own thread, so
            # blocks go out while this thread reads the gradients.
            call = self._stub.ComputeLossStream(
                requests(), timeout=timeout, metadata=self._metadata)
            try:
                for message in call:
                    state.may_retry = False
                    kind = message.WhichOneof("kind")
                    if result is not None:
                        raise KlserveError(
                            grpc.StatusCode.INTERNAL,
                            "ComputeLossStream: server broke the protocol: "
                            "message after the result")
                    if kind == "grad_block":
                        assembler.add(message.grad_block)
                    elif kind == "result":
                        result = message.result
                    else:
                        raise KlserveError(
                            grpc.StatusCode.INTERNAL,
                            "ComputeLossStream: server broke the protocol: "
                            "empty response message")
            except KlserveError:
                call.cancel()
                raise
            if result is None:
                raise KlserveError(
                    grpc.StatusCode.INTERNAL,
                    "ComputeLossStream: server broke the protocol: no result "
                    "before the end")
            grad, row_kl = assembler.finish()
            return _result(result, grad, row_kl, streamed=True)

        return self._with_retries(attempt)


def _result(response, grad, row_kl, streamed):
    r = response.result
    diagnostics = None
    if r.HasField("diagnostics"):
        d = r.diagnostics
        diagnostics = {"mean_entropy_p": d.mean_entropy_p,
                       "mean_entropy_q": d.mean_entropy_q}
        if d.HasField("topk_recall"):
            diagnostics["topk_recall"] = d.topk_recall
    return LossResult(
        loss=r.loss, unscaled_loss=r.unscaled_loss,
        denominator=r.denominator, rows_counted=r.rows_counted,
        rows_fully_masked=r.rows_fully_masked,
        rows_zero_target=r.rows_zero_target, diagnostics=diagnostics,
        grad=grad, row_kl=row_kl, request_id=response.request_id,
        streamed=streamed)


_default_client = None
_default_lock = threading.Lock()


def default_client():
    """The Client that klserve.jax and klserve.torch use when given none:
    target $KLSERVE_TARGET, else localhost:50051; made on first use."""
    global _default_client
    with _default_lock:
        if _default_client is None:
            import os
            _default_client = Client(
                os.environ.get("KLSERVE_TARGET", "localhost:50051"))
        return _default_client


def set_default_client(client):
    """Makes `client` the default client."""
    global _default_client
    with _default_lock:
        _default_client = client


__all__ = ["Client", "LossResult", "ServerInfo", "StepResult",
           "default_client", "set_default_client"]
