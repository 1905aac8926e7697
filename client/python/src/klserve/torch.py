"""The service as a torch.autograd.Function.

    from klserve.torch import indexer_kl_loss

    loss = indexer_kl_loss(scores, attention_logits=logits, causal=True,
                           scaling_factor=0.01, run="exp1", step=step)
    loss.backward()      # scores.grad = the service's dL/d indexer_scores

IndexerKlLoss.forward sends the tensors (detached, copied to host memory)
to the service, asking for the gradient with respect to indexer_scores when
they require one, and keeps it; backward multiplies it by the incoming
gradient. Only indexer_scores is differentiable: the target and the masks
get no gradient, as in the spec, where no gradient flows into p.
"""

from typing import Any, Mapping, Optional

import ml_dtypes
import numpy as np
import torch

from klserve._client import Client, default_client
from klserve._signature import (DECIDED_BY_WRAPPERS, split_arguments,
                                wrapper_signature)
from klserve._tensors import grad_wire_name

_TORCH_GRAD_NAMES = {torch.float32: "FP32", torch.bfloat16: "BF16",
                     torch.float16: "FP16", torch.float64: "FP32"}


def to_numpy(value: Any) -> np.ndarray:
    """A tensor (any device) or array-like as a NumPy array; bfloat16
    becomes ml_dtypes.bfloat16."""
    if not isinstance(value, torch.Tensor):
        return np.asarray(value)
    tensor = value.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    tensor = tensor.contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def from_numpy(array: np.ndarray, dtype: torch.dtype,
               device: torch.device) -> torch.Tensor:
    """A NumPy array (ml_dtypes.bfloat16 included) as a tensor."""
    if array.dtype == np.dtype(ml_dtypes.bfloat16):
        tensor = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(array)
    return tensor.to(device=device, dtype=dtype)


class IndexerKlLoss(torch.autograd.Function):
    """IndexerKlLoss.apply(indexer_scores, inputs, client, options) -> loss.

    `inputs`: dict of the other tensors (attention_logits or
    attention_weights, topk_indices, segment ids, masks) as tensors or
    arrays; `client`: a klserve.Client (None: klserve.default_client());
    `options`: dict of fields of klserve.ComputeLossOptions but want_grad,
    want_row_kl, want_diagnostics and recall_k, which are decided here
    (grad_dtype defaults to the scores' dtype). The loss is a 0-d float32
    tensor (float64 for float64 scores) on the scores' device.
    """

    @staticmethod
    def forward(ctx: Any, indexer_scores: torch.Tensor,
                inputs: Optional[Mapping[str, Any]], client: Optional[Client],
                options: Optional[Mapping[str, Any]]) -> torch.Tensor:
        arrays, options = split_arguments(
            "IndexerKlLoss", {**(inputs or {}), **(options or {})},
            DECIDED_BY_WRAPPERS)
        if client is None:
            client = default_client()
        want_grad = bool(ctx.needs_input_grad[0])
        grad_name = options.pop("grad_dtype", None)
        grad_name = grad_wire_name(
            grad_name if grad_name is not None
            else _TORCH_GRAD_NAMES.get(indexer_scores.dtype, "FP32"))
        result = client.compute_loss(
            to_numpy(indexer_scores),
            **{k: to_numpy(v) for k, v in arrays.items()},
            grad_dtype=grad_name, want_grad=want_grad, **options)
        loss_dtype = (torch.float64 if indexer_scores.dtype == torch.float64
                      else torch.float32)
        if want_grad:
            ctx.save_for_backward(from_numpy(
                result.grad, indexer_scores.dtype, indexer_scores.device))
        ctx.result = result  # loss, N, diagnostics for the curious
        return torch.tensor(result.loss, dtype=loss_dtype,
                            device=indexer_scores.device)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        (grad,) = ctx.saved_tensors
        d_scores = (grad.float() * grad_output.float()).to(grad.dtype)
        return d_scores, None, None, None


def indexer_kl_loss(indexer_scores: torch.Tensor, *,
                    client: Optional[Client] = None,
                    **arguments: Any) -> torch.Tensor:
    """IndexerKlLoss with keyword arguments: as in
    klserve.Client.compute_loss (the tensors and the fields of
    klserve.ComputeLossOptions), except want_grad, want_row_kl,
    want_diagnostics and recall_k, which are decided here. Without
    `client`, klserve.default_client() ($KLSERVE_TARGET, else
    localhost:50051)."""
    if client is None:
        client = default_client()
    arrays, options = split_arguments("indexer_kl_loss", arguments,
                                      DECIDED_BY_WRAPPERS)
    return IndexerKlLoss.apply(indexer_scores, arrays, client, options)


indexer_kl_loss.__signature__ = wrapper_signature(  # type: ignore
    torch.Tensor, torch.Tensor)


__all__ = ["IndexerKlLoss", "indexer_kl_loss", "to_numpy", "from_numpy"]
