"""klserve.torch.IndexerKlLoss: backward through the service against
torch autograd of a pure-PyTorch implementation of the same loss."""

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from klserve.torch import IndexerKlLoss, indexer_kl_loss  # noqa: E402
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
