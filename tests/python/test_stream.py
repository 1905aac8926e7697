"""ComputeLossStream: problems over the unary message limit of a server
started with a small --max_message_bytes (256 KiB)."""

import grpc
import ml_dtypes
import numpy as np
import pytest

import klserve
from klserve._stream import (RequestSlicer, ResponseAssembler,
                             needs_counting_pass)
from klserve._tensor_table import TENSORS
from klserve.v1 import klserve_pb2 as pb2
from reference import indexer_kl_reference
from test_client import check
from test_projections import projections

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


def test_streamed_mean_valid_without_row_valid_counts_first(
        small_server, client):
    """N is known only after every row: the stream counts in a first pass
    (RowBlock.counting) and still answers as unary does, bit for bit."""
    rng = np.random.default_rng(5)
    batch, rows, keys = 2, 40, 256
    weights = rng.random((batch, rows, keys)).astype(np.float32)
    weights[1, 10] = 0  # a zero target
    key_padding = np.ones((batch, keys), bool)
    key_padding[0, :3] = False  # with q_offset 0: rows 0-2 see no key
    problem = dict(
        indexer_scores=rng.standard_normal((batch, rows, keys)).astype(
            np.float32),
        attention_weights=weights, key_padding_mask=key_padding)
    kwargs = dict(causal=True, q_offset=0, reduction="mean_valid",
                  scaling_factor=0.5)
    ref = indexer_kl_reference(**problem, **kwargs)
    assert ref["denominator"] == batch * rows - 4  # N is not B * T
    # A row is 2 KiB (scores and weights, 256 keys of fp32): blocks of 7
    # rows, crossing the batch entries' boundary (T = 40).
    with small_server.client(block_bytes=7 * 2048) as c:
        r = c.compute_loss(**problem, **kwargs, stream=True,
                           want_row_kl=True)
    assert r.streamed
    check(r, ref)
    unary = client.compute_loss(**problem, **kwargs, want_row_kl=True)
    assert unary.streamed is False
    assert r.loss == unary.loss
    assert r.denominator == unary.denominator
    np.testing.assert_array_equal(r.grad.view(np.uint32),
                                  unary.grad.view(np.uint32))
    np.testing.assert_array_equal(r.row_kl, unary.row_kl)


def sent_blocks(problem, reduction, block_rows):
    """The RowBlocks the client would send for `problem` (no server)."""
    tensors = {t.name: t.convert(t.name, problem[t.name]) for t in TENSORS
               if t.name in problem}
    options = pb2.LossOptions(reduction=reduction)
    slicer = RequestSlicer(tensors)
    return list(slicer.blocks(pb2, block_rows,
                              needs_counting_pass(pb2, options, tensors)))


def test_counting_pass_sends_every_row_twice_counting_first():
    problem = big_problem(6, batch=2, rows=5, keys=8)
    blocks = sent_blocks(problem, pb2.REDUCTION_MEAN_VALID, block_rows=4)
    # 10 rows in blocks of 4: [0, 4) [4, 8) [8, 10), counted, then computed.
    assert [(b.counting, b.row_begin, b.num_rows) for b in blocks] == [
        (True, 0, 4), (True, 4, 4), (True, 8, 2),
        (False, 0, 4), (False, 4, 4), (False, 8, 2)]
    scores = problem["indexer_scores"].reshape(10, 8)
    for b in blocks:
        rows = scores[b.row_begin:b.row_begin + b.num_rows]
        assert b.indexer_scores == rows.tobytes()


def test_one_pass_unless_mean_valid_without_row_valid():
    problem = big_problem(7, batch=2, rows=5, keys=8)
    for reduction in (pb2.REDUCTION_MEAN, pb2.REDUCTION_SUM):
        blocks = sent_blocks(problem, reduction, block_rows=4)
        assert [(b.counting, b.row_begin) for b in blocks] == [
            (False, 0), (False, 4), (False, 8)]
    problem["row_valid"] = np.ones((2, 5), bool)
    blocks = sent_blocks(problem, pb2.REDUCTION_MEAN_VALID, block_rows=4)
    assert [b.counting for b in blocks] == [False] * 3


def grad_block(row_begin, num_rows, grad=None):
    block = pb2.GradBlock(row_begin=row_begin, num_rows=num_rows)
    if grad is not None:
        block.grad.CopyFrom(pb2.Tensor(dtype="FP32", shape=list(grad.shape),
                                       data=grad.tobytes()))
    return block


def test_counting_pass_answers_are_read_and_discarded():
    grad = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    assembler = ResponseAssembler(grad.shape, counting_pass=True)
    assembler.add(grad_block(0, 4))
    assembler.add(grad_block(4, 2))
    flat = grad.reshape(6, 4)
    assembler.add(grad_block(0, 5, flat[:5]))
    assembler.add(grad_block(5, 1, flat[5:]))
    got, row_kl = assembler.finish()
    assert row_kl is None
    np.testing.assert_array_equal(got, grad)


def test_counting_pass_answer_with_a_gradient_breaks_the_protocol():
    assembler = ResponseAssembler((1, 2, 3), counting_pass=True)
    with pytest.raises(klserve.KlserveError) as info:
        assembler.add(grad_block(0, 2, np.zeros((2, 3), np.float32)))
    assert info.value.code == grpc.StatusCode.INTERNAL
    assert "counting pass" in info.value.details
    assembler = ResponseAssembler((1, 2, 3), counting_pass=True)
    assembler.add(grad_block(0, 1))
    with pytest.raises(klserve.KlserveError) as info:
        assembler.finish()  # the result before the second pass
    assert info.value.code == grpc.StatusCode.INTERNAL


def test_blocks_are_sized_by_their_answers_too(small_server, client):
    """A top-k selection of 1024 slots answers 4 KiB a row, thirty times a
    row's projections: the client sizes blocks by the larger, so each
    GradBlock fits the 256 KiB message limit where one block of all the
    rows answered 512 KiB (an ML-engineer helper's finding). The bits are
    the unary call's."""
    p = projections(11, batch=2, rows=64, keys=64, heads=2, kv_heads=1,
                    dim=8, index_heads=2, index_dim=8)
    with small_server.client(block_bytes=65536) as c:
        with pytest.raises(klserve.KlserveError) as unary:
            c.compute_loss_from_projections(**p, topk=1024, stream=False)
        assert unary.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert unary.value.details.startswith("topk_indices")
        streamed = c.compute_loss_from_projections(**p, topk=1024,
                                                   stream=True)
    assert streamed.streamed
    want = client.compute_loss_from_projections(**p, topk=1024)
    assert streamed.loss == want.loss
    for field in ("d_index_query", "d_index_key", "d_index_weights",
                  "topk_indices"):
        assert (getattr(streamed, field).tobytes() ==
                getattr(want, field).tobytes()), field
