"""klserve.torch.IndexerKlLoss and IndexerKlLossFromProjections: backward
through the service against torch autograd of a pure-PyTorch
implementation of the same loss."""

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import klserve  # noqa: E402
from klserve.torch import (IndexerKlLoss, indexer_kl_loss,  # noqa: E402
                           indexer_kl_loss_from_projections)
from reference import validity  # noqa: E402


def torch_indexer_kl(scores, logits, valid, scaling_factor):
    """EXACT flavour, per-head logits, MEAN reduction."""
    batch, rows, _ = scores.shape
    valid = torch.as_tensor(valid)
    with torch.no_grad():
        a = logits.masked_fill(~valid[:, None], float("-inf"))
        p = torch.softmax(a, dim=-1).nan_to_num(0.0).mean(1)
    logq = torch.log_softmax(scores.masked_fill(~valid, float("-inf")), -1)
    safe_p = torch.where(p > 0, p, torch.ones_like(p))
    kl = torch.where(valid & (p > 0), p * (safe_p.log() - logq),
                     torch.zeros_like(p)).sum(-1)
    return scaling_factor * kl.sum() / (batch * rows)


def problem(seed, batch=2, heads=3, rows=7, keys=7):
    rng = np.random.default_rng(seed)
    return (torch.tensor(rng.standard_normal((batch, rows, keys)),
                         dtype=torch.float32),
            torch.tensor(2 * rng.standard_normal((batch, heads, rows, keys)),
                         dtype=torch.float32))


def test_backward_matches_pure_torch(client):
    scores, logits = problem(1)
    valid = validity(2, 7, 7, causal=True)
    s1 = scores.clone().requires_grad_()
    loss = indexer_kl_loss(s1, attention_logits=logits, causal=True,
                           scaling_factor=0.01, client=client)
    (2.5 * loss + (s1 ** 2).sum()).backward()
    s2 = scores.clone().requires_grad_()
    want = torch_indexer_kl(s2, logits, valid, 0.01)
    (2.5 * want + (s2 ** 2).sum()).backward()
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    scale = s2.grad.abs().max().item()
    torch.testing.assert_close(s1.grad, s2.grad, rtol=1e-4,
                               atol=2e-6 * scale)


def test_a_second_derivative_is_refused_not_left_incomplete(client):
    # The service returns the gradient, not its derivative. When the
    # gradient flowing into the loss itself depends on a parameter (here w),
    # a double backward would differentiate only through w and miss the
    # scores' part: it must fail by name instead.
    scores, logits = problem(2)
    scores.requires_grad_()
    w = torch.tensor(1.5, requires_grad=True)
    loss = indexer_kl_loss(scores, attention_logits=logits, client=client)
    (grad,) = torch.autograd.grad(w * loss, scores, create_graph=True)
    with pytest.raises(RuntimeError, match="not its derivatives"):
        grad.square().sum().backward()


def test_a_gradient_penalty_through_the_loss_is_refused_not_dropped(client):
    # A gradient penalty: dL/ds taken with create_graph=True, then a term
    # built on it differentiated into the parameters that made s. The
    # incoming gradient (1) needs none, so torch's once_differentiable
    # returned dL/ds as a constant, and the penalty silently added nothing
    # to W's gradient.
    rng = np.random.default_rng(5)
    W = torch.tensor(rng.standard_normal((8, 7)), dtype=torch.float32,
                     requires_grad=True)
    x = torch.tensor(rng.standard_normal((2, 7, 8)), dtype=torch.float32)
    _, logits = problem(5)
    loss = indexer_kl_loss(x @ W, attention_logits=logits, client=client)
    (grad,) = torch.autograd.grad(loss, W, create_graph=True)
    assert grad.requires_grad
    with pytest.raises(RuntimeError, match="not its derivatives"):
        torch.autograd.grad(grad.square().sum(), W)
    scores = x @ W
    loss = indexer_kl_loss(scores, attention_logits=logits, client=client)
    (d_scores,) = torch.autograd.grad(loss, scores, create_graph=True)
    with pytest.raises(RuntimeError, match="not its derivatives"):
        (loss + d_scores.square().sum()).backward()
    query, key, *indexer = projections_problem(6)
    indexer = [t.requires_grad_() for t in indexer]
    loss = indexer_kl_loss_from_projections(query, key, *indexer,
                                            causal=True, client=client)
    grads = torch.autograd.grad(loss, indexer[1:], create_graph=True)
    with pytest.raises(RuntimeError, match="not its derivatives"):
        sum(g.square().sum() for g in grads).backward()


def test_create_graph_alone_gives_the_first_derivative(client):
    # A graph of the backward is no error until something differentiates
    # the loss's gradient: the first derivative is the one without it.
    scores, logits = problem(7)
    got = []
    for create_graph in (False, True):
        s = scores.clone().requires_grad_()
        loss = indexer_kl_loss(s, attention_logits=logits, client=client)
        (grad,) = torch.autograd.grad(loss, s, create_graph=create_graph)
        got.append(grad.detach())
    assert torch.equal(got[0], got[1])


def test_scores_as_a_list_or_an_array_give_the_tensors_loss(client):
    # The client takes anything np.asarray takes; so do the wrappers, whose
    # loss then needs no gradient and lands on the CPU.
    scores, logits = problem(8)
    want = indexer_kl_loss(scores, attention_logits=logits, client=client)
    for given in (scores.tolist(), scores.numpy()):
        got = indexer_kl_loss(given, attention_logits=logits.tolist(),
                              client=client)
        assert got.dtype == torch.float32 and not got.requires_grad
        assert got.item() == want.item()
    query, key, *indexer = projections_problem(8)
    want = indexer_kl_loss_from_projections(query, key, *indexer,
                                            client=client)
    got = indexer_kl_loss_from_projections(
        query.tolist(), key.numpy(), *(t.tolist() for t in indexer),
        client=client)
    assert got.item() == want.item()


def test_fp16_scores_keep_a_loss_scaled_gradient(client):
    # fp16 training scales the loss (a GradScaler's 2^16) so that small
    # gradients survive fp16: backward multiplies before it rounds to fp16,
    # and an explicit grad_dtype is kept until then.
    rng = np.random.default_rng(9)
    scores = torch.tensor(rng.standard_normal((1, 2048, 64)),
                          dtype=torch.float16)
    logits = torch.tensor(rng.standard_normal((1, 1, 2048, 64)),
                          dtype=torch.float32)
    loss_scale = 65536.0
    want = loss_scale * client.compute_loss(
        scores.numpy(), attention_logits=logits.numpy(), scaling_factor=0.01,
        grad_dtype="fp32").grad.astype(np.float64)
    want16 = torch.from_numpy(want.astype(np.float32)).half()
    for options in ({}, {"grad_dtype": "fp32"}):
        s = scores.clone().requires_grad_()
        loss = indexer_kl_loss(s, attention_logits=logits, scaling_factor=0.01,
                               client=client, **options)
        (loss_scale * loss).backward()
        assert s.grad.dtype == torch.float16
        torch.testing.assert_close(s.grad, want16, rtol=0, atol=0)


def test_torch_compile_runs_the_call_outside_the_graph(client):
    scores, logits = problem(3)

    @torch.compile(backend="eager")
    def step(s):
        return 2.0 * indexer_kl_loss(s, attention_logits=logits, causal=True,
                                     client=client)

    s = scores.clone().requires_grad_()
    step(s).backward()
    direct = client.compute_loss(scores.numpy(),
                                 attention_logits=logits.numpy(), causal=True)
    torch.testing.assert_close(s.grad, torch.from_numpy(2.0 * direct.grad),
                               rtol=0, atol=0)


def test_bf16_and_no_grad(client):
    scores, logits = problem(2)
    s = scores.bfloat16().requires_grad_()
    loss = IndexerKlLoss.apply(s, {"attention_logits": logits.bfloat16()},
                               client, {"causal": True})
    loss.backward()
    assert s.grad.dtype == torch.bfloat16
    # The same bf16 values straight through the client.
    direct = client.compute_loss(
        s.detach().float().numpy().astype(ml_dtypes.bfloat16),
        attention_logits=logits.bfloat16().float().numpy().astype(
            ml_dtypes.bfloat16),
        causal=True, grad_dtype="bf16")
    np.testing.assert_array_equal(s.grad.view(torch.int16).numpy(),
                                  direct.grad.view(np.int16))
    with torch.no_grad():
        plain = indexer_kl_loss(scores, attention_logits=logits, causal=True,
                                client=client)
    assert plain.requires_grad is False
    assert plain.item() > 0


def torch_projections_kl(query, key, index_query, index_key, index_weights,
                         valid, softmax_scale, index_weight_scale,
                         scaling_factor):
    """The projections form materialised: per-head main logits (GQA: head
    h reads key head h // group), indexer scores sum_j w_eff *
    relu(q_I . k_I), then torch_indexer_kl (EXACT, MEAN)."""
    group = query.shape[2] // key.shape[2]
    logits = softmax_scale * torch.einsum(
        "bthd,bshd->bhts", query, key.repeat_interleave(group, dim=2))
    dots = torch.relu(torch.einsum("btjd,bsd->btjs", index_query, index_key))
    scores = torch.einsum("btj,btjs->bts", index_weight_scale * index_weights,
                          dots)
    return torch_indexer_kl(scores, logits, valid, scaling_factor)


def projections_problem(seed, batch=2, rows=7, keys=7, heads=4, kv_heads=1,
                        dim=16, index_heads=3, index_dim=8):
    rng = np.random.default_rng(seed)
    shapes = ((batch, rows, heads, dim), (batch, keys, kv_heads, dim),
              (batch, rows, index_heads, index_dim),
              (batch, keys, index_dim), (batch, rows, index_heads))
    return [torch.tensor(rng.standard_normal(shape), dtype=torch.float32)
            for shape in shapes]


def test_projections_backward_matches_pure_torch(client):
    query, key, *indexer = projections_problem(3)
    valid = validity(2, 7, 7, causal=True)
    mine = [x.clone().requires_grad_() for x in indexer]
    loss = indexer_kl_loss_from_projections(
        query, key, *mine, causal=True, softmax_scale=0.25,
        scaling_factor=0.01, client=client)
    (2.5 * loss + (mine[0] ** 2).sum()).backward()
    theirs = [x.clone().requires_grad_() for x in indexer]
    want = torch_projections_kl(query, key, *theirs, valid, 0.25,
                                (3 * 8) ** -0.5, 0.01)
    (2.5 * want + (theirs[0] ** 2).sum()).backward()
    assert loss.item() == pytest.approx(want.item(), rel=1e-4)
    for got, expected in zip(mine, theirs):
        scale = expected.grad.abs().max().item()
        torch.testing.assert_close(got.grad, expected.grad, rtol=1e-3,
                                   atol=1e-4 * scale)


def test_projections_gradient_only_where_required(client):
    query, key, iq, ik, iw = projections_problem(4)
    query.requires_grad_()
    ik.requires_grad_()
    loss = indexer_kl_loss_from_projections(query, key, iq, ik, iw,
                                            causal=True, client=client)
    loss.backward()
    assert query.grad is None  # the main attention gets no gradient
    assert ik.grad is not None and ik.grad.abs().max().item() > 0
    with torch.no_grad():
        plain = indexer_kl_loss_from_projections(query, key, iq, ik, iw,
                                                 causal=True, client=client)
    assert not plain.requires_grad
    assert plain.item() == pytest.approx(loss.item(), rel=1e-6)


class RecordingClient(klserve.Client):
    """The real client, recording what each loss call asked for."""

    def __init__(self, target):
        super().__init__(target)
        self.asked = []

    def compute_loss(self, indexer_scores=None, **arguments):
        self.asked.append(arguments)
        return super().compute_loss(indexer_scores, **arguments)


def test_projections_with_only_the_main_attention_requiring_grad(server):
    # A frozen indexer beside a main attention in training: the loss has a
    # grad_fn (query and key require grad), the service is asked for no
    # gradient, and backward gives query and key none.
    query, key, *indexer = projections_problem(5)
    query.requires_grad_()
    key.requires_grad_()
    with RecordingClient(server.target) as recording:
        loss = indexer_kl_loss_from_projections(query, key, *indexer,
                                                causal=True, client=recording)
    assert loss.grad_fn is not None
    assert [a["want_grad"] for a in recording.asked] == [False]
    (loss + (query ** 2).sum()).backward()
    torch.testing.assert_close(query.grad, 2 * query.detach())
    assert key.grad is None


def test_under_no_grad_the_service_is_asked_for_no_gradient(server):
    scores, logits = problem(6)
    scores.requires_grad_()
    recording = RecordingClient(server.target)
    with recording, torch.no_grad():
        indexer_kl_loss(scores, attention_logits=logits, client=recording)
        query, key, *indexer = projections_problem(6)
        indexer_kl_loss_from_projections(
            query, key, *(x.requires_grad_() for x in indexer),
            client=recording)
    assert [a["want_grad"] for a in recording.asked] == [False, False]


def test_the_kept_loss_keeps_no_gradient_after_backward(client):
    scores, logits = problem(7)
    scores.requires_grad_()
    loss = indexer_kl_loss(scores, attention_logits=logits, client=client)
    assert loss.grad_fn.result.grad is None  # the saved tensor has it
    assert loss.grad_fn.result.loss == pytest.approx(loss.item())
    loss.backward()
    with pytest.raises(RuntimeError, match="freed"):
        loss.backward()  # autograd freed the saved gradient


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16,
                                   torch.float16])
def test_torch_dtypes_and_tensors_straight_into_the_client(client, dtype):
    scores, logits = problem(8)
    s = scores.to(dtype).requires_grad_()  # a tensor needing grad, too
    through_torch = client.compute_loss(s, attention_logits=logits.to(dtype),
                                        grad_dtype=dtype)
    to_numpy = {torch.float32: lambda x: x.numpy(),
                torch.float16: lambda x: x.numpy(),
                torch.bfloat16: lambda x: x.view(torch.int16).numpy().view(
                    ml_dtypes.bfloat16)}[dtype]
    through_numpy = client.compute_loss(
        to_numpy(s.detach()), attention_logits=to_numpy(logits.to(dtype)),
        grad_dtype={torch.float32: "fp32", torch.bfloat16: "bf16",
                    torch.float16: "fp16"}[dtype])
    assert through_torch.loss == through_numpy.loss
    assert through_torch.grad.dtype == through_numpy.grad.dtype
    np.testing.assert_array_equal(through_torch.grad.view(np.uint8),
                                  through_numpy.grad.view(np.uint8))
    loss = indexer_kl_loss(s, attention_logits=logits.to(dtype),
                           grad_dtype=torch.float32, client=client)
    loss.backward()
    assert s.grad.dtype == dtype


def test_a_meta_tensor_is_refused_by_name(client):
    scores, logits = problem(9)
    with pytest.raises(klserve.KlserveError,
                       match="attention_logits: a tensor on the 'meta'"):
        client.compute_loss(scores, attention_logits=logits.to("meta"))
