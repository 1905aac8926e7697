"""klserve.Client against a live server, checked with the float64 NumPy
reference (reference.py)."""

import re
import socket
import subprocess
import sys
import threading
import time

import grpc
import ml_dtypes
import numpy as np
import pytest

import klserve
from klserve._errors import explain_unavailable
from conftest import Server, held_stream_slot
from reference import indexer_kl_reference

BF16 = ml_dtypes.bfloat16


def rng_for(seed):
    return np.random.default_rng(seed)


def dense_problem(seed, batch=2, heads=3, rows=6, keys=6, dtype=np.float32):
    rng = rng_for(seed)
    return dict(
        indexer_scores=rng.standard_normal((batch, rows, keys)).astype(dtype),
        attention_logits=(2 * rng.standard_normal(
            (batch, heads, rows, keys))).astype(dtype))


def check(result, ref, *, rtol=2e-5, grad_atol=None, grad=True):
    """The service's answer against the reference's."""
    assert result.denominator == ref["denominator"]
    assert result.rows_counted == ref["rows_counted"]
    assert result.rows_fully_masked == ref["rows_fully_masked"]
    assert result.rows_zero_target == ref["rows_zero_target"]
    assert result.unscaled_loss == pytest.approx(ref["unscaled_loss"],
                                                 rel=rtol, abs=1e-7)
    assert result.loss == pytest.approx(ref["loss"], rel=rtol, abs=1e-9)
    if grad:
        assert result.grad is not None
        assert result.grad.shape == ref["grad"].shape
        g = result.grad.astype(np.float64)
        scale = max(np.abs(ref["grad"]).max(), 1e-30)
        atol = grad_atol if grad_atol is not None else 2e-6 * scale
        np.testing.assert_allclose(g, ref["grad"], rtol=rtol, atol=atol)
    if result.row_kl is not None:
        assert result.row_kl.dtype == np.float64
        np.testing.assert_allclose(result.row_kl, ref["row_kl"], rtol=rtol,
                                   atol=1e-7)
    if result.diagnostics is not None:
        d = result.diagnostics
        assert d["mean_entropy_p"] == pytest.approx(ref["mean_entropy_p"],
                                                    rel=rtol, abs=1e-6)
        assert d["mean_entropy_q"] == pytest.approx(ref["mean_entropy_q"],
                                                    rel=rtol, abs=1e-6)
        if ref["topk_recall"] is not None:
            assert d["topk_recall"] == pytest.approx(ref["topk_recall"],
                                                     rel=rtol, abs=1e-6)


def test_a_missing_framework_names_the_extra_that_brings_it():
    # The client installs without JAX and PyTorch; importing klserve.jax
    # without JAX once failed with a bare "No module named 'jax'".
    for framework in ("jax", "torch"):
        hidden = "import sys; sys.modules[%r] = None; import klserve.%s" % (
            framework, framework)
        run = subprocess.run([sys.executable, "-c", hidden],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode != 0
        assert "pip install './client/python[%s]'" % framework in run.stderr


def test_health_and_server_info(client):
    assert client.health() is True
    info = client.server_info()
    assert info.backend in ("cpu", "cuda")
    assert info.max_message_bytes > 0
    assert info.max_open_streams > 0
    # The server's default --max_stream_key_bytes: 1 GiB.
    assert info.max_stream_key_bytes == 1 << 30
    # And --max_thread_scratch_bytes: 1 GiB.
    assert info.max_thread_scratch_bytes == 1 << 30
    assert set(info.grad_dtypes) >= {"FP32", "BF16", "FP16"}
    assert set(info.input_dtypes) >= {"FP32", "BF16", "FP16"}


def test_dense_per_head_logits(client):
    problem = dense_problem(1, batch=2, heads=4, rows=7, keys=7)
    options = dict(causal=True, softmax_scale=0.7, scaling_factor=0.01,
                   recall_k=3)
    r = client.compute_loss(**problem, **options, want_row_kl=True,
                            want_diagnostics=True)
    assert r.grad.dtype == np.float32
    assert r.streamed is False
    check(r, indexer_kl_reference(**problem, **options))
    assert r.loss > 0


def test_head_aggregated_with_zero_target_and_key_padding(client):
    rng = rng_for(2)
    batch, rows, keys = 2, 5, 8
    weights = rng.random((batch, rows, keys)).astype(np.float32)
    weights[0, 3] = 0  # a zero-target row
    key_padding = np.ones((batch, keys), bool)
    key_padding[1, 6:] = False
    scores = rng.standard_normal((batch, rows, keys)).astype(np.float32)
    for reduction in ("mean", "mean_valid", "sum"):
        kwargs = dict(attention_weights=weights,
                      key_padding_mask=key_padding, reduction=reduction)
        r = client.compute_loss(scores, **kwargs, want_row_kl=True,
                                want_diagnostics=True)
        ref = indexer_kl_reference(scores, **kwargs)
        assert ref["rows_zero_target"] == 1
        check(r, ref)


def test_sparse_top_k(client):
    rng = rng_for(3)
    batch, heads, rows, keys, k = 2, 3, 6, 10, 4
    # Distinct keys per row; some slots empty (-1), some causally masked.
    topk = np.stack([np.stack([rng.permutation(keys)[:k] for _ in range(rows)])
                     for _ in range(batch)]).astype(np.int32)
    topk[0, 2, 1] = -1
    topk[1, 4, :] = -1  # a row with no slot: fully masked
    logits = rng.standard_normal((batch, heads, rows, k)).astype(np.float32)
    scores = rng.standard_normal((batch, rows, k)).astype(np.float32)
    for flavor in ("exact", "maxtext"):
        kwargs = dict(attention_logits=logits, topk_indices=topk,
                      num_keys=keys, causal=True, flavor=flavor,
                      scaling_factor=0.5)
        r = client.compute_loss(scores, **kwargs, want_row_kl=True,
                                want_diagnostics=True, recall_k=2)
        ref = indexer_kl_reference(scores, **kwargs, recall_k=2)
        assert ref["rows_fully_masked"] >= 1
        assert r.grad.shape == (batch, rows, k)
        check(r, ref)


def test_sparse_with_all_slots_equals_dense(client):
    problem = dense_problem(4, batch=1, heads=2, rows=5, keys=5)
    dense = client.compute_loss(**problem, causal=True)
    topk = np.broadcast_to(np.arange(5, dtype=np.int32), (1, 5, 5))
    sparse = client.compute_loss(**problem, topk_indices=topk, num_keys=5,
                                 causal=True)
    assert sparse.loss == pytest.approx(dense.loss, rel=1e-6)
    np.testing.assert_allclose(sparse.grad, dense.grad, atol=1e-7)


@pytest.mark.parametrize("flavor", ["exact", "maxtext"])
@pytest.mark.parametrize("reduction", ["mean", "mean_valid", "sum"])
def test_masks_flavors_reductions(client, flavor, reduction):
    rng = rng_for(5)
    batch, heads, rows, keys = 2, 2, 6, 9
    problem = dict(
        indexer_scores=rng.standard_normal((batch, rows, keys)).astype(
            np.float32),
        attention_logits=rng.standard_normal(
            (batch, heads, rows, keys)).astype(np.float32))
    segment_q = np.array([[0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 2, 2]], np.int32)
    segment_kv = np.array([[0, 0, 0, 0, 1, 1, 1, 1, -1],
                           [0, 0, 0, 0, 0, 0, 2, 2, 2]], np.int32)
    mask = rng.random((batch, rows, keys)) > 0.2
    row_valid = np.ones((batch, rows), bool)
    row_valid[1, 0] = False
    kwargs = dict(segment_ids_q=segment_q, segment_ids_kv=segment_kv,
                  attention_mask=mask, row_valid=row_valid, causal=True,
                  flavor=flavor, reduction=reduction, scaling_factor=0.01)
    r = client.compute_loss(**problem, **kwargs, want_row_kl=True,
                            want_diagnostics=True)
    check(r, indexer_kl_reference(**problem, **kwargs))


def test_q_offset_and_fewer_rows_than_keys(client):
    problem = dense_problem(6, batch=1, heads=2, rows=4, keys=10)
    for q_offset in (None, 2):
        kwargs = dict(causal=True, q_offset=q_offset)
        r = client.compute_loss(**problem, **kwargs, want_row_kl=True)
        check(r, indexer_kl_reference(**problem, **kwargs))


def test_skip_grad(client):
    r = client.compute_loss(**dense_problem(7), want_grad=False)
    assert r.grad is None and r.row_kl is None and r.diagnostics is None
    assert r.loss > 0


def test_bf16_round_trip(client):
    """bf16 in, bf16 gradient out: the float64 answer on the bf16-rounded
    inputs, the gradient rounded once to bf16."""
    problem = dense_problem(8, batch=2, heads=2, rows=8, keys=8, dtype=BF16)
    assert problem["indexer_scores"].dtype == BF16
    r = client.compute_loss(**problem, causal=True, grad_dtype="bf16",
                            want_row_kl=True)
    assert r.grad.dtype == np.dtype(BF16)
    ref = indexer_kl_reference(**problem, causal=True)
    check(r, ref, grad=False)
    expected = ref["grad"].astype(np.float32).astype(BF16).astype(np.float64)
    # Round to nearest even of the float32 gradient: at most one bf16 ulp
    # away from the rounded float64 value.
    np.testing.assert_allclose(r.grad.astype(np.float64), expected,
                               rtol=2 ** -7, atol=1e-6)
    # bf16 scores with a numpy-dtype grad_dtype ask.
    r2 = client.compute_loss(**problem, causal=True, grad_dtype=BF16)
    np.testing.assert_array_equal(r2.grad.view(np.uint16),
                                  r.grad.view(np.uint16))


def test_fp16_inputs_and_grad(client):
    problem = dense_problem(9, dtype=np.float16)
    r = client.compute_loss(**problem, causal=True, grad_dtype=np.float16)
    assert r.grad.dtype == np.float16
    ref = indexer_kl_reference(**problem, causal=True)
    check(r, ref, grad=False)
    np.testing.assert_allclose(r.grad.astype(np.float64), ref["grad"],
                               rtol=2 ** -10, atol=1e-6)


def test_float64_and_int64_inputs_are_narrowed(client):
    rng = rng_for(10)
    scores = rng.standard_normal((1, 4, 3))
    weights = rng.random((1, 4, 3))
    topk = np.stack([[rng.permutation(6)[:3] for _ in range(4)]])  # int64
    r = client.compute_loss(scores, attention_weights=weights,
                            topk_indices=topk, num_keys=6)
    ref = indexer_kl_reference(scores.astype(np.float32),
                               attention_weights=weights.astype(np.float32),
                               topk_indices=topk, num_keys=6)
    check(r, ref)


def test_nan_scores_are_invalid_argument(client):
    problem = dense_problem(11)
    problem["indexer_scores"][1, 2, 3] = np.nan
    with pytest.raises(klserve.KlserveError) as info:
        client.compute_loss(**problem)
    err = info.value
    assert isinstance(err, grpc.RpcError)
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details.startswith("indexer_scores")
    assert "[1, 2, 3]" in err.details
    assert "INVALID_ARGUMENT" in str(err)


def test_server_errors_keep_code_and_field(client):
    problem = dense_problem(12)
    with pytest.raises(klserve.KlserveError) as info:  # no target at all
        client.compute_loss(problem["indexer_scores"])
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(klserve.KlserveError) as info:  # both targets
        client.compute_loss(**problem,
                            attention_weights=np.ones((2, 6, 6), np.float32))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    weights = np.ones((2, 6, 6), np.float32)
    weights[0, 0, 0] = -1
    with pytest.raises(klserve.KlserveError) as info:
        client.compute_loss(problem["indexer_scores"],
                            attention_weights=weights)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details.startswith("attention_weights")


def test_client_side_errors(client):
    problem = dense_problem(13)
    with pytest.raises(klserve.KlserveError) as info:
        client.compute_loss(**problem, flavor="megatron")
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(klserve.KlserveError) as info:
        client.compute_loss(**problem, grad_dtype="int8")
    assert info.value.details.startswith("grad_dtype")
    with pytest.raises(klserve.KlserveError) as info:
        client.compute_loss(problem["indexer_scores"].astype(np.int32),
                            attention_logits=problem["attention_logits"])
    assert info.value.details.startswith("indexer_scores")
    # Streaming needs consistent shapes, checked before anything is sent.
    with pytest.raises(klserve.KlserveError) as info:
        client.compute_loss(problem["indexer_scores"],
                            attention_logits=problem["attention_logits"][:1],
                            stream=True)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details.startswith("attention_logits")
    # Numbers that are not: the argument is named, no bare ValueError.
    for call, field in (
            (lambda: client.finish_step("r", "ten"), "step"),
            (lambda: client.compute_loss(**problem, run="r", layer="x"),
             "layer"),
            (lambda: client.compute_loss(**problem, scaling_factor="high"),
             "scaling_factor"),
            # Nothing is coerced into another meaning: bool("False") is
            # True, int(0.9) is 0, int(2.5) would file a sample under step 2.
            (lambda: client.compute_loss(**problem, causal="False"),
             "causal"),
            (lambda: client.compute_loss(**problem, causal=2), "causal"),
            (lambda: client.compute_loss(**problem, q_offset=0.9),
             "q_offset"),
            (lambda: client.compute_loss(**problem, run="r", step=2.5),
             "step"),
            (lambda: client.compute_loss(**problem, run="r", step="3"),
             "step"),
            (lambda: client.compute_loss(**problem, run="r", step=True),
             "step"),
            (lambda: client.compute_loss(**problem, want_row_kl="yes"),
             "want_row_kl"),
            (lambda: client.compute_loss(**problem, scaling_factor=True),
             "scaling_factor"),
            (lambda: client.compute_loss(**problem, run="r",
                                         step=np.ma.masked), "step"),
            (lambda: client.compute_loss(**problem, run="r", layer=2**31),
             "layer"),
            (lambda: client.compute_loss(**problem, run="r", step=1e300),
             "step"),
            (lambda: client.compute_loss(**problem, softmax_scale=10**400),
             "softmax_scale"),
            (lambda: client.finish_step("r", 2**63), "step")):
        with pytest.raises(klserve.KlserveError) as info:
            call()
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details.startswith(field + ": must be a"), (
            info.value.details)
    # What is one exactly is taken: NumPy and 0-d values, integral floats.
    exact = client.compute_loss(**problem, causal=True, q_offset=0)
    for causal, q_offset in ((np.bool_(True), np.int64(0)), (1, 0.0),
                             (True, np.array(0, dtype=np.int32))):
        again = client.compute_loss(**problem, causal=causal,
                                    q_offset=q_offset)
        assert again.loss == exact.loss


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_url_is_refused_as_a_target():
    # gRPC would resolve "http://localhost:50051" as one DNS name, retrying
    # until the deadline; the client refuses it at once, naming the argument.
    for url in ("http://localhost:50051", "HTTPS://example.com:443",
                "grpc://127.0.0.1:50051"):
        with pytest.raises(ValueError, match=r"^target: .* is a URL"):
            klserve.Client(url)
    with pytest.raises(ValueError,
                       match=r"^target: '50051' is a port alone; .*"
                             r"\(localhost:50051\)"):
        klserve.Client("50051")


def test_a_host_alone_is_refused_as_a_plaintext_target():
    # gRPC gives a host alone its own port (443 for a name, 0 for an
    # address), where no plaintext klserve listens.
    for host, give in (("localhost", "localhost:50051"),
                       ("127.0.0.1", "127.0.0.1:50051"),
                       ("[::1]", "[::1]:50051"), ("::1", "[::1]:50051"),
                       ("klserve.example", "klserve.example:50051"),
                       ("dns:///localhost", "dns:///localhost:50051"),
                       ("dns://8.8.8.8/klserve.example",
                        "dns://8.8.8.8/klserve.example:50051"),
                       ("dns:localhost", "dns:localhost:50051"),
                       ("DNS:localhost", "DNS:localhost:50051"),
                       ("localhost:", "localhost:50051"),
                       ("[::1]:", "[::1]:50051"),
                       ("fd00::", "[fd00::]:50051")):
        with pytest.raises(ValueError,
                           match=r"^target: '%s' has no port, .*\(%s " %
                                 (re.escape(host), re.escape(give))):
            klserve.Client(host)
    # Targets with a port, or of schemes gRPC checks itself, are taken.
    for target in ("localhost:50051", "[::1]:50051", "dns:///h:1",
                   "unix:/run/klserve/klserve.sock", "unix-abstract:klserve",
                   "ipv4:127.0.0.1:50051", "ipv6:[::1]:50051",
                   "Ipv4:127.0.0.1:50051", "DNS:///localhost:50051",
                   "vsock:3:50051", "passthrough:///localhost:50051"):
        klserve.Client(target).close()


def test_unavailable_is_retried_then_raised():
    port = free_port()
    with klserve.Client("127.0.0.1:%d" % port, deadline=5.0, max_attempts=3,
                        initial_backoff=0.02) as c:
        start = time.monotonic()
        with pytest.raises(klserve.KlserveError) as info:
            c.health()
        assert info.value.code == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - start < 5.0
        # Nothing listens there: the message says so, and no TLS hint.
        assert "nothing listens at this address" in info.value.details
        assert "TLS" not in info.value.details


def test_a_server_that_never_answers_names_the_deadline():
    # A listener that accepts and says nothing, as a stuck server: the error
    # says which deadline passed and how to give more.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        with klserve.Client("127.0.0.1:%d" % listener.getsockname()[1],
                            deadline=1.0, max_attempts=1) as c:
            with pytest.raises(klserve.KlserveError) as info:
                c.health()
        assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "deadline of 1 s" in info.value.details, info.value.details
        assert "Client(deadline=...)" in info.value.details
        # One call's own deadline, shorter than the client's.
        with klserve.Client("127.0.0.1:%d" % listener.getsockname()[1],
                            deadline=600.0, max_attempts=1) as c:
            start = time.monotonic()
            with pytest.raises(klserve.KlserveError) as info:
                c.compute_loss(**dense_problem(40), deadline=0.5)
            assert time.monotonic() - start < 60
        assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "deadline of 0.5 s" in info.value.details, info.value.details
    finally:
        listener.close()


@pytest.mark.parametrize("target", [
    "127.0.0.1:124587", "127.0.0.1:65536", "127.0.0.1:0", "127.0.0.1:-7485",
    "localhost:abc", "127.0.0.1:50051/path", "[::1]:70000",
    "dns:///localhost:99999"])
def test_a_port_outside_1_to_65535_is_refused(target):
    # gRPC took 124587 as 124587 - 65536 and connected there.
    with pytest.raises(ValueError, match=r"has port .*; a port is a number "
                       "from 1 to 65535"):
        klserve.Client(target)


def test_http_and_https_are_ports_after_a_name():
    # gRPC resolves them after a name (a TLS proxy's 443).
    for target in ("localhost:https", "localhost:http"):
        klserve.Client(target).close()


@pytest.mark.parametrize("target", ["unix:", "unix://"])
def test_a_unix_target_without_a_path_is_refused(target):
    with pytest.raises(ValueError, match="has no path; give unix:/path"):
        klserve.Client(target)


@pytest.mark.parametrize("deadline", [0, -1.0, float("inf"), float("nan"),
                                      "5"])
def test_a_calls_deadline_must_be_a_positive_number(client, deadline):
    with pytest.raises(klserve.KlserveError) as info:
        client.compute_loss(**dense_problem(41), deadline=deadline)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details.startswith("deadline"), info.value.details


def test_a_closed_client_says_so(server):
    c = server.client()
    c.close()
    with pytest.raises(klserve.KlserveError) as info:
        c.compute_loss(**dense_problem(42))
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "is closed" in info.value.details


def test_int64_indices_outside_int32_are_empty_slots(client):
    # An index outside [0, S) is an empty slot whatever its value: an int64
    # one past int32 (a sentinel such as int64's max) as much as -1.
    rng = rng_for(43)
    scores = rng.standard_normal((1, 3, 4)).astype(np.float32)
    weights = rng.random((1, 3, 4)).astype(np.float32)
    minus_one = np.array([[[0, 5, -1, 2], [1, -1, 3, 4], [6, 7, -1, -1]]])
    far = minus_one.copy()
    far[0, 0, 2] = np.iinfo(np.int64).max
    far[0, 1, 1] = -(1 << 40)
    far[0, 2, 2] = 1 << 31
    want = client.compute_loss(scores, attention_weights=weights,
                               topk_indices=minus_one.astype(np.int32),
                               num_keys=8, want_row_kl=True)
    got = client.compute_loss(scores, attention_weights=weights,
                              topk_indices=far, num_keys=8, want_row_kl=True)
    assert got.loss == want.loss
    np.testing.assert_array_equal(got.grad, want.grad)
    np.testing.assert_array_equal(got.row_kl, want.row_kl)
    ref = indexer_kl_reference(scores, attention_weights=weights,
                               topk_indices=far, num_keys=8)
    check(got, ref)


def test_a_web_server_at_the_target_is_named():
    # klserve's own /metrics port, a newcomer's likely mistake: gRPC reads
    # its HTTP/1 answer as a broken HTTP/2 one.
    metrics = free_port()
    server = Server("--metrics_listen=127.0.0.1:%d" % metrics)  # later wins
    try:
        with klserve.Client("127.0.0.1:%d" % metrics, deadline=10.0,
                            max_attempts=1) as c:
            with pytest.raises(klserve.KlserveError) as info:
                c.health()
        assert info.value.code == grpc.StatusCode.UNAVAILABLE
        assert ("something other than a gRPC server answers"
                in info.value.details), info.value.details
        assert "/metrics port" in info.value.details
    finally:
        assert server.stop() == 0, "".join(server.log)


def reaches_a_server_that_starts_after(delay, seed, **client_options):
    """Whether a call made now reaches a server that starts `delay` s
    later, on the port the call names."""
    port = free_port()
    servers = []

    def start_later():
        time.sleep(delay)
        servers.append(Server(listen="127.0.0.1:%d" % port))

    thread = threading.Thread(target=start_later)
    thread.start()
    try:
        with klserve.Client("127.0.0.1:%d" % port, **client_options) as c:
            return (c.health() and
                    c.compute_loss(**dense_problem(seed)).loss > 0)
    finally:
        thread.join()
        for s in servers:
            assert s.stop() == 0


def test_default_retries_ride_out_a_server_that_restarts():
    # A server (a sidecar, a pod) that takes 2 s to come back: a call with
    # the default retry policy waits for it rather than failing the step.
    assert reaches_a_server_that_starts_after(2.0, 15, deadline=60.0)


def test_retry_reaches_a_server_that_comes_up_late():
    assert reaches_a_server_that_starts_after(
        0.5, 14, deadline=30.0, max_attempts=20, initial_backoff=0.05,
        max_backoff=0.5)


def test_tags_and_finish_step(client):
    run = "pytest-run-%d" % time.monotonic_ns()
    results = []
    for layer in (0, 1):
        problem = dense_problem(20 + layer)
        results.append(client.compute_loss(
            **problem, causal=True, scaling_factor=0.01, run=run, step=7,
            layer=layer, microbatch=0, request_id="r%d" % layer))
    assert results[1].request_id == "r1"
    step = client.finish_step(run, 7)
    assert step.requests == 2
    mean = np.mean([r.unscaled_loss for r in results])
    assert step.indexer_loss_unscaled == pytest.approx(mean, rel=1e-6)
    assert step.indexer_loss == pytest.approx(0.01 * mean, rel=1e-6)
    assert not step.already_finished
    # Every rank may finish the step: the others learn it was finished.
    again = client.finish_step(run, 7)
    assert again.already_finished
    assert again.requests == 2 and again.indexer_loss == step.indexer_loss
    # A step the run went past without samples: no values to give.
    client.compute_loss(**dense_problem(20), run=run, step=9)
    client.compute_loss(**dense_problem(20), run=run, step=10)
    skipped = client.finish_step(run, 8)
    assert skipped.already_finished and skipped.requests == 0
    assert np.isnan(skipped.indexer_loss)
    with pytest.raises(klserve.KlserveError) as info:
        client.finish_step("pytest-no-such-run", 1)
    assert info.value.code == grpc.StatusCode.NOT_FOUND


def test_maxtext_differs_from_exact_where_q_is_tiny(client):
    """The flavours agree except where q_s is below about 1e-8 with p_s > 0:
    there MAXTEXT's epsilon damps the KL and the pull."""
    rng = rng_for(15)
    weights = rng.random((1, 4, 6)).astype(np.float32) + 0.1
    scores = rng.standard_normal((1, 4, 6)).astype(np.float32)
    scores[0, :, 2] = -40.0  # q ~ 1e-18 where p ~ 0.15
    results = {}
    for flavor in ("exact", "maxtext"):
        kwargs = dict(attention_weights=weights, flavor=flavor)
        results[flavor] = r = client.compute_loss(scores, **kwargs)
        check(r, indexer_kl_reference(scores, **kwargs))
    exact, maxtext = results["exact"], results["maxtext"]
    assert exact.loss > 1.5 * maxtext.loss
    assert np.abs(exact.grad - maxtext.grad).max() > 1e-2


class _FakeCall(grpc.RpcError):
    """What a failed grpc call raises: code() and details() methods."""

    def __init__(self, code, details):
        super().__init__()
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


def test_a_call_dropped_by_a_shutting_down_server_is_unavailable():
    # gRPC ends a call no handler took before shutdown with a bare
    # "CANCELLED" (grpc/grpc#41785); the client retries it as UNAVAILABLE.
    e = klserve.KlserveError.from_rpc_error(
        _FakeCall(grpc.StatusCode.CANCELLED, "CANCELLED"))
    assert e.code == grpc.StatusCode.UNAVAILABLE
    assert "shut down" in e.details
    # A cancellation with a message of its own (a server's reactor, a
    # client-side cancel) stays CANCELLED.
    e = klserve.KlserveError.from_rpc_error(
        _FakeCall(grpc.StatusCode.CANCELLED, "ComputeLossStream: cancelled"))
    assert e.code == grpc.StatusCode.CANCELLED


def test_a_call_cut_by_the_end_of_a_drain_says_so():
    # gRPC's bare "Cancelling all calls" when --drain_timeout ran out.
    e = explain_unavailable(
        klserve.KlserveError(grpc.StatusCode.UNAVAILABLE,
                             "Cancelling all calls"),
        tls=False, client_certificate=False)
    assert e.code == grpc.StatusCode.UNAVAILABLE
    assert e.details.startswith("Cancelling all calls (the server stopped")
    assert "--drain_timeout" in e.details


def test_a_connection_closed_under_a_call_is_not_a_tls_question():
    # gRPC's words when the server is killed under a stream: the call had
    # started, so neither the address nor TLS was wrong.
    e = explain_unavailable(
        klserve.KlserveError(grpc.StatusCode.UNAVAILABLE,
                             "Stream removed (Socket closed)"),
        tls=False, client_certificate=False)
    assert e.code == grpc.StatusCode.UNAVAILABLE
    assert e.details.startswith("Stream removed (Socket closed) (the "
                                "connection closed while this call was in "
                                "flight")
    assert "TLS" not in e.details


def test_grad_scale_scales_the_gradient_only(client):
    problem = dense_problem(21, batch=2, heads=2, rows=5, keys=9)
    options = dict(causal=True, scaling_factor=0.5)
    plain = client.compute_loss(**problem, **options)
    scaled = client.compute_loss(**problem, **options, grad_scale=-4.0)
    check(scaled, indexer_kl_reference(**problem, **options, grad_scale=-4.0))
    assert scaled.loss == plain.loss
    np.testing.assert_array_equal(scaled.grad, plain.grad * np.float32(-4.0))


def test_a_message_past_a_size_limit_says_whose_and_how_to_stream():
    # gRPC's own words named neither limit nor what gets past it.
    rng = np.random.default_rng(5)
    scores = rng.standard_normal((1, 256, 1024), dtype=np.float32)  # 1 MiB
    weights = np.abs(scores)
    server = Server("--max_message_bytes=1MiB")
    try:
        with server.client(max_attempts=1) as c:
            with pytest.raises(klserve.KlserveError) as e:
                c.compute_loss(scores, attention_weights=weights)
            assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert e.value.details.endswith(
                "(the server's --max_message_bytes is 1048576 bytes: "
                "stream=True, or a stream_threshold_bytes below it, sends "
                "the tensors in blocks of block_bytes, which must be well "
                "below it too (a projections-form block's answer also "
                "carries the rows of a tile the block before left open); its "
                "header carries key and index_key whole)"), e.value.details
        # ... and the way it names works.
        with server.client(max_attempts=1, block_bytes=256 << 10) as c:
            r = c.compute_loss(scores, attention_weights=weights, stream=True)
            assert np.isfinite(r.loss)
        with server.client(max_attempts=1, max_message_bytes=512 << 10) as c:
            with pytest.raises(klserve.KlserveError) as e:
                c.compute_loss(scores, attention_weights=weights)
            assert ("(this client's max_message_bytes is 524288 bytes: "
                    "stream=True") in e.value.details, e.value.details
    finally:
        assert server.stop() == 0, "".join(server.log)


def test_a_refusal_at_the_limit_of_calls_in_flight_is_retried():
    # A burst of calls from many ranks past --max_open_streams (or
    # --max_concurrent_requests) failed the step; the refused call did not
    # run, so the client retries it as it does UNAVAILABLE.
    rng = np.random.default_rng(6)
    scores = rng.standard_normal((1, 8, 16), dtype=np.float32)
    weights = np.abs(scores)
    server = Server("--max_open_streams=1", "--stream_idle_timeout=2s")
    try:
        with held_stream_slot(server) as holder:
            with server.client(max_attempts=1) as c:
                with pytest.raises(klserve.KlserveError) as e:
                    c.compute_loss(scores, attention_weights=weights,
                                   stream=True)
                assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert e.value.overloaded, e.value
                assert "--max_open_streams" in e.value.details
            with server.client(max_attempts=2) as c:
                with pytest.raises(klserve.KlserveError) as e:
                    c.compute_loss(scores, attention_weights=weights,
                                   stream=True)
                assert e.value.overloaded
                assert "(refused 2 times in " in e.value.details, e.value
                assert "raise max_attempts)" in e.value.details, e.value
            with server.client(max_attempts=10, deadline=0.3) as c:
                with pytest.raises(klserve.KlserveError) as e:
                    c.compute_loss(scores, attention_weights=weights,
                                   stream=True)
                assert "the call's deadline came first)" in e.value.details
            # The idle timeout frees the slot within the retries' 5 to 9 s.
            with server.client(max_attempts=10) as c:
                r = c.compute_loss(scores, attention_weights=weights,
                                   stream=True)
                assert np.isfinite(r.loss)
            with pytest.raises(grpc.RpcError) as held:
                for _ in holder:
                    pass
            assert held.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # A refusal that would fail again is not marked.
        with server.client(max_attempts=1, max_message_bytes=1024) as c:
            with pytest.raises(klserve.KlserveError) as e:
                c.compute_loss(np.zeros((1, 64, 64), np.float32),
                               attention_weights=np.ones((1, 64, 64),
                                                         np.float32),
                               stream=False)
            assert not e.value.overloaded
    finally:
        assert server.stop() == 0, "".join(server.log)
