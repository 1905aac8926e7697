"""The projections form (docs/spec.md) and the per-row key bounds through
the NumPy client, against the float64 reference of reference.py: the
reference's own chain rule against finite differences first (no server),
then the service's answers against the reference."""

import grpc
import ml_dtypes
import numpy as np
import pytest

import klserve
from conftest import Server
from reference import (indexer_kl_reference, lse_of, projection_scores,
                       projections_reference, validity)

GRADS = ("d_index_query", "d_index_key", "d_index_weights")


def projections(seed, *, batch=2, rows=8, keys=8, heads=4, kv_heads=4,
                dim=16, index_heads=3, index_dim=8):
    """Float32 projections; index_weights of both signs."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    return dict(
        query=rng.standard_normal((batch, rows, heads, dim)).astype(f32),
        key=rng.standard_normal((batch, keys, kv_heads, dim)).astype(f32),
        index_query=rng.standard_normal(
            (batch, rows, index_heads, index_dim)).astype(f32),
        index_key=rng.standard_normal((batch, keys, index_dim)).astype(f32),
        index_weights=rng.standard_normal(
            (batch, rows, index_heads)).astype(f32))


def assert_close(got, want, rtol=1e-3, atol_scale=1e-4):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    scale = max(np.abs(want).max(), 1e-30)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol_scale * scale)


def assert_matches(result, want, dtype=np.float32, **tolerances):
    assert result.loss == pytest.approx(want["loss"], rel=1e-4, abs=1e-7)
    assert result.denominator == want["denominator"]
    assert result.rows_counted == want["rows_counted"]
    assert result.rows_fully_masked == want["rows_fully_masked"]
    for field in GRADS:
        got = getattr(result, field)
        assert got.dtype == dtype, field
        assert_close(got, want[field], **tolerances)


# -- the reference itself ----------------------------------------------------


@pytest.mark.parametrize("flavor", ["exact", "maxtext"])
@pytest.mark.parametrize("use_relu", [True, False])
@pytest.mark.parametrize("sparse", [False, True])
def test_reference_gradients_are_the_loss_derivatives(flavor, use_relu,
                                                      sparse):
    """Central differences of the reference's loss in float64, away from
    relu's kink, against its hand-derived gradients."""
    p = {k: v.astype(np.float64) for k, v in projections(
        11, batch=1, rows=5, keys=6, heads=4, kv_heads=2, dim=4,
        index_heads=2, index_dim=3).items()}
    options = dict(causal=True, softmax_scale=0.5, use_relu=use_relu,
                   flavor=flavor, scaling_factor=0.7, grad_scale=1.0,
                   index_weight_scale=0.9)
    if sparse:
        options["topk"] = 3
    want = projections_reference(**p, **options)
    step = 1e-6
    for name, field in (("index_query", "d_index_query"),
                        ("index_key", "d_index_key"),
                        ("index_weights", "d_index_weights")):
        numeric = np.zeros_like(p[name])
        for i in np.ndindex(p[name].shape):
            losses = []
            for sign in (1, -1):
                moved = dict(p)
                moved[name] = p[name].copy()
                moved[name][i] += sign * step
                # Keep the selection fixed: the loss is differentiable
                # only for a fixed set of keys.
                fixed = dict(options)
                if sparse:
                    del fixed["topk"]
                    fixed["topk_indices"] = want["topk_indices"]
                losses.append(projections_reference(**moved, **fixed)["loss"])
            numeric[i] = (losses[0] - losses[1]) / (2 * step)
        np.testing.assert_allclose(want[field], numeric, rtol=1e-5,
                                   atol=1e-8)


def test_reference_server_topk_prefers_the_lower_key_on_ties():
    from reference import server_topk
    scores = np.array([[[1.0, 3.0, 3.0, 2.0, 3.0]]])
    valid = np.ones((1, 1, 5), bool)
    np.testing.assert_array_equal(server_topk(scores, valid, 2),
                                  [[[1, 2]]])
    valid[0, 0, 1] = False
    np.testing.assert_array_equal(server_topk(scores, valid, 6),
                                  [[[0, 2, 3, 4, -1, -1]]])


# -- the service against the reference ---------------------------------------


@pytest.mark.parametrize("kv_heads", [4, 1, 2], ids=["mha", "mqa", "gqa"])
@pytest.mark.parametrize("flavor", ["exact", "maxtext"])
def test_matches_reference_attention_kinds(client, kv_heads, flavor):
    p = projections(1, kv_heads=kv_heads)
    options = dict(causal=True, softmax_scale=0.25, flavor=flavor,
                   scaling_factor=0.01, grad_scale=3.0)
    result = client.compute_loss_from_projections(**p, **options)
    assert_matches(result, projections_reference(**p, **options))
    assert result.topk_indices is None and result.grad is None


@pytest.mark.parametrize("reduction", ["mean", "mean_valid", "sum"])
@pytest.mark.parametrize("use_relu", [True, False])
def test_matches_reference_reductions_and_relu(client, reduction, use_relu):
    p = projections(2)
    row_valid = np.ones((2, 8), bool)
    row_valid[1, 2] = False
    options = dict(causal=True, softmax_scale=0.25, reduction=reduction,
                   use_relu=use_relu, index_weight_scale=0.5,
                   row_valid=row_valid)
    result = client.compute_loss_from_projections(**p, **options,
                                                  want_row_kl=True)
    want = projections_reference(**p, **options)
    assert_matches(result, want)
    assert_close(result.row_kl, want["row_kl"])


def test_compute_loss_takes_the_projections_too(client):
    p = projections(3)
    via_compute_loss = client.compute_loss(**p, causal=True)
    via_projections = client.compute_loss_from_projections(**p, causal=True)
    assert via_compute_loss.loss == via_projections.loss
    for field in GRADS:
        np.testing.assert_array_equal(getattr(via_compute_loss, field),
                                      getattr(via_projections, field))


def test_equals_the_logits_form_fed_the_same_scores(client):
    """The invariant of the spec, through the service on both sides: the
    logits form given a and I computed (in float64, then rounded) from the
    same projections gives the same loss."""
    p = projections(4)
    a, scores, _, _ = projection_scores(**p, softmax_scale=0.25)
    logits_form = client.compute_loss(scores.astype(np.float32),
                                      attention_logits=a.astype(np.float32),
                                      causal=True)
    projections_form = client.compute_loss_from_projections(
        **p, causal=True, softmax_scale=0.25)
    assert projections_form.loss == pytest.approx(logits_form.loss,
                                                  rel=1e-4)


def test_lse_given_matches_lse_computed(client):
    p = projections(5, kv_heads=2)
    a, _, _, _ = projection_scores(**p, softmax_scale=0.25)
    valid = validity(2, 8, 8, causal=True)
    options = dict(causal=True, softmax_scale=0.25)
    with_lse = client.compute_loss_from_projections(**p, lse=lse_of(a, valid),
                                                    **options)
    assert_matches(with_lse, projections_reference(**p, **options))


def test_lse_of_another_support_is_refused(client):
    p = projections(5)
    a, _, _, _ = projection_scores(**p)
    # The lse of the full rows, sent for a causal problem: each head's mass
    # on the causal support is below 1.
    lse = lse_of(a, np.ones((2, 8, 8), bool))
    with pytest.raises(klserve.KlserveError) as info:
        client.compute_loss_from_projections(**p, lse=lse, causal=True)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details.startswith("lse")


@pytest.mark.parametrize("q_offset", [None, 0])
def test_causal_with_fewer_queries_than_keys(client, q_offset):
    p = projections(6, rows=5, keys=9)
    options = dict(causal=True, q_offset=q_offset, softmax_scale=0.25)
    assert_matches(client.compute_loss_from_projections(**p, **options),
                   projections_reference(**p, **options))


def test_masks_segments_padding_and_fully_masked_rows(client):
    p = projections(7)
    segments = np.array([[0, 0, 0, 1, 1, 1, 1, 2],
                         [5, 5, 5, 5, 6, 6, 6, 6]], np.int32)
    key_padding = np.ones((2, 8), bool)
    key_padding[1, 4:] = False  # rows 4.. of batch 1 see nothing
    options = dict(causal=True, segment_ids_q=segments,
                   segment_ids_kv=segments, key_padding_mask=key_padding,
                   softmax_scale=0.25)
    result = client.compute_loss_from_projections(**p, **options)
    want = projections_reference(**p, **options)
    assert want["rows_fully_masked"] == 4
    assert_matches(result, want)
    # A fully masked row's indexer inputs get no gradient.
    np.testing.assert_array_equal(result.d_index_query[1, 4:], 0)
    np.testing.assert_array_equal(result.d_index_weights[1, 4:], 0)


def thd_bounds(document_lengths):
    """Key bounds of causal packed documents in one row of B = 1 (THD):
    each query sees its own document's keys up to itself."""
    starts, ends = [], []
    begin = 0
    for length in document_lengths:
        for t in range(length):
            starts.append(begin)
            ends.append(begin + t + 1)
        begin += length
    return (np.array([starts], np.int32), np.array([ends], np.int32))


def test_key_bounds_thd_documents(client):
    p = projections(8, batch=1, rows=10, keys=10)
    key_start, key_end = thd_bounds([3, 5, 2])
    key_end[0, 4] = key_start[0, 4]  # an empty row
    options = dict(key_start=key_start, key_end=key_end, softmax_scale=0.25)
    result = client.compute_loss_from_projections(**p, **options)
    want = projections_reference(**p, **options)
    assert want["rows_fully_masked"] == 1
    assert_matches(result, want)


def test_sparse_with_client_indices(client):
    p = projections(9, keys=10)
    rng = np.random.default_rng(9)
    indices = np.stack([np.stack([rng.permutation(10)[:4]
                                  for _ in range(8)]) for _ in range(2)])
    indices = indices.astype(np.int32)
    indices[0, 3, 2:] = -1
    indices[1, 6, 1:] = (10, -7, 10)  # outside [0, S) too: empty slots
    options = dict(causal=True, topk_indices=indices, num_keys=10,
                   softmax_scale=0.25)
    result = client.compute_loss_from_projections(**p, **options)
    assert_matches(result, projections_reference(**p, **options))
    assert result.topk_indices is None


def test_sparse_with_server_topk(client):
    p = projections(10, keys=12)
    options = dict(causal=True, topk=4, softmax_scale=0.25)
    result = client.compute_loss_from_projections(**p, **options)
    want = projections_reference(**p, **options)
    np.testing.assert_array_equal(result.topk_indices, want["topk_indices"])
    assert result.topk_indices.dtype == np.int32
    assert_matches(result, want)
    # The client's selection of the same keys gives the same answer.
    again = client.compute_loss_from_projections(
        **p, causal=True, topk_indices=result.topk_indices, num_keys=12,
        softmax_scale=0.25)
    assert again.loss == pytest.approx(result.loss, rel=1e-6)
    for field in GRADS:
        assert_close(getattr(again, field), getattr(result, field),
                     rtol=1e-6, atol_scale=1e-6)


@pytest.mark.parametrize("dtype,name", [(ml_dtypes.bfloat16, "bf16"),
                                        (np.float16, "fp16")])
def test_half_inputs_and_gradients(client, dtype, name):
    p = {k: v.astype(dtype) for k, v in projections(12).items()}
    options = dict(causal=True, softmax_scale=0.25)
    result = client.compute_loss_from_projections(**p, **options,
                                                  grad_dtype=name)
    # The reference widens the same half values exactly; the gradient is
    # rounded to the half type once.
    assert_matches(result, projections_reference(**p, **options),
                   dtype=np.dtype(dtype), rtol=2e-2, atol_scale=1e-2)


def test_no_gradient_when_not_wanted(client):
    p = projections(13)
    result = client.compute_loss_from_projections(**p, causal=True,
                                                  want_grad=False)
    assert result.loss > 0
    assert all(getattr(result, field) is None for field in GRADS)


def test_gradients_are_read_only_views(client):
    result = client.compute_loss_from_projections(**projections(14),
                                                  causal=True)
    assert not result.d_index_key.flags.writeable
    writable = result.d_index_key.copy()
    writable[0] = 0


# -- key bounds on the logits forms ------------------------------------------


def logits_problem(seed, batch=1, heads=3, rows=10, keys=10):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch, rows, keys)).astype(np.float32),
            (2 * rng.standard_normal((batch, heads, rows, keys))).astype(
                np.float32))


@pytest.mark.parametrize("stream", [False, True])
def test_key_bounds_on_the_logits_form(client, stream):
    scores, logits = logits_problem(20)
    key_start, key_end = thd_bounds([4, 6])
    key_start[0, 9] = key_end[0, 9] = 0  # no valid key
    result = client.compute_loss(scores, attention_logits=logits,
                                 key_start=key_start, key_end=key_end,
                                 stream=stream, want_row_kl=True)
    want = indexer_kl_reference(scores, attention_logits=logits,
                                key_start=key_start, key_end=key_end)
    assert result.streamed == stream
    assert result.loss == pytest.approx(want["loss"], rel=1e-5)
    assert result.rows_fully_masked == 1
    assert_close(result.grad, want["grad"], rtol=1e-4, atol_scale=1e-6)
    assert_close(result.row_kl, want["row_kl"], rtol=1e-4, atol_scale=1e-6)


def test_key_bounds_on_the_weights_form_streamed_in_blocks(small_server):
    rng = np.random.default_rng(21)
    batch, rows, keys = 2, 64, 300
    scores = rng.standard_normal((batch, rows, keys)).astype(np.float32)
    weights = rng.random((batch, rows, keys)).astype(np.float32)
    key_start = rng.integers(0, 150, (batch, rows)).astype(np.int32)
    key_end = (key_start + rng.integers(0, 150, (batch, rows))).astype(
        np.int32)
    with small_server.client(block_bytes=32 << 10) as c:
        result = c.compute_loss(scores, attention_weights=weights,
                                key_start=key_start, key_end=key_end,
                                reduction="mean_valid", stream=True)
    want = indexer_kl_reference(scores, attention_weights=weights,
                                key_start=key_start, key_end=key_end,
                                reduction="mean_valid")
    assert result.streamed
    assert result.denominator == want["denominator"]
    assert result.loss == pytest.approx(want["loss"], rel=1e-5)
    assert_close(result.grad, want["grad"], rtol=1e-4, atol_scale=1e-6)


def test_key_bounds_out_of_range_are_refused(client):
    scores, logits = logits_problem(22)
    key_start, key_end = thd_bounds([10])
    key_end[0, 6] = 11  # past S
    with pytest.raises(klserve.KlserveError) as info:
        client.compute_loss(scores, attention_logits=logits,
                            key_start=key_start, key_end=key_end)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details.startswith("key_end")


# -- errors ------------------------------------------------------------------


def invalid(call, field):
    """The call's INVALID_ARGUMENT, whose message names `field` first (an
    option's as field or options.field)."""
    with pytest.raises(klserve.KlserveError) as info:
        call()
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT, info.value
    assert info.value.details.startswith(
        (field, "options." + field)), info.value.details
    return info.value.details


def test_mixing_the_forms_names_the_field(client):
    p = projections(30)
    scores = np.zeros((2, 8, 8), np.float32)
    details = invalid(lambda: client.compute_loss(scores, **p),
                      "indexer_scores")
    assert "query" in details
    invalid(lambda: client.compute_loss(
        attention_weights=np.ones((2, 8, 8), np.float32), **p),
        "attention_weights")
    partial = dict(p)
    del partial["index_key"]
    invalid(lambda: client.compute_loss(**partial), "index_key")
    invalid(lambda: client.compute_loss(
        scores, attention_weights=np.ones((2, 8, 8), np.float32), topk=2),
        "options.topk")
    invalid(lambda: client.compute_loss(
        lse=np.zeros((2, 4, 8), np.float32), indexer_scores=scores,
        attention_weights=np.ones((2, 8, 8), np.float32)), "indexer_scores")


def stream_cases():
    """(name, projections, options): dense causal over more rows than a
    dense tile (128), sparse with the client's indices, the service's
    top-k, a given lse, bf16 inputs under MEAN_VALID."""
    rng = np.random.default_rng(41)
    dense = projections(41, batch=2, rows=140, keys=140, heads=2,
                        kv_heads=1, dim=8, index_heads=3, index_dim=4)
    sparse = projections(42, rows=40, keys=48, heads=2, kv_heads=2, dim=4)
    indices = np.stack([np.stack([rng.permutation(48)[:8]
                                  for _ in range(40)]) for _ in range(2)])
    indices = indices.astype(np.int32)
    indices[1, 5, 3:] = -1
    with_lse = projections(43, batch=1, rows=140, keys=100, heads=4,
                           kv_heads=2, dim=8)
    a, _, _, _ = projection_scores(**with_lse, softmax_scale=0.25)
    valid = validity(1, 140, 100, causal=True)
    bf16 = {k: v.astype(ml_dtypes.bfloat16) for k, v in projections(
        44, batch=1, rows=130, keys=130, heads=2, kv_heads=2, dim=8).items()}
    return [
        ("dense_causal", dense, dict(causal=True, softmax_scale=0.35,
                                     want_row_kl=True)),
        ("sparse_client_indices", sparse,
         dict(topk_indices=indices, num_keys=48, reduction="sum",
              scaling_factor=0.5, grad_scale=2.0, want_row_kl=True)),
        ("server_topk", projections(45, batch=1, rows=50, keys=50),
         dict(causal=True, topk=5)),
        ("lse", with_lse, dict(causal=True, softmax_scale=0.25,
                               lse=lse_of(a, valid))),
        ("bf16_mean_valid", bf16, dict(causal=True, flavor="maxtext",
                                       reduction="mean_valid",
                                       grad_dtype="bfloat16")),
    ]


@pytest.mark.parametrize("case", stream_cases(), ids=lambda c: c[0])
def test_the_projections_form_streams_with_the_unary_bits(server, case):
    """Streamed in blocks that end inside the server's tiles, the answer is
    the unary one bit for bit (which matches the reference above)."""
    _, p, options = case
    with server.client() as c:
        unary = c.compute_loss_from_projections(**p, **options, stream=False)
    assert not unary.streamed
    # About 1, 7 and 129 rows of query side a block.
    row_bytes = sum(v[0, 0].nbytes for k, v in p.items()
                    if k in ("query", "index_query", "index_weights"))
    for rows in (1, 7, 129):
        with server.client(block_bytes=rows * row_bytes) as c:
            streamed = c.compute_loss_from_projections(**p, **options,
                                                       stream=True)
        assert streamed.streamed
        for field in ("loss", "unscaled_loss", "denominator",
                      "rows_counted", "rows_fully_masked", "diagnostics"):
            assert getattr(streamed, field) == getattr(unary, field), field
        for field in GRADS + ("topk_indices", "row_kl"):
            want, got = getattr(unary, field), getattr(streamed, field)
            if want is None:
                assert got is None, field
                continue
            assert got.dtype == want.dtype and got.shape == want.shape, field
            assert got.tobytes() == want.tobytes(), (field, rows)


def test_a_projections_problem_past_the_message_limit_streams(small_server):
    """Past the server's 256 KiB message limit, compute_loss streams it on
    its own, and the answer is the reference's."""
    p = projections(46, batch=1, rows=1024, keys=64, heads=4, kv_heads=1,
                    dim=16)
    assert sum(v.nbytes for v in p.values()) > 262144
    options = dict(causal=True, softmax_scale=0.25)
    with small_server.client(stream_threshold_bytes=200000,
                             block_bytes=65536) as c:
        result = c.compute_loss_from_projections(**p, **options)
    assert result.streamed
    assert_matches(result, projections_reference(**p, **options))


def test_the_stream_refuses_mean_valid_that_needs_every_row(server):
    p = projections(47, keys=10)
    indices = np.zeros((2, 8, 2), np.int32)
    indices[..., 1] = 1
    with server.client() as c:
        invalid(lambda: c.compute_loss_from_projections(
            **p, topk_indices=indices, num_keys=10, reduction="mean_valid",
            stream=True), "reduction")


def test_past_the_threshold_what_the_stream_cannot_carry_goes_unary(
        small_server):
    """The size rule sends mean_valid with an attention_mask and no row_valid
    as one message past stream_threshold_bytes (a stream would be refused),
    with the reference's answer; with row_valid it streams."""
    p = projections(48, batch=1, rows=64, keys=32, heads=2, kv_heads=1,
                    dim=8)
    mask = np.random.default_rng(48).random((1, 64, 32)) < 0.5
    mask[0, 3] = False  # a row with no valid key: N counts it out
    options = dict(causal=True, attention_mask=mask, reduction="mean_valid")
    with small_server.client(stream_threshold_bytes=1024) as c:
        result = c.compute_loss_from_projections(**p, **options)
        assert not result.streamed
        assert_matches(result, projections_reference(**p, **options))
        streamed = c.compute_loss_from_projections(
            **p, **options, row_valid=np.ones((1, 64), bool))
        assert streamed.streamed


def bad_key_heads(p):
    return dict(p, key=p["key"][:, :, :3])  # H = 4 not divisible by 3


def bad_index_dim(p):
    return dict(p, index_key=p["index_key"][:, :, :5])  # D_I disagrees


def nan_index_query(p):
    index_query = p["index_query"].copy()
    index_query[1, 2, 0, 3] = np.nan
    return dict(p, index_query=index_query)


def topk_with_indices(p):
    indices = np.zeros((2, 8, 2), np.int32)
    indices[..., 1] = 1
    return dict(p, topk=2, topk_indices=indices, num_keys=8)


@pytest.mark.parametrize("make,field", [
    (bad_key_heads, "key"), (bad_index_dim, "index_key"),
    (nan_index_query, "index_query"), (topk_with_indices, "topk"),
    (lambda p: dict(p, topk=-1), "topk"),
    (lambda p: dict(p, index_weight_scale=float("inf")),
     "index_weight_scale")])
def test_the_server_validates_the_projections(client, make, field):
    request = make(projections(32))
    invalid(lambda: client.compute_loss_from_projections(**request), field)


def cpu_flags():
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def start_log(launcher):
    """The lines a server started through launcher logs until it serves; it
    must then stop cleanly."""
    srv = Server(launcher=launcher)
    assert srv.stop() == 0, "".join(srv.log)
    return srv.log


@pytest.mark.skipif(not {"avx2", "fma", "f16c"} <= cpu_flags(),
                    reason="this CPU has no AVX2: OpenBLAS picks its kernels")
def test_openblas_runs_its_haswell_kernels_on_a_cpu_with_avx2():
    """Whatever kernels OpenBLAS would pick here (Cooperlake on an AVX-512
    CPU), klserve pins the ones every AVX2 CPU runs, so that replicas on
    different CPUs agree (docs/blas.md); an empty OPENBLAS_CORETYPE, which
    OpenBLAS ignores, does not undo it."""
    for launcher in (("env", "-u", "OPENBLAS_CORETYPE"),
                     ("env", "OPENBLAS_CORETYPE=")):
        log = start_log(launcher)
        assert ("klserve: projections form: OpenBLAS, Haswell kernels\n"
                in log), "".join(log)


def test_an_operators_openblas_coretype_is_kept():
    """klserve pins OpenBLAS's Haswell kernels on CPUs with AVX2 so that
    replicas agree (docs/blas.md), unless the environment names others."""
    log = start_log(("env", "OPENBLAS_CORETYPE=Nehalem"))
    assert ("klserve: projections form: OpenBLAS, Nehalem kernels\n"
            in log), "".join(log)


def test_an_openblas_coretype_it_does_not_know_is_named_in_the_log():
    """OpenBLAS takes an unknown name as none and picks by CPU: the log says
    so, rather than leaving an operator to believe the pin holds."""
    log = start_log(("env", "OPENBLAS_CORETYPE=Haswel"))
    assert any('kernels, not the OPENBLAS_CORETYPE="Haswel" asked for'
               in line for line in log), "".join(log)


def test_openblas_kernels_the_cpu_cannot_run_are_refused_not_run():
    """OpenBLAS runs the kernels OPENBLAS_CORETYPE names without asking the
    CPU. Its Opteron kernels use 3DNow!, which no x86-64-v2 CPU has: run,
    they would end the server with SIGILL at its first projections-form
    call. The server refuses that form, saying why, and serves the rest.
    (tests/python/test_emulated_cpus.py does the same for AVX2 and AVX-512
    kernels on older emulated CPUs.)"""
    srv = Server(launcher=("env", "OPENBLAS_CORETYPE=Opteron"))
    try:
        with srv.client() as client:
            with pytest.raises(grpc.RpcError) as refused:
                client.compute_loss_from_projections(**projections(3))
            assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert ("its Opteron kernels (OPENBLAS_CORETYPE=Opteron), which "
                    "need 3DNow! that this CPU lacks") in refused.value.details
            rng = np.random.default_rng(4)
            served = client.compute_loss(
                indexer_scores=rng.standard_normal((1, 3, 5)).astype(
                    np.float32),
                attention_weights=np.full((1, 3, 5), 0.2, np.float32))
            assert served.loss >= 0
    finally:
        assert srv.stop() == 0, "".join(srv.log)
