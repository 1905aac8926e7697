"""The service as a torch.autograd.Function.

    from klserve.torch import indexer_kl_loss

    # causal: q_offset defaults to S - T; MaxText and Megatron want 0.
    loss = indexer_kl_loss(scores, attention_logits=logits, causal=True,
                           scaling_factor=0.01, run="exp1", step=step)
    loss.backward()      # scores.grad = the service's dL/d indexer_scores

IndexerKlLoss.forward sends the tensors (detached, copied to host memory)
to the service, asking for the gradient with respect to indexer_scores when
they require one (and, through indexer_kl_loss, grad mode is on), and keeps
it; backward multiplies it by the incoming gradient, and autograd frees it
then (LossResult's copy on the loss's grad_fn.result has its gradients
left out). Only indexer_scores is differentiable: the target and the masks
get no gradient, as in the spec, where no gradient flows into p. The
service returns no second derivative: a gradient taken with
create_graph=True is tied to the loss's inputs, and differentiating it (a
gradient penalty) raises rather than counting it as a constant. The
functions are not torch.func transforms' (torch.func.grad, vmap).

With a Client(shared_memory=True) the tensors travel through its
shared-memory regions; the gradients it returns there (views that its next
call of the same shapes overwrites) are copied into the saved tensors.

indexer_kl_loss and indexer_kl_loss_from_projections run outside
torch.compile's graphs (a graph break): the call goes to the host and the
service.

IndexerKlLossFromProjections (indexer_kl_loss_from_projections) is the
projections form: from the main attention's query and key and the
indexer's index_query, index_key and index_weights, the service returns the
loss and the gradients of the last three, which backward passes on; query
and key get none.
"""

import dataclasses
import functools
import warnings
from typing import Any, Mapping, Optional

import ml_dtypes
import numpy as np

from klserve._frameworks import import_framework

torch = import_framework("torch", "PyTorch")

from klserve._client import Client, default_client
from klserve._signature import (DECIDED_BY_WRAPPERS, LOGITS_ARGUMENTS,
                                PROJECTIONS_ARGUMENTS, PROJECTIONS_OPTIONS,
                                projections_wrapper_signature, split_arguments,
                                wrapper_signature)
from klserve._tensor_table import INDEXER_GRADS
from klserve._tensors import host_array, wrapper_grad_name

# Wire names of the torch dtypes the service takes and returns.
_TORCH_WIRE_NAMES = {torch.float32: "FP32", torch.bfloat16: "BF16",
                     torch.float16: "FP16"}
_TORCH_DTYPES = {name: dtype for dtype, name in _TORCH_WIRE_NAMES.items()}


def _grad_name(options, inputs):
    """The gradient dtype to ask for (wrapper_grad_name) for the
    differentiable inputs (tensors, or arrays and lists, which need none)."""
    return wrapper_grad_name(options, [
        _TORCH_WIRE_NAMES.get(getattr(x, "dtype", None)) for x in inputs])


def _device_of(value):
    """Where the loss goes for an input `value`: its device, or the CPU's
    for an array or a list."""
    return value.device if isinstance(value, torch.Tensor) else None


class _SecondDerivativeRefused(torch.autograd.Function):
    """A gradient of the loss made in a backward that builds a graph
    (create_graph=True): the identity, tied to the loss's differentiable
    inputs, whose own backward raises. The service returns no second
    derivative; without the tie the gradient would be a constant, and a
    term built on it (a gradient penalty) would silently add nothing."""

    @staticmethod
    def forward(ctx: Any, gradient: torch.Tensor,
                *ties: torch.Tensor) -> torch.Tensor:
        return gradient.clone()

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> Any:
        raise RuntimeError(
            "klserve: the service returns the loss's gradient, not its "
            "derivatives: differentiating a gradient of the indexer KL loss "
            "(a gradient penalty, or a backward through a gradient taken "
            "with create_graph=True) is not supported")


def _ties_to(inputs, needed):
    """0-d tensors on the autograd graph of the `inputs` that need a
    gradient, for _SecondDerivativeRefused, without keeping their values:
    the sum of an empty slice. Made in forward, where grad mode is off."""
    with torch.enable_grad():
        return tuple(x.narrow(0, 0, 0).sum()
                     for x, need in zip(inputs, needed) if need)


def _first_derivative_only(backward):
    """A Function's backward run under no_grad, as torch's
    once_differentiable runs it; when a graph of it is being built
    (create_graph=True), each gradient it returns goes through
    _SecondDerivativeRefused, tied to ctx.ties and the incoming gradients,
    so that differentiating it raises."""
    @functools.wraps(backward)
    def first_derivative(ctx: Any, *grad_outputs: torch.Tensor) -> Any:
        with torch.no_grad():
            grads = backward(ctx, *grad_outputs)
        if not torch.is_grad_enabled():
            return grads
        ties = (*ctx.ties, *grad_outputs)
        return tuple(None if g is None else
                     _SecondDerivativeRefused.apply(g, *ties) for g in grads)
    return first_derivative


def _without_gradients(result):
    """The answer kept on the loss's grad_fn (ctx.result): its gradients,
    which backward takes from the saved tensors, are left out, so that a
    loss kept after backward (a list of the step's losses) does not keep
    them."""
    return dataclasses.replace(result, grad=None, d_index_query=None,
                               d_index_key=None, d_index_weights=None)


def _in_grad_mode(*tensors):
    """The tensors, detached when grad mode is off (torch.no_grad): the
    Function's forward runs with it off either way, and would otherwise
    ask the service for a gradient that nothing can take."""
    if torch.is_grad_enabled():
        return tensors
    return tuple(x.detach() if isinstance(x, torch.Tensor) else x
                 for x in tensors)


def _times(grad, grad_output, dtype):
    """The service's gradient times the incoming one, in float32 (float64
    for float64 inputs), as `dtype`."""
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    return (grad.to(wide) * grad_output.to(wide)).to(dtype)


def _outside_compiled_graphs(fn):
    """torch.compile must not trace into a call of the service (host
    arrays, gRPC): the graph breaks there, and the call runs eagerly."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return disable(fn) if disable is not None else fn


def to_numpy(value: Any) -> np.ndarray:
    """A tensor (any device) or array-like as a NumPy array; bfloat16
    becomes ml_dtypes.bfloat16. What the client does with each tensor it
    is given."""
    return host_array("value", value)


def from_numpy(array: np.ndarray, dtype: torch.dtype,
               device: torch.device, copy: bool = False) -> torch.Tensor:
    """A NumPy array (ml_dtypes.bfloat16 included) as a tensor. A read-only
    array (the projections form's gradients, views of the answer's bytes)
    is shared, not copied: the tensor must then not be written to, which
    holds for the gradients that backward only reads. `copy`: the tensor
    must not share the array's memory, as for views of a client's
    shared-memory region, which its next call of the same shapes writes
    over. (The wrappers call with copy_outputs=True instead, so that the
    copy is taken before another thread's call can come.)"""
    with warnings.catch_warnings():
        # torch warns that writing to a tensor over read-only memory is
        # undefined; nothing here writes to it.
        warnings.filterwarnings("ignore", "The given NumPy array is not "
                                "writable")
        if array.dtype == np.dtype(ml_dtypes.bfloat16):
            tensor = torch.from_numpy(array.view(np.int16)).view(
                torch.bfloat16)
        else:
            tensor = torch.from_numpy(array)
    converted = tensor.to(device=device, dtype=dtype)
    if copy and converted.data_ptr() == tensor.data_ptr():
        converted = converted.clone()
    return converted


class IndexerKlLoss(torch.autograd.Function):
    """IndexerKlLoss.apply(indexer_scores, inputs, client, options) -> loss.

    `inputs`: dict of the other tensors (attention_logits or
    attention_weights, topk_indices, segment ids, masks) as tensors or
    arrays; `client`: a klserve.Client (None: klserve.default_client());
    `options`: dict of fields of klserve.ComputeLossOptions but want_grad,
    want_row_kl, want_diagnostics, recall_k and copy_outputs, which are
    decided here
    (grad_dtype defaults to the scores' dtype, but float32 for float16
    and float64 scores: see _tensors.wrapper_grad_name). The loss is a 0-d
    float32 tensor (float64 for float64 scores) on the scores' device.
    """

    @staticmethod
    def forward(ctx: Any, indexer_scores: torch.Tensor,
                inputs: Optional[Mapping[str, Any]], client: Optional[Client],
                options: Optional[Mapping[str, Any]]) -> torch.Tensor:
        arrays, options = split_arguments(
            "IndexerKlLoss", {**(inputs or {}), **(options or {})},
            DECIDED_BY_WRAPPERS | PROJECTIONS_OPTIONS, LOGITS_ARGUMENTS)
        if client is None:
            client = default_client()
        want_grad = bool(ctx.needs_input_grad[0])
        grad_name = _grad_name(options, [indexer_scores])
        device = _device_of(indexer_scores)
        # The client takes the tensors to host memory itself.
        result = client.compute_loss(
            indexer_scores, **arrays, grad_dtype=grad_name,
            want_grad=want_grad, copy_outputs=True, **options)
        loss_dtype = (torch.float64
                      if getattr(indexer_scores, "dtype", None) == torch.float64
                      else torch.float32)
        if want_grad:
            # In the service's dtype until backward has multiplied it.
            ctx.save_for_backward(from_numpy(
                result.grad, _TORCH_DTYPES[grad_name], device))
            ctx.scores_dtype = indexer_scores.dtype
        ctx.ties = _ties_to([indexer_scores], [want_grad])
        ctx.result = _without_gradients(result)  # loss, N, for the curious
        return torch.tensor(result.loss, dtype=loss_dtype, device=device)

    @staticmethod
    @_first_derivative_only  # the service returns no second derivative
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        (grad,) = ctx.saved_tensors
        return _times(grad, grad_output, ctx.scores_dtype), None, None, None


@_outside_compiled_graphs
def indexer_kl_loss(indexer_scores: torch.Tensor, *,
                    client: Optional[Client] = None,
                    **arguments: Any) -> torch.Tensor:
    """IndexerKlLoss with keyword arguments: as in
    klserve.Client.compute_loss (the tensors and the fields of
    klserve.ComputeLossOptions), except want_grad, want_row_kl,
    want_diagnostics, recall_k and copy_outputs, which are decided here.
    Without
    `client`, klserve.default_client() ($KLSERVE_TARGET, else
    localhost:50051)."""
    if client is None:
        client = default_client()
    arrays, options = split_arguments(
        "indexer_kl_loss", arguments,
        DECIDED_BY_WRAPPERS | PROJECTIONS_OPTIONS, LOGITS_ARGUMENTS)
    (indexer_scores,) = _in_grad_mode(indexer_scores)
    return IndexerKlLoss.apply(indexer_scores, arrays, client, options)


indexer_kl_loss.__signature__ = wrapper_signature(  # type: ignore
    torch.Tensor, torch.Tensor)


class IndexerKlLossFromProjections(torch.autograd.Function):
    """IndexerKlLossFromProjections.apply(query, key, index_query,
    index_key, index_weights, inputs, client, options) -> loss.

    The projections form (klserve.Client.compute_loss_from_projections).
    `inputs`: dict of the form's other tensors (lse, topk_indices, masks,
    key bounds); `client` and `options` as in IndexerKlLoss (grad_dtype
    defaults to the indexer inputs' dtype when they share float32 or
    bfloat16, else float32). The service's gradients are asked for when
    any of index_query, index_key and index_weights requires one; query
    and key get none. The loss is a 0-d float32 tensor (float64 when the
    indexer inputs are) on index_query's device.
    """

    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor,
                index_query: torch.Tensor, index_key: torch.Tensor,
                index_weights: torch.Tensor,
                inputs: Optional[Mapping[str, Any]], client: Optional[Client],
                options: Optional[Mapping[str, Any]]) -> torch.Tensor:
        arrays, options = split_arguments(
            "IndexerKlLossFromProjections",
            {**(inputs or {}), **(options or {})}, DECIDED_BY_WRAPPERS,
            PROJECTIONS_ARGUMENTS)
        if client is None:
            client = default_client()
        indexer = (index_query, index_key, index_weights)
        want_grad = any(ctx.needs_input_grad[2:5])
        grad_name = _grad_name(options, indexer)
        result = client.compute_loss_from_projections(
            query, key, *indexer, **arrays, grad_dtype=grad_name,
            want_grad=want_grad, copy_outputs=True, **options)
        if want_grad:
            # In the service's dtype until backward has multiplied them.
            ctx.save_for_backward(*(
                from_numpy(getattr(result, field), _TORCH_DTYPES[grad_name],
                           _device_of(x))
                for field, x in zip(INDEXER_GRADS, indexer)))
            ctx.indexer_dtypes = tuple(getattr(x, "dtype", None) for x in indexer)
        ctx.want_grad = want_grad
        ctx.ties = _ties_to(indexer, ctx.needs_input_grad[2:5])
        ctx.result = _without_gradients(result)  # loss, N, topk_indices
        loss_dtype = (torch.float64
                      if all(getattr(x, "dtype", None) == torch.float64
                             for x in indexer)
                      else torch.float32)
        return torch.tensor(result.loss, dtype=loss_dtype,
                            device=_device_of(index_query))

    @staticmethod
    @_first_derivative_only  # the service returns no second derivative
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        # Called when only query or key requires a gradient: they get none.
        if not ctx.want_grad:
            return (None,) * 8
        d_indexer = tuple(
            _times(grad, grad_output, dtype) if needed else None
            for grad, dtype, needed in zip(ctx.saved_tensors,
                                           ctx.indexer_dtypes,
                                           ctx.needs_input_grad[2:5]))
        return (None, None, *d_indexer, None, None, None)


@_outside_compiled_graphs
def indexer_kl_loss_from_projections(
        query: torch.Tensor, key: torch.Tensor, index_query: torch.Tensor,
        index_key: torch.Tensor, index_weights: torch.Tensor, *,
        client: Optional[Client] = None, **arguments: Any) -> torch.Tensor:
    """IndexerKlLossFromProjections with keyword arguments: as in
    klserve.Client.compute_loss_from_projections, except want_grad,
    want_row_kl, want_diagnostics, recall_k and copy_outputs, which are
    decided here.
    Without `client`, klserve.default_client()."""
    if client is None:
        client = default_client()
    arrays, options = split_arguments(
        "indexer_kl_loss_from_projections", arguments, DECIDED_BY_WRAPPERS,
        PROJECTIONS_ARGUMENTS)
    return IndexerKlLossFromProjections.apply(
        *_in_grad_mode(query, key, index_query, index_key, index_weights),
        arrays, client, options)


indexer_kl_loss_from_projections.__signature__ = (  # type: ignore
    projections_wrapper_signature(torch.Tensor, torch.Tensor))


__all__ = ["IndexerKlLoss", "IndexerKlLossFromProjections",
           "indexer_kl_loss", "indexer_kl_loss_from_projections",
           "to_numpy", "from_numpy"]
