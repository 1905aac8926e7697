"""klserve.Client: a blocking Python client of the klserve.v1.IndexerKl
service (and grpc.health.v1.Health), the counterpart of the C++
klserve::Client (client/client.h)."""

import dataclasses
import inspect
import logging
import math
import numbers
import os
import random
import threading
import time
import weakref
from typing import (Any, Callable, Dict, List, Mapping, Optional, Sequence,
                    Set, Tuple, TypeVar)

import grpc
import numpy as np
import numpy.typing as npt
# The health stubs come from grpcio-health-checking, gRPC's own package of
# them: grpcio-tools ships no health.proto to generate them from (only
# protobuf's well-known types), and a copy of it in this tree would be one
# more file to keep in step with gRPC's.
from grpc_health.v1 import health_pb2, health_pb2_grpc

from klserve._credentials import channel_credentials, token_metadata
from klserve._errors import (KlserveError, explain_message_limit,
                             explain_unavailable, invalid_argument)
from klserve._results import (LossResult, RegionList, RegionStatus,
                              ServerInfo, StepResult, loss_result)
from klserve._shm_layouts import (Layout, LayoutPool, answer_row_bytes,
                                 output_specs, plan)
from klserve._signature import (PROJECTIONS_ARGUMENTS, PROJECTIONS_OPTIONS,
                                ComputeLossOptions, loss_signature,
                                projections_parameters, split_arguments)
from klserve._stream import (ProjectionsAssembler, RequestSlicer,
                             ResponseAssembler, needs_counting_pass,
                             stream_carries)
from klserve._targets import bad_port, is_local_target, with_default_port
from klserve._tensor_table import (INDEXER_GRADS, PROJECTIONS, QUERY, SCORES,
                                   TENSORS, Form)
from klserve._tensors import (WIRE_DTYPES, from_tensor, grad_wire_name,
                              to_tensor)
from klserve.shared_memory import SharedMemoryRegion

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


_KIND_NAMES = {int: "an integer", float: "a number",
               bool: "a bool (True or False)"}

# What gRPC says when the client's own deadline passes: this alone, or
# within another message ("Stream removed (Deadline Exceeded)") when the
# transport ends the call first. The server's own DEADLINE_EXCEEDED names
# its flag instead.
_LOCAL_DEADLINE = "Deadline Exceeded"


def _number(field: str, kind: type, value: Any, bits: int = 64) -> Any:
    """`value` as `kind` (int, float or bool) when it is one, or
    INVALID_ARGUMENT naming the argument. Nothing is coerced that would
    change its meaning: bool("False") is True and int(0.9) is 0, so a
    string (from a config file, say), a fraction for an integer, a masked
    value, or a number other than 0 and 1 for a bool is refused. A
    one-element array or tensor (a NumPy scalar, a step counter kept in a
    tensor, on any device) counts as its value; any real number (NumPy's,
    Fraction) as a number, and an integral one (3.0) as an integer, which
    must fit a signed integer of `bits` bits (the proto field's)."""
    if isinstance(value, np.ma.MaskedArray):
        raise invalid_argument("%s: must be %s, got a masked value" % (
            field, _KIND_NAMES[kind]))
    if not isinstance(value, (bool, int, float, str)) and hasattr(
            value, "item"):
        try:
            value = value.item()
        except Exception:  # pylint: disable=broad-except
            pass  # not one element (or a JAX tracer): refused below
    try:
        if kind is bool:
            if isinstance(value, (bool, np.bool_)):
                return bool(value)
            if isinstance(value, numbers.Integral) and value in (0, 1):
                return bool(value)
        elif not isinstance(value, (bool, np.bool_)):
            integer = None
            if isinstance(value, numbers.Integral):
                integer = int(value)
            elif isinstance(value, numbers.Real):
                number = float(value)
                if kind is float:
                    return number
                if number.is_integer():
                    integer = int(number)
            if integer is not None and kind is float:
                return float(integer)
            if integer is not None and -2**(bits - 1) <= integer < 2**(bits -
                                                                     1):
                return integer
            if integer is not None:
                raise invalid_argument(
                    "%s: must be an integer of %d bits, got %.60r" %
                    (field, bits, value))
    except (OverflowError, ValueError):
        pass
    raise invalid_argument("%s: must be %s, got %.60r" % (
        field, _KIND_NAMES[kind], value))


def _unset_is(value: Any, default: Any) -> Any:
    """An option passed as None: its default, as if it had not been."""
    return default if value is None else value


class _Attempt:
    """What one attempt tells the retry loop."""

    def __init__(self) -> None:
        self.may_retry = True  # cleared once a stream delivered a message


_T = TypeVar("_T")


def _unregister_quietly(stub, metadata, name: str, timeout: float) -> None:
    """UnregisterRegion, best effort: a server that is gone (or a call
    still using the region) leaves it to the lease."""
    try:
        stub.UnregisterRegion(pb2.UnregisterRegionRequest(name=name),
                              timeout=timeout, metadata=metadata)
    except grpc.RpcError:
        pass


def _release(owner_pid: int, channel, stub, metadata, registered: Set[str],
             lock: threading.Lock) -> None:
    """A client's end (close(), garbage collection or the interpreter's
    exit): unregisters what it still has registered, within 2 s in all,
    and closes its channel; in the process that made the client only (a
    forked child's copy would end its parent's registrations)."""
    if os.getpid() != owner_pid:
        return
    with lock:
        names = sorted(registered)
        registered.clear()
    end = time.monotonic() + 2.0
    for name in names:
        left = end - time.monotonic()
        if left <= 0:
            break
        _unregister_quietly(stub, metadata, name, left)
    channel.close()


@dataclasses.dataclass(frozen=True)
class _CallDeadline:
    """One loss call's own deadline (deadline=): its end on the monotonic
    clock, shared by every RPC the call makes (retries, a region's second
    try, the fallback inline), and its length, for the error."""
    end: float
    seconds: float


class Client:
    """A blocking client of klserve.

    Every call runs under `deadline` seconds, counted from its start and
    covering its retries. UNAVAILABLE, and RESOURCE_EXHAUSTED at the
    server's limit of calls in flight (the call did not run; `.overloaded`
    on the error), are retried up to `max_attempts` times with exponential
    backoff (from `initial_backoff` seconds, doubling up to `max_backoff`,
    each wait jittered to between half and all of it: the defaults wait
    about 5 to 9 s in all, so that a step rides out a server that restarts
    or a burst of calls from many ranks, and a dead server is reported
    after that); every other error raises KlserveError at once with the
    server's code and message. compute_loss sends a request whose tensors exceed
    `stream_threshold_bytes` through ComputeLossStream in blocks of about
    `block_bytes` of rows (and of their answer, where a row's is the
    larger), the rest as one message, and so one the stream
    cannot carry (the projections form under reduction="mean_valid" without
    row_valid, with topk_indices or an attention_mask). Thread-safe: calls share
    one channel.

    TLS (docs/security.md): `tls_ca_file` (PEM roots) turns it on;
    `tls_cert_file` and `tls_key_file` add a client certificate for mutual
    TLS; `tls_server_name` is the name the server's certificate must carry
    when the target's host is not it. `auth_token` is sent as
    `authorization: Bearer <token>` on every call.

    Shared memory (`shared_memory=True`, docs/shared-memory.md): for a
    target on this host (`unix:` sockets, localhost, 127.0.0.0/8, [::1])
    whose server runs with --shared_memory, unary compute_loss calls place
    their tensors in POSIX shared-memory regions of this client, registered
    with the server, instead of the message: the inputs are copied into the
    region (one copy each; none for arrays already in a region registered
    with this client, see klserve.SharedMemoryRegion) and the server writes
    the outputs there. A call shape (the tensors' dtypes and shapes and the
    outputs asked for) keeps its region for the next call of that shape, up
    to `shared_memory_layouts` shapes, least recently used closed first. No
    size threshold applies then: a call streams only with stream=True.

    The outputs (grad, row_kl, d_index_query, d_index_key,
    d_index_weights, topk_indices) are then NumPy views of the region, with
    no copy: they are valid until the next call of the same shapes, which
    writes over them (LossResult.shared_memory says so), whichever thread
    makes it. Keep one past that with .copy(), or make the client with
    `copy_outputs=True` (or pass it to one call): threads sharing a client
    should, since another's call may come between a call's return and its
    .copy(). The JAX and PyTorch wrappers always copy. A remote
    target, a server without --shared_memory or one that refuses to
    register (UNIMPLEMENTED, PERMISSION_DENIED, RESOURCE_EXHAUSTED,
    NOT_FOUND when it does not see this host's /dev/shm, or /dev/shm full)
    turns it off for this client, with one warning on the
    "klserve" logger; calls then carry their bytes inline. A region whose
    lease ran out while the job was idle (NOT_FOUND) is registered again
    and the call retried, once. close() unregisters and removes the
    regions. A child forked from the process that made the client leaves
    the parent's regions to it: the child's calls make regions of its own,
    and arrays in the caller's registered regions go inline from there.
    """

    def __init__(self, target: str = "localhost:50051", *,
                 deadline: float = 120.0, max_message_bytes: int = 1 << 30,
                 max_attempts: int = 10, initial_backoff: float = 0.05,
                 max_backoff: float = 2.0,
                 stream_threshold_bytes: int = 64 << 20,
                 block_bytes: int = 4 << 20,
                 channel_options: Sequence[Tuple[str, Any]] = (),
                 tls_ca_file: Optional[str] = None,
                 tls_cert_file: Optional[str] = None,
                 tls_key_file: Optional[str] = None,
                 tls_server_name: Optional[str] = None,
                 auth_token: Optional[str] = None,
                 shared_memory: bool = False,
                 shared_memory_layouts: int = 8,
                 copy_outputs: bool = False) -> None:
        if not target:
            raise ValueError("target: must not be empty")
        # gRPC would take a web URL, or a port alone, for a DNS name and
        # retry resolving it until the deadline.
        if target.lower().startswith(("http://", "https://", "grpc://",
                                      "grpcs://", "tcp://")):
            raise ValueError(
                "target: %r is a URL; gRPC takes host:port, "
                "dns:///host:port or unix:/path (TLS is set by the tls_* "
                "arguments, not an https:// scheme)" % (target,))
        if target.lower() in ("unix:", "unix://"):
            raise ValueError("target: %r has no path; give "
                             "unix:/path/to/klserve.sock" % (target,))
        if target.isdigit():
            raise ValueError(
                "target: %r is a port alone; gRPC takes host:port "
                "(localhost:%s), dns:///host:port or unix:/path" %
                (target, target))
        # A host alone gets gRPC's port, 443 for a name and 0 for an
        # address, where no plaintext klserve listens; over TLS it may well
        # be a proxy's 443.
        with_port = with_default_port(target)
        if with_port is not None and tls_ca_file is None:
            raise ValueError(
                "target: %r has no port, and gRPC would not pick klserve's; "
                "give host:port (%s for klserve's default --listen)" %
                (target, with_port))
        port = bad_port(target) if with_port is None else None
        if port is not None:
            raise ValueError("target: %r has port %r; a port is a number "
                             "from 1 to 65535 (or http, https)" %
                             (target, port))
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
        if shared_memory_layouts < 1:
            raise ValueError("shared_memory_layouts: must be >= 1")
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
        credentials = channel_credentials(tls_ca_file, tls_cert_file,
                                          tls_key_file, tls_server_name)
        self._tls = tls_ca_file is not None
        self._client_certificate = tls_cert_file is not None
        if tls_server_name:
            options.append(("grpc.ssl_target_name_override", tls_server_name))
        options.extend(channel_options)
        self._metadata = token_metadata(auth_token)
        self._channel_arguments = (credentials, options)
        self._open_channel()
        # A forked child's copy of its parent's channel: never used or
        # closed there (_start_over_after_fork), but kept referenced.
        self._parents_channel = None
        self._random = random.Random()
        self._closed = False
        self._random_lock = threading.Lock()
        # Shared memory: None until the first call decides (the target, the
        # server's answer), then True or False for the client's life.
        self.shared_memory = bool(shared_memory)
        self.copy_outputs = bool(copy_outputs)
        self._shm_on: Optional[bool] = None if shared_memory else False
        # The server's --max_tensor_bytes, learnt with _shm_on.
        self._shm_tensor_limit = 0
        self._shm_lock = threading.Lock()
        # Through a weak reference: a bound method would tie the client in
        # a cycle, freed only by the cyclic collector, on whatever thread
        # it runs (the finalizer's RPCs with it).
        client = weakref.ref(self)

        def close_layout(layout: Layout) -> None:
            owner = client()
            if owner is not None:
                owner._close_layout(layout)

        self._layouts = LayoutPool(int(shared_memory_layouts), close_layout)
        # The caller's regions registered through this client, by name:
        # arrays in them travel by reference.
        self._user_regions: Dict[str, SharedMemoryRegion] = {}
        # The names of the regions this client owns the registration of
        # (its layouts, and SharedMemoryRegion.register through it; not the
        # raw register_region RPC's). A client dropped without close()
        # (garbage collection, the interpreter's exit) unregisters them too:
        # the server would otherwise keep each for its lease, against
        # --max_regions, which other jobs share. The finalizer holds no
        # reference to the client.
        self._registered: Set[str] = set()
        self._finalizer = self._finalize_in_this_process()
        _clients.add(self)

    def _open_channel(self) -> None:
        credentials, options = self._channel_arguments
        if credentials is None:
            self._channel = grpc.insecure_channel(self.target, options=options)
        else:
            self._channel = grpc.secure_channel(self.target, credentials,
                                                options=options)
        self._stub = pb2_grpc.IndexerKlStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def _finalize_in_this_process(self) -> weakref.finalize:
        return weakref.finalize(
            self, _release, os.getpid(), self._channel, self._stub,
            self._metadata, self._registered, self._shm_lock)

    def _start_over_after_fork(self) -> None:
        """In a child just forked from the process that made this client.
        Its connection and its regions are the parent's: the two processes
        would read one socket's HTTP/2 stream, and write into the same
        shared memory, which the parent goes on using. The child opens a
        channel of its own and makes regions of its own on its first call;
        it neither uses nor closes the parent's (whose finalizer does
        nothing here), and the caller's regions registered through the
        client go inline from the child. The locks are new: a parent thread
        may have held one at the fork."""
        self._parents_channel = self._channel
        self._open_channel()
        self._shm_lock = threading.Lock()
        self._random_lock = threading.Lock()
        self._layouts = self._layouts.empty_copy()
        self._user_regions = {}
        self._registered = set()
        self._finalizer.detach()
        self._finalizer = self._finalize_in_this_process()

    # -- lifetime ----------------------------------------------------------

    def close(self) -> None:
        """Closes the client's regions (unregistered, unlinked), ends the
        registrations of the caller's regions made through it, and closes
        the channel."""
        self._closed = True
        self._layouts.close_all()
        with self._shm_lock:
            regions = list(self._user_regions.values())
        for region in regions:
            name = region.name
            region._registration = None  # pylint: disable=protected-access
            self._drop_region(region, name)
        self._finalizer()  # what is left registered, then the channel

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- retries -----------------------------------------------------------

    def _with_retries(self, attempt_fn: Callable[[float, _Attempt], _T],
                      call_deadline: Optional["_CallDeadline"] = None) -> _T:
        """Runs attempt_fn(timeout_s, attempt) until it returns, raises
        anything but a retriable UNAVAILABLE or a refusal at the server's
        limit of calls in flight, or attempts or time (`call_deadline`'s,
        else the client's deadline from now) run out."""
        if self._closed:
            raise KlserveError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "klserve.Client(%r) is closed (close(), or the end of its "
                "with block): make a new Client" % (self.target,))
        start = time.monotonic()
        if call_deadline is None:
            seconds, deadline = self.deadline, start + self.deadline
        else:
            seconds, deadline = call_deadline.seconds, call_deadline.end
        backoff = self.initial_backoff
        tries = 0
        refusals = 0  # at the server's limit of calls in flight

        def last_of(error: KlserveError, ran_out: str) -> KlserveError:
            """`error`, with the count of refusals and what ended the
            retries added to a refusal at the limit."""
            if not error.overloaded or refusals < 2:
                return error
            return KlserveError(error.code, "%s (refused %d times in %.1f s; "
                                "%s)" % (error.details, refusals,
                                         time.monotonic() - start, ran_out),
                                error.debug_error_string, True)

        while True:
            tries += 1
            attempt = _Attempt()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._past_deadline(
                    KlserveError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                 _LOCAL_DEADLINE), seconds)
            try:
                return attempt_fn(remaining, attempt)
            except KlserveError:
                raise
            except grpc.RpcError as e:
                error = KlserveError.from_rpc_error(e)
            if (error.code == grpc.StatusCode.DEADLINE_EXCEEDED and
                    (_LOCAL_DEADLINE in error.details or
                     time.monotonic() >= deadline)):
                raise self._past_deadline(error, seconds)
            if (error.code != grpc.StatusCode.UNAVAILABLE and
                    not error.overloaded):
                raise explain_message_limit(error, self.max_message_bytes)
            refusals += error.overloaded
            last = explain_unavailable(error, self._tls,
                                       self._client_certificate)
            if not attempt.may_retry or tries >= self.max_attempts:
                raise last_of(last, "for longer bursts raise max_attempts")
            with self._random_lock:
                wait = backoff * self._random.uniform(0.5, 1.0)
            if time.monotonic() + wait >= deadline:
                raise last_of(last, "the call's deadline came first")
            time.sleep(wait)
            backoff = min(backoff * 2, self.max_backoff)

    @staticmethod
    def _past_deadline(error: KlserveError, seconds: float) -> KlserveError:
        """The call's own deadline passing, with the deadline and how to
        give more: a bare "Deadline Exceeded" after two minutes says
        neither. (The server's DEADLINE_EXCEEDED, for its
        --max_compute_duration or --stream_idle_timeout, names its flag.)"""
        return KlserveError(error.code, (
            "%s (no answer within the call's deadline of %g s, retries "
            "included: klserve.Client(deadline=...), or deadline= on a loss "
            "call, gives more; a server that takes this long may be stuck "
            "or far too busy)" % (error.details, seconds)),
            error.debug_error_string, error.overloaded)

    # -- simple calls ------------------------------------------------------

    def health(self, service: str = "") -> bool:
        """grpc.health.v1.Health/Check: True when SERVING, False when the
        server answers otherwise (NOT_SERVING while it drains). When no
        server answers, KlserveError: UNAVAILABLE once the retries are
        spent, saying what was found at the address, or DEADLINE_EXCEEDED
        when something accepts the connection and never answers."""
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
            max_stream_key_bytes=r.max_stream_key_bytes,
            max_thread_scratch_bytes=r.max_thread_scratch_bytes,
            shared_memory=r.shared_memory)

    def finish_step(self, run: str, step: int) -> StepResult:
        """Publishes the run's step now. Every rank may call it after the
        step: all but the first get already_finished=True. KlserveError
        NOT_FOUND when the server has no samples of `step` for `run`."""
        request = pb2.FinishStepRequest(run=run,
                                        step=_number("step", int, step))
        r = self._with_retries(lambda timeout, _: self._stub.FinishStep(
            request, timeout=timeout, metadata=self._metadata))
        return StepResult(indexer_loss=r.indexer_loss,
                          indexer_loss_unscaled=r.indexer_loss_unscaled,
                          requests=r.requests,
                          already_finished=r.already_finished)

    # -- shared-memory regions ---------------------------------------------

    def register_region(self, name: str, key: str, offset: int,
                        byte_size: int) -> int:
        """RegisterRegion: bytes [offset, offset + byte_size) of the POSIX
        shared-memory object /dev/shm/<key>, named `name` in requests;
        returns the lease in seconds. The same name, key, offset and size
        again renews it; the name with other values is ALREADY_EXISTS. The
        caller must be on the server's host (PERMISSION_DENIED otherwise)
        and the server run with --shared_memory (UNIMPLEMENTED otherwise).
        SharedMemoryRegion.register is the usual way in."""
        request = pb2.RegisterRegionRequest(name=name, key=key,
                                            offset=int(offset),
                                            byte_size=int(byte_size))
        r = self._with_retries(lambda timeout, _: self._stub.RegisterRegion(
            request, timeout=timeout, metadata=self._metadata))
        return int(r.lease_seconds)

    def unregister_region(self, name: str) -> None:
        """UnregisterRegion: NOT_FOUND for an unknown name,
        FAILED_PRECONDITION while calls use it."""
        request = pb2.UnregisterRegionRequest(name=name)
        self._with_retries(lambda timeout, _: self._stub.UnregisterRegion(
            request, timeout=timeout, metadata=self._metadata))

    def list_regions(self) -> RegionList:
        """ListRegions: every region the server holds, any client's."""
        r = self._with_retries(lambda timeout, _: self._stub.ListRegions(
            pb2.ListRegionsRequest(), timeout=timeout,
            metadata=self._metadata))
        return RegionList(
            regions=tuple(RegionStatus(
                name=x.name, key=x.key, offset=x.offset,
                byte_size=x.byte_size, users=x.users,
                lease_left_seconds=x.lease_left_seconds) for x in r.regions),
            max_regions=r.max_regions, max_region_bytes=r.max_region_bytes)

    def _adopt_region(self, region: SharedMemoryRegion) -> None:
        """A caller's region registered through this client: its arrays go
        by reference from now on."""
        with self._shm_lock:
            self._user_regions[region.name] = region
            self._registered.add(region.name)

    def _forget_region(self, region: SharedMemoryRegion) -> None:
        with self._shm_lock:
            if self._user_regions.get(region.name) is region:
                del self._user_regions[region.name]
                self._registered.discard(region.name)

    def _drop_region(self, region: SharedMemoryRegion, name: str) -> None:
        """Forgets a region and unregisters it, best effort: on close, a
        server that is gone (or a call still using it) leaves it to the
        lease, and a closing client does not wait out its deadline."""
        with self._shm_lock:
            if self._user_regions.get(name) is region:
                del self._user_regions[name]
            self._registered.discard(name)
        _unregister_quietly(self._stub, self._metadata, name, 2.0)

    def _close_layout(self, layout: Layout) -> None:
        self._drop_region(layout.region, layout.name)
        layout.region.close()

    def _shared_memory_usable(self) -> bool:
        """Whether calls go through shared memory; decided on the first
        call (the target, then GetServerInfo) and kept."""
        if self._shm_on is not None:
            return self._shm_on
        if not is_local_target(self.target):
            self._shared_memory_off("the target %r is not on this host" %
                                    self.target)
            return False
        info = self.server_info()
        if not info.shared_memory:
            self._shared_memory_off("the server does not serve regions "
                                    "(start it with --shared_memory)")
        else:
            with self._shm_lock:
                self._shm_tensor_limit = info.max_tensor_bytes
                if self._shm_on is None:
                    self._shm_on = True
        return bool(self._shm_on)

    def _shared_memory_off(self, why: str) -> None:
        """Turns shared memory off for this client, with the one log line
        that says so."""
        with self._shm_lock:
            if self._shm_on is False:
                return
            self._shm_on = False
        logging.getLogger("klserve").warning(
            "klserve.Client(%r): shared memory off, tensors travel inline: "
            "%s", self.target, why)
        self._layouts.drop_idle()

    # -- the loss ----------------------------------------------------------

    def compute_loss(self, indexer_scores: Optional[npt.ArrayLike] = None,
                     **arguments: Any) -> LossResult:
        """The indexer KL loss of one problem (docs/spec.md).

        Keyword arguments: the request's other tensors, named as in
        ComputeLossRequest (klserve/_tensor_table.py), and the fields of
        klserve.ComputeLossOptions, which says what each option does;
        inspect.signature(Client.compute_loss) lists them all.

        Arrays are NumPy arrays, PyTorch tensors (any device; bfloat16
        included) or anything np.asarray takes: the float
        inputs float32, float16 or bfloat16 (ml_dtypes.bfloat16; float64 is
        narrowed to float32), topk_indices, segment ids and key bounds
        integers (sent as int32), masks bool. The logits form: the scores
        and exactly one of attention_logits [B, H, T, S|K] and
        attention_weights [B, T, S|K] as the target; topk_indices
        [B, T, K] selects the sparse stage (num_keys = S is then required).
        The projections form (see compute_loss_from_projections): no
        scores, and query, key, index_query, index_key and index_weights
        instead of a target. Returns a LossResult; raises KlserveError.
        Through shared memory (Client(shared_memory=True)), its output
        arrays are views of the client's region, valid until the next call
        of the same shapes from any thread (LossResult.shared_memory),
        unless copy_outputs.
        """
        arrays, option_arguments = split_arguments("compute_loss", arguments)
        call = ComputeLossOptions(**option_arguments)
        if indexer_scores is not None:
            arrays[SCORES] = indexer_scores
        _check_form(arrays, call)
        tensors = {t.name: t.convert(t.name, arrays[t.name])
                   for t in TENSORS if t.name in arrays}
        options = self._options(call)
        copy = (self.copy_outputs if call.copy_outputs is None else
                _number("copy_outputs", bool, call.copy_outputs))
        tags = self._tags(call)
        call_deadline = None
        if call.deadline is not None:
            seconds = _number("deadline", float, call.deadline)
            if not (seconds > 0 and np.isfinite(seconds)):
                raise invalid_argument("deadline: must be finite and > 0 "
                                       "seconds, got %r" % (call.deadline,))
            call_deadline = _CallDeadline(time.monotonic() + seconds, seconds)
        total_bytes = sum(arr.nbytes for _, arr in tensors.values())
        stream = call.stream
        if not stream and self._shm_on is not False:
            if self._shared_memory_usable():
                result = self._compute_shared(tensors, options, tags,
                                              call.request_id, copy,
                                              call_deadline)
                if result is not None:
                    return result
        if stream is None:
            stream = (total_bytes > self.stream_threshold_bytes and
                      stream_carries(pb2, options, tensors))
        if stream:
            return self._compute_streaming(tensors, options, tags,
                                           call.request_id, call_deadline)
        return self._compute_unary(tensors, options, tags, call.request_id,
                                   call_deadline)

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
            causal=_number("causal", bool, _unset_is(call.causal, False)),
            num_keys=_number("num_keys", int, call.num_keys or 0),
            topk=_number("topk", int, call.topk or 0),
            flavor=int(flavor), reduction=int(reduction),
            grad_dtype=grad_wire_name(call.grad_dtype),
            skip_grad=not _number("want_grad", bool,
                                  _unset_is(call.want_grad, True)),
            want_row_kl=_number("want_row_kl", bool,
                                _unset_is(call.want_row_kl, False)),
            want_diagnostics=_number("want_diagnostics", bool,
                                     _unset_is(call.want_diagnostics, False)),
            recall_k=_number("recall_k", int, call.recall_k or 0))
        # Optional in the proto: unset means the spec's default.
        for name, kind in (("q_offset", int), ("softmax_scale", float),
                           ("scaling_factor", float), ("grad_scale", float),
                           ("index_weight_scale", float), ("use_relu", bool)):
            value = getattr(call, name)
            if value is not None:
                setattr(options, name, _number(name, kind, value))
        return options

    @staticmethod
    def _tags(call: ComputeLossOptions) -> Optional[Any]:
        """The proto's Tags of a call; None when it has none."""
        values = {name: _number(name, int, getattr(call, name), bits)
                  for name, bits in (("step", 64), ("layer", 32),
                                     ("microbatch", 32))
                  if getattr(call, name) is not None}
        if call.run is None and not values:
            return None
        return pb2.Tags(run=call.run or "", **values)

    def _compute_unary(self, tensors, options, tags, request_id,
                       call_deadline):
        request = pb2.ComputeLossRequest(request_id=request_id,
                                         options=options)
        if tags is not None:
            request.tags.CopyFrom(tags)
        for field, (name, arr) in tensors.items():
            getattr(request, field).CopyFrom(to_tensor(pb2, name, arr))
        response = self._with_retries(
            lambda timeout, _: self._stub.ComputeLoss(
                request, timeout=timeout, metadata=self._metadata),
            call_deadline)
        grad = (from_tensor(response.grad, "grad")
                if response.HasField("grad") and response.grad.dtype else None)
        row_kl = (from_tensor(response.row_kl, "row_kl")
                  if response.HasField("row_kl") and response.row_kl.dtype
                  else None)
        result = loss_result(response, grad, row_kl, streamed=False)
        for field in INDEXER_GRADS + ("topk_indices",):
            if response.HasField(field) and getattr(response, field).dtype:
                setattr(result, field, from_tensor(getattr(response, field),
                                                   field, writable=False))
        return result

    def _compute_shared(self, tensors, options, tags, request_id, copy,
                        call_deadline):
        """The unary call with its tensors in shared memory; None when it
        must go inline instead (shapes too malformed to lay out, which the
        server then names, or shared memory just turned off)."""
        outputs = output_specs(tensors, options)
        if outputs is None:
            return None
        # An output past the server's tensor limit (a topk of 2^31, say):
        # the server refuses it whole, in a region or inline, and a region
        # that large may not be made, which would turn shared memory off
        # for good. The call goes as it would without shared memory: a
        # stream, which splits the per-row outputs, or inline, where the
        # server names the field.
        if any(math.prod(shape) * dtype.itemsize > self._shm_tensor_limit
               for _, dtype, shape in outputs.values()):
            return None
        # Arrays in a region the caller registered go by reference.
        with self._shm_lock:
            user_regions = list(self._user_regions.values())
        placed = {}
        for field, (_, arr) in tensors.items():
            for region in user_regions:
                offset = region.offset_of(arr)
                name = region.name
                if offset is not None and name is not None:
                    placed[field] = (region, name, offset)
                    break
        inputs = {field: (arr.dtype, arr.shape)
                  for field, (_, arr) in tensors.items()
                  if field not in placed}
        output_slots = {field: (dtype, shape)
                        for field, (_, dtype, shape) in outputs.items()}
        key = (tuple(inputs.items()), tuple(output_slots.items()))
        layout = self._layouts.take(key)
        if layout is None:
            layout = self._new_layout(inputs, output_slots)
            if layout is None:
                return None
            self._layouts.add(key, layout)
        answered = False
        try:
            request = pb2.ComputeLossRequest(request_id=request_id,
                                             options=options)
            if tags is not None:
                request.tags.CopyFrom(tags)
            for field, (name, arr) in tensors.items():
                tensor = getattr(request, field)
                tensor.dtype = name
                tensor.shape.extend(arr.shape)
                if field in placed:
                    _, region_name, offset = placed[field]
                else:
                    offset, dtype, shape = layout.inputs[field]
                    np.copyto(layout.region.array(offset, shape, dtype), arr,
                              casting="no")
                    region_name = layout.name
                tensor.region.region = region_name
                tensor.region.offset = offset
                tensor.region.byte_size = arr.nbytes
            for field, (offset, dtype, shape) in layout.outputs.items():
                target = getattr(request.outputs, field)
                target.region = layout.name
                target.offset = offset
                target.byte_size = (int(np.prod(shape, dtype=np.int64)) *
                                    dtype.itemsize)

            def call():
                return self._with_retries(
                    lambda timeout, _: self._stub.ComputeLoss(
                        request, timeout=timeout, metadata=self._metadata),
                    call_deadline)

            try:
                response = call()
            except KlserveError as e:
                # A region whose lease ran out while the job was idle: the
                # server forgot it, the file is still here. Once.
                if e.code != grpc.StatusCode.NOT_FOUND:
                    raise
                try:
                    self.register_region(layout.name, layout.region.key, 0,
                                         layout.region.byte_size)
                    for region, region_name, _ in placed.values():
                        self.register_region(region_name, region.key, 0,
                                             region.byte_size)
                except KlserveError as refusal:
                    # A server restarted without regions, say.
                    if refusal.code not in _REFUSALS:
                        raise
                    self._shared_memory_off("RegisterRegion: %s" % refusal)
                    return None
                response = call()
            result = self._shared_result(response, layout, copy)
            answered = True
            return result
        finally:
            if answered:
                self._layouts.give_back(layout)
            else:
                # The server may still be computing from this region and
                # into it (a deadline or a cancel ends the call here, not
                # there): never reused. Unregistering is refused while it
                # computes; the lease then ends the registration.
                self._layouts.discard(key, layout)
                self._close_layout(layout)

    def _new_layout(self, inputs, outputs) -> Optional[Layout]:
        """A registered region for a call shape; None (and shared memory
        off) when it cannot be made or the server refuses it."""
        size, input_slots, output_slots = plan(inputs, outputs)
        try:
            region = SharedMemoryRegion(size)
        except OSError as e:
            self._shared_memory_off("cannot make a region of %d bytes in "
                                    "/dev/shm: %s" % (size, e))
            return None
        for attempt in (1, 2):
            try:
                self.register_region(region.key, region.key, 0, size)
                with self._shm_lock:
                    self._registered.add(region.key)
                return Layout(region, input_slots, output_slots)
            except KlserveError as e:
                # Past the server's limits, the regions of other shapes
                # this client keeps idle may be what is in the way.
                if (e.code == grpc.StatusCode.RESOURCE_EXHAUSTED and
                        attempt == 1 and self._layouts.drop_idle()):
                    continue
                region.close()
                if e.code in _REFUSALS:
                    self._shared_memory_off("RegisterRegion: %s" % e)
                    return None
                raise
        return None  # not reached: the second attempt returns or raises

    def _shared_result(self, response, layout: Layout,
                       copy: bool) -> LossResult:
        result = loss_result(response, None, None, streamed=False)
        result.shared_memory = True
        for field in _OUTPUTS:
            if not response.HasField(field):
                continue
            tensor = getattr(response, field)
            if not tensor.dtype:
                continue
            if tensor.HasField("region"):
                arr = self._region_output(tensor, field, layout, copy)
            else:
                arr = from_tensor(tensor, field,
                                  writable=field in ("grad", "row_kl"))
            setattr(result, field, arr)
        return result

    @staticmethod
    def _region_output(tensor, field: str, layout: Layout,
                       copy: bool) -> np.ndarray:
        """An output the server wrote into the layout's region: a view of
        it, or a copy taken before the layout serves another call."""
        if field not in layout.outputs:
            raise _broke_protocol("%s: in a region, which the request did "
                                  "not give it" % field)
        offset, dtype, shape = layout.outputs[field]
        where = tensor.region
        if (where.region != layout.name or where.offset != offset or
                WIRE_DTYPES.get(tensor.dtype) != dtype or
                tuple(tensor.shape) != shape):
            raise _broke_protocol(
                "%s: %s %s in region %r at %d, asked for %s at %d of %r" % (
                    field, tensor.dtype, list(tensor.shape), where.region,
                    where.offset, list(shape), offset, layout.name))
        view = layout.region.array(offset, shape, dtype)
        return view.copy() if copy else view

    def _compute_streaming(self, tensors, options, tags, request_id,
                           call_deadline):
        slicer = RequestSlicer(tensors)
        block_rows = slicer.block_rows_for(
            self.block_bytes, answer_row_bytes(tensors, options))
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
                return loss_result(result, grad, row_kl, streamed=True)
            outputs = assembler.finish()
            loss = loss_result(result, None, outputs.pop("row_kl", None),
                           streamed=True)
            for field, arr in outputs.items():
                arr.flags.writeable = False  # as the unary call returns them
                setattr(loss, field, arr)
            if result.HasField("d_index_key") and result.d_index_key.dtype:
                loss.d_index_key = from_tensor(result.d_index_key,
                                               "d_index_key", writable=False)
            return loss

        return self._with_retries(attempt, call_deadline)


# What RegisterRegion answers a caller that cannot have regions: a server
# without --shared_memory, a caller not on its host or another user (the
# object is 0600), no room left, or a server that does not see this /dev/shm
# (NOT_FOUND: a container without the shared mount).
_REFUSALS = (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.PERMISSION_DENIED,
             grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.NOT_FOUND)
# The response's tensors, all of which OutputRegions can direct.
_OUTPUTS = ("grad", "row_kl") + INDEXER_GRADS + ("topk_indices",)


def _broke_protocol(what: str) -> KlserveError:
    return KlserveError(grpc.StatusCode.INTERNAL,
                        "server broke the protocol: " + what)


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
# The clients alive in this process, for the child of a fork.
_clients: "weakref.WeakSet[Client]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    global _default_lock
    _default_lock = threading.Lock()
    for client in list(_clients):
        client._start_over_after_fork()  # pylint: disable=protected-access


os.register_at_fork(after_in_child=_after_fork_in_child)


def default_client() -> Client:
    """The Client that klserve.jax and klserve.torch use when given none:
    target $KLSERVE_TARGET, else localhost:50051, with shared memory when
    $KLSERVE_SHARED_MEMORY is 1 (or true, yes, on); made on first use."""
    global _default_client
    with _default_lock:
        if _default_client is None:
            shared_memory = os.environ.get(
                "KLSERVE_SHARED_MEMORY", "").strip().lower() in (
                    "1", "true", "yes", "on")
            _default_client = Client(
                os.environ.get("KLSERVE_TARGET", "localhost:50051"),
                shared_memory=shared_memory)
        return _default_client


def set_default_client(client: Client) -> None:
    """Makes `client` the default client."""
    global _default_client
    with _default_lock:
        _default_client = client


__all__ = ["Client", "default_client", "set_default_client"]
