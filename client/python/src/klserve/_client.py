"""klserve.Client: a blocking Python client of the klserve.v1.IndexerKl
service (and grpc.health.v1.Health), the counterpart of the C++
klserve::Client (client/client.h)."""

import dataclasses
import inspect
import random
import threading
import time
from typing import (Any, Callable, Dict, List, Mapping, Optional, Sequence,
                    Tuple, TypeVar)

import grpc
import numpy as np
import numpy.typing as npt
# The health stubs come from grpcio-health-checking, gRPC's own package of
# them: grpcio-tools ships no health.proto to generate them from (only
# protobuf's well-known types), and a copy of it in this tree would be one
# more file to keep in step with gRPC's.
from grpc_health.v1 import health_pb2, health_pb2_grpc

from klserve._errors import KlserveError, explain_unavailable, invalid_argument
from klserve._signature import (PROJECTIONS_ARGUMENTS, PROJECTIONS_OPTIONS,
                                ComputeLossOptions, loss_signature,
                                projections_parameters, split_arguments)
from klserve._stream import (ProjectionsAssembler, RequestSlicer,
                             ResponseAssembler, needs_counting_pass)
from klserve._tensor_table import (INDEXER_GRADS, PROJECTIONS, QUERY, SCORES,
                                   TENSORS, Form)
from klserve._tensors import from_tensor, grad_wire_name, to_tensor

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


def _enum_option(field: str, value: Any, names: Mapping[str, Any],
                 allowed: str) -> Any:
    """An option given as a name (any case) or as the proto enum value."""
    if not isinstance(value, str):
        return value
    if value.lower() not in names:
        raise invalid_argument("options.%s: must be %s, got %r" %
                               (field, allowed, value))
    return names[value.lower()]


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
    # The projections form: dL/d index_query, index_key, index_weights,
    # shaped like them, in grad_dtype (None when want_grad is False), and
    # the service's own top-k selection, int32 [B, T, K], when topk was
    # given. Read-only views of the answer's bytes, which saves a copy of
    # each; .copy() one to write to it.
    d_index_query: Optional[np.ndarray] = None
    d_index_key: Optional[np.ndarray] = None
    d_index_weights: Optional[np.ndarray] = None
    topk_indices: Optional[np.ndarray] = None


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    """GetServerInfo's answer: what the server runs and its limits."""
    version: str
    backend: str
    device: str
    threads: int
    max_message_bytes: int
    max_tensor_bytes: int
    max_concurrent_requests: int
    input_dtypes: Tuple[str, ...]
    grad_dtypes: Tuple[str, ...]
    # Streams open at once, and what one stream of the projections form may
    # hold for its key side (--max_stream_key_bytes).
    max_open_streams: int
    max_stream_key_bytes: int


@dataclasses.dataclass(frozen=True)
class StepResult:
    """A published step (FinishStep)."""
    indexer_loss: float
    indexer_loss_unscaled: float
    requests: int


class _Attempt:
    """What one attempt tells the retry loop."""

    def __init__(self) -> None:
        self.may_retry = True  # cleared once a stream delivered a message


_T = TypeVar("_T")


def _read_file(field: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError("%s: cannot read %r: %s" % (field, path, e)) from e
    if not data.strip():
        raise ValueError("%s: %r is empty" % (field, path))
    return data


def _channel_credentials(ca_file: Optional[str], cert_file: Optional[str],
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
        root_certificates=_read_file("tls_ca_file", ca_file),
        private_key=_read_file("tls_key_file", key_file) if key_file else None,
        certificate_chain=(_read_file("tls_cert_file", cert_file)
                           if cert_file else None))


def _token_metadata(token: Optional[str]) -> Tuple[Tuple[str, str], ...]:
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

    def __init__(self, target: str = "localhost:50051", *,
                 deadline: float = 120.0, max_message_bytes: int = 1 << 30,
                 max_attempts: int = 5, initial_backoff: float = 0.05,
                 max_backoff: float = 2.0,
                 stream_threshold_bytes: int = 64 << 20,
                 block_bytes: int = 4 << 20,
                 channel_options: Sequence[Tuple[str, Any]] = (),
                 tls_ca_file: Optional[str] = None,
                 tls_cert_file: Optional[str] = None,
                 tls_key_file: Optional[str] = None,
                 tls_server_name: Optional[str] = None,
                 auth_token: Optional[str] = None) -> None:
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
        options: List[Tuple[str, Any]] = [
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
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._random = random.Random()
        self._random_lock = threading.Lock()

    # -- lifetime ----------------------------------------------------------

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- retries -----------------------------------------------------------

    def _with_retries(self, attempt_fn: Callable[[float, _Attempt], _T]
                      ) -> _T:
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

    def health(self, service: str = "") -> bool:
        """grpc.health.v1.Health/Check: True when SERVING."""
        request = health_pb2.HealthCheckRequest(service=service)
        response = self._with_retries(
            lambda timeout, _: self._health.Check(
                request, timeout=timeout, metadata=self._metadata))
        return response.status == health_pb2.HealthCheckResponse.SERVING

    def server_info(self) -> ServerInfo:
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
            grad_dtypes=tuple(r.grad_dtypes),
            max_open_streams=r.max_open_streams,
            max_stream_key_bytes=r.max_stream_key_bytes)

    def finish_step(self, run: str, step: int) -> StepResult:
        """Publishes the run's step now; KlserveError NOT_FOUND when the
        server has no open step `step` for `run`."""
        request = pb2.FinishStepRequest(run=run, step=int(step))
        r = self._with_retries(lambda timeout, _: self._stub.FinishStep(
            request, timeout=timeout, metadata=self._metadata))
        return StepResult(indexer_loss=r.indexer_loss,
                          indexer_loss_unscaled=r.indexer_loss_unscaled,
                          requests=r.requests)

    # -- the loss ----------------------------------------------------------

    def compute_loss(self, indexer_scores: Optional[npt.ArrayLike] = None,
                     **arguments: Any) -> LossResult:
        """The indexer KL loss of one problem (docs/spec.md).

        Keyword arguments: the request's other tensors, named as in
        ComputeLossRequest (klserve/_tensor_table.py), and the fields of
        klserve.ComputeLossOptions, which says what each option does;
        inspect.signature(Client.compute_loss) lists them all.

        Arrays are NumPy arrays (or anything np.asarray takes): the float
        inputs float32, float16 or bfloat16 (ml_dtypes.bfloat16; float64 is
        narrowed to float32), topk_indices, segment ids and key bounds
        integers (sent as int32), masks bool. The logits form: the scores
        and exactly one of attention_logits [B, H, T, S|K] and
        attention_weights [B, T, S|K] as the target; topk_indices
        [B, T, K] selects the sparse stage (num_keys = S is then required).
        The projections form (see compute_loss_from_projections): no
        scores, and query, key, index_query, index_key and index_weights
        instead of a target. Returns a LossResult; raises KlserveError.
        """
        arrays, option_arguments = split_arguments("compute_loss", arguments)
        call = ComputeLossOptions(**option_arguments)
        if indexer_scores is not None:
            arrays[SCORES] = indexer_scores
        _check_form(arrays, call)
        tensors = {t.name: t.convert(t.name, arrays[t.name])
                   for t in TENSORS if t.name in arrays}
        options = self._options(call)
        tags = self._tags(call)
        total_bytes = sum(arr.nbytes for _, arr in tensors.values())
        stream = call.stream
        if stream is None:
            stream = total_bytes > self.stream_threshold_bytes
        if stream:
            return self._compute_streaming(tensors, options, tags,
                                           call.request_id)
        return self._compute_unary(tensors, options, tags, call.request_id)

    def compute_loss_from_projections(
            self, query: npt.ArrayLike, key: npt.ArrayLike,
            index_query: npt.ArrayLike, index_key: npt.ArrayLike,
            index_weights: npt.ArrayLike, **arguments: Any) -> LossResult:
        """The indexer KL loss from the projections the job holds
        (docs/spec.md, "The projections form"): the service recomputes the
        main attention's logits and the indexer scores tile by tile and
        returns the gradients of index_query, index_key and index_weights
        (LossResult.d_index_query, d_index_key, d_index_weights).

        query [B, T, H, D] and key [B, S, H_kv, D] (H_kv divides H: MHA,
        MQA or GQA), index_query [B, T, H_I, D_I], index_key [B, S, D_I],
        index_weights [B, T, H_I]: float32, float16 or bfloat16. Keywords:
        lse (float32 [B, H, T], each head's log-sum-exp over the row's valid
        keys, used as given), topk_indices (the client's sparse selection)
        or the option topk = K (the service's, returned as
        LossResult.topk_indices), every mask including the key bounds
        key_start/key_end, and the fields of klserve.ComputeLossOptions
        (index_weight_scale, use_relu and the rest). With causal and
        T != S, MaxText and Megatron clients send q_offset = 0 (their
        causal mask aligns the first query with the first key).

        As in the logits form, a request past stream_threshold_bytes (or
        with stream=True) goes through ComputeLossStream: the key side whole
        in its header, the query side in row blocks, with the same answer
        bit for bit.
        """
        arguments.update(zip(PROJECTIONS, (query, key, index_query,
                                           index_key, index_weights)))
        return self.compute_loss(**arguments)

    @staticmethod
    def _options(call: ComputeLossOptions) -> Any:
        """The proto's LossOptions of a call."""
        flavor = _enum_option("flavor", call.flavor, _FLAVORS,
                              "'exact' or 'maxtext'")
        reduction = _enum_option("reduction", call.reduction, _REDUCTIONS,
                                 "'mean', 'mean_valid' or 'sum'")
        options = pb2.LossOptions(
            causal=bool(call.causal), num_keys=int(call.num_keys or 0),
            topk=int(call.topk or 0),
            flavor=int(flavor), reduction=int(reduction),
            grad_dtype=grad_wire_name(call.grad_dtype),
            skip_grad=not call.want_grad,
            want_row_kl=bool(call.want_row_kl),
            want_diagnostics=bool(call.want_diagnostics),
            recall_k=int(call.recall_k or 0))
        # Optional in the proto: unset means the spec's default.
        for name, kind in (("q_offset", int), ("softmax_scale", float),
                           ("scaling_factor", float), ("grad_scale", float),
                           ("index_weight_scale", float), ("use_relu", bool)):
            value = getattr(call, name)
            if value is not None:
                setattr(options, name, kind(value))
        return options

    @staticmethod
    def _tags(call: ComputeLossOptions) -> Optional[Any]:
        """The proto's Tags of a call; None when it has none."""
        numbers = {name: int(getattr(call, name))
                   for name in ("step", "layer", "microbatch")
                   if getattr(call, name) is not None}
        if call.run is None and not numbers:
            return None
        return pb2.Tags(run=call.run or "", **numbers)

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
        result = _result(response, grad, row_kl, streamed=False)
        for field in INDEXER_GRADS + ("topk_indices",):
            if response.HasField(field) and getattr(response, field).dtype:
                setattr(result, field, from_tensor(getattr(response, field),
                                                   field, writable=False))
        return result

    def _compute_streaming(self, tensors, options, tags, request_id):
        slicer = RequestSlicer(tensors)
        block_rows = slicer.block_rows_for(self.block_bytes)
        header = slicer.make_header(pb2, request_id, tags, options)
        counting_pass = needs_counting_pass(pb2, options, tensors)

        def requests():
            yield pb2.ComputeLossStreamRequest(header=header)
            for block in slicer.blocks(pb2, block_rows, counting_pass):
                yield pb2.ComputeLossStreamRequest(block=block)

        projections = QUERY in tensors

        def attempt(timeout, state):
            assembler = (
                ProjectionsAssembler(slicer.batch, slicer.rows_per_batch)
                if projections else
                ResponseAssembler(tensors[SCORES][1].shape, counting_pass))
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
            if not projections:
                grad, row_kl = assembler.finish()
                return _result(result, grad, row_kl, streamed=True)
            outputs = assembler.finish()
            loss = _result(result, None, outputs.pop("row_kl", None),
                           streamed=True)
            for field, arr in outputs.items():
                arr.flags.writeable = False  # as the unary call returns them
                setattr(loss, field, arr)
            if result.HasField("d_index_key") and result.d_index_key.dtype:
                loss.d_index_key = from_tensor(result.d_index_key,
                                               "d_index_key", writable=False)
            return loss

        return self._with_retries(attempt)


_LOGITS_ONLY = tuple(t.name for t in TENSORS if t.forms == Form.LOGITS)
_PROJECTIONS_ONLY = tuple(t.name for t in TENSORS
                          if t.forms == Form.PROJECTIONS)


def _check_form(arrays: Dict[str, Any], call: ComputeLossOptions) -> bool:
    """Whether the call is in the projections form; INVALID_ARGUMENT naming
    the field for a call that mixes the forms or lacks a tensor of its
    form. The client must know the form to choose unary or streamed, so it
    tells these apart here rather than leaving them to the server."""
    logits = [name for name in _LOGITS_ONLY if name in arrays]
    projections = [name for name in _PROJECTIONS_ONLY if name in arrays]
    if logits and projections:
        raise invalid_argument(
            "%s: the logits form's tensor, not allowed with the projections "
            "form's %s, got both" % (logits[0], projections[0]))
    if not projections:
        if SCORES not in arrays:
            raise invalid_argument(SCORES + ": must be given")
        for name in sorted(PROJECTIONS_OPTIONS):
            if getattr(call, name) is not None:
                raise invalid_argument(
                    "options.%s: the projections form only, got %r with "
                    "%s" % (name, getattr(call, name), SCORES))
        return False
    for name in PROJECTIONS:
        if name not in arrays:
            raise invalid_argument(
                "%s: must be given in the projections form (with %s), got "
                "none" % (name, projections[0]))
    return True


def _result(response: Any, grad: Optional[np.ndarray],
            row_kl: Optional[np.ndarray], streamed: bool) -> LossResult:
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


_SELF = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
Client.compute_loss.__signature__ = loss_signature(  # type: ignore
    [_SELF,
     inspect.Parameter(SCORES, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                       default=None, annotation=Optional[npt.ArrayLike])],
    returns=LossResult)
Client.compute_loss_from_projections.__signature__ = (  # type: ignore
    loss_signature([_SELF, *projections_parameters(npt.ArrayLike)],
                   returns=LossResult, array_names=PROJECTIONS_ARGUMENTS))

_default_client: Optional[Client] = None
_default_lock = threading.Lock()


def default_client() -> Client:
    """The Client that klserve.jax and klserve.torch use when given none:
    target $KLSERVE_TARGET, else localhost:50051; made on first use."""
    global _default_client
    with _default_lock:
        if _default_client is None:
            import os
            _default_client = Client(
                os.environ.get("KLSERVE_TARGET", "localhost:50051"))
        return _default_client


def set_default_client(client: Client) -> None:
    """Makes `client` the default client."""
    global _default_client
    with _default_lock:
        _default_client = client


__all__ = ["Client", "LossResult", "ServerInfo", "StepResult",
           "default_client", "set_default_client"]
