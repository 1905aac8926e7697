"""ComputeLossStream: problems over the unary message limit of a server
started with a small --max_message_bytes (256 KiB)."""

import grpc
import ml_dtypes
import numpy as np
import pytest

import klserve
from reference import indexer_kl_reference
from test_client import check

LIMIT = 256 << 10


def big_problem(seed, batch=2, heads=4, rows=40, keys=256):
    rng = np.random.default_rng(seed)
    return dict(
        indexer_scores=rng.standard_normal((batch, rows, keys)).astype(
            np.float32),
        attention_logits=(2 * rng.standard_normal(
            (batch, heads, rows, keys))).astype(np.float32))


def tensor_bytes(problem):
    return sum(np.asarray(v).nbytes for v in problem.values())


def test_unary_over_the_limit_is_refused(small_server):
    problem = big_problem(1)
    assert tensor_bytes(problem) > LIMIT
    with small_server.client() as c:
        with pytest.raises(klserve.KlserveError) as info:
            c.compute_loss(**problem, stream=False)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_automatic_streaming_matches_reference_and_unary(small_server,
                                                         client):
    problem = big_problem(2)
    row_valid = np.ones(problem["indexer_scores"].shape[:2], bool)
    row_valid[0, 5] = row_valid[1, 39] = False
    kwargs = dict(causal=True, scaling_factor=0.01, reduction="mean_valid",
                  row_valid=row_valid, softmax_scale=0.5)
    # A row is 5 KiB (4 heads' logits and the scores, 256 keys of fp32);
    # blocks of 7 rows cross the batch entries' boundaries (T = 40).
    with small_server.client(stream_threshold_bytes=LIMIT,
                             block_bytes=7 * 5120) as c:
        r = c.compute_loss(**problem, **kwargs, want_row_kl=True,
                           want_diagnostics=True, recall_k=8)
    assert r.streamed is True
    ref = indexer_kl_reference(**problem, **kwargs, recall_k=8)
    check(r, ref)
    unary = client.compute_loss(**problem, **kwargs, want_row_kl=True,
                                want_diagnostics=True, recall_k=8)
    assert unary.streamed is False
    assert r.loss == unary.loss
    np.testing.assert_array_equal(r.grad, unary.grad)
    np.testing.assert_array_equal(r.row_kl, unary.row_kl)
    assert r.diagnostics == unary.diagnostics


def test_streamed_sparse_with_mask_and_bf16(small_server):
    rng = np.random.default_rng(3)
    batch, heads, rows, keys, k = 3, 2, 30, 200, 64
    topk = np.stack([np.stack([rng.permutation(keys)[:k] for _ in range(rows)])
                     for _ in range(batch)]).astype(np.int32)
    topk[1, 3, 10:] = -1
    mask = rng.random((batch, rows, keys)) > 0.1
    problem = dict(
        indexer_scores=rng.standard_normal((batch, rows, k)).astype(
            ml_dtypes.bfloat16),
        attention_logits=rng.standard_normal(
            (batch, heads, rows, k)).astype(ml_dtypes.bfloat16),
        topk_indices=topk, attention_mask=mask)
    kwargs = dict(num_keys=keys, causal=True, flavor="maxtext")
    with small_server.client(block_bytes=10_000) as c:
        r = c.compute_loss(**problem, **kwargs, stream=True,
                           want_row_kl=True)
    assert r.streamed
    ref = indexer_kl_reference(**problem, **kwargs)
    check(r, ref)


def test_streamed_error_names_the_field(small_server):
    problem = big_problem(4)
    problem["indexer_scores"][1, 30, 7] = np.inf
    with small_server.client(block_bytes=20_000) as c:
        with pytest.raises(klserve.KlserveError) as info:
            c.compute_loss(**problem, stream=True)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details.startswith("indexer_scores")
