"""The service as a differentiable JAX function.

    from klserve.jax import indexer_kl_loss

    def loss_fn(params, batch):
        scores = indexer(params, batch)                     # [B, T, S]
        return indexer_kl_loss(scores, attention_logits=batch["logits"],
                               causal=True, scaling_factor=0.01,
                               run="exp1", step=batch["step"], layer=3)

    loss, grads = jax.jit(jax.value_and_grad(loss_fn))(params, batch)

The call reaches the service from the host through jax.pure_callback, so it
works under jax.jit (and jax.vmap, one request per mapped element). It is a
jax.custom_vjp: the forward pass asks the service for the loss and the
gradient with respect to the indexer scores and keeps the gradient as the
residual; the backward pass multiplies it by the incoming cotangent. Only
indexer_scores is differentiable: every other input (the target above all)
gets a zero cotangent, as in the spec, where no gradient flows into p.
A plain forward evaluation (no differentiation) asks for the loss alone.
"""

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

from klserve._client import Client, default_client, set_default_client
from klserve._signature import (DECIDED_BY_WRAPPERS, split_arguments,
                                wrapper_signature)
from klserve._tensors import FLOAT_DTYPES, grad_wire_name, wire_name_of_float

# Integer tags that may be traced values (e.g. the step inside a jitted
# train step); they travel through the callback as operands.
_TRACEABLE_TAGS = ("step", "layer", "microbatch")


def _pure_callback(callback, result_shapes, *args):
    """jax.pure_callback, mapped one call per element under jax.vmap (JAX
    releases before vmap_method had `vectorized=False`, the same thing)."""
    try:
        return jax.pure_callback(callback, result_shapes, *args,
                                 vmap_method="sequential")
    except TypeError as e:
        if "vmap_method" not in str(e):
            raise
        return jax.pure_callback(callback, result_shapes, *args)


def indexer_kl_loss(indexer_scores: npt.ArrayLike, *,
                    client: Optional[Client] = None,
                    **arguments: Any) -> jax.Array:
    """The indexer KL loss (a scalar) computed by the service.

    Keyword arguments as in klserve.Client.compute_loss (the tensors, JAX or
    NumPy arrays, and the fields of klserve.ComputeLossOptions), except
    want_grad, want_row_kl, want_diagnostics and recall_k, which are
    decided here; grad_dtype defaults to the scores' dtype (float32 for
    float64 scores). `run` is a static string; `step`, `layer` and
    `microbatch` may be Python ints or traced integer scalars. The loss is
    float32 (float64 for float64 scores); differentiating it gives
    dL/d indexer_scores in their dtype. Without `client`,
    klserve.default_client().
    """
    arrays, options = split_arguments("indexer_kl_loss", arguments,
                                      DECIDED_BY_WRAPPERS)
    run = options.pop("run", None)
    tags = {}
    for name in _TRACEABLE_TAGS:
        value = options.pop(name, None)
        if value is not None:
            tags[name] = jnp.asarray(value)
    scores = jnp.asarray(indexer_scores)
    if not jnp.issubdtype(scores.dtype, jnp.floating):
        raise TypeError("indexer_scores: must be a float array, got %s" %
                        scores.dtype)
    loss_dtype = jnp.result_type(scores.dtype, jnp.float32)
    grad_name = options.pop("grad_dtype", None)
    if grad_name is None:
        grad_name = wire_name_of_float(scores.dtype) or "FP32"
    grad_name = grad_wire_name(grad_name)
    grad_dtype = FLOAT_DTYPES[grad_name]
    client = client if client is not None else default_client()

    def call_service(want_grad, scores_np, arrays_np, tags_np):
        tag_values = {k: int(np.asarray(v)) for k, v in tags_np.items()}
        result = client.compute_loss(
            np.asarray(scores_np), **{k: np.asarray(v)
                                      for k, v in arrays_np.items()},
            run=run, grad_dtype=grad_name, want_grad=want_grad,
            **tag_values, **options)
        loss = np.asarray(result.loss, dtype=loss_dtype)
        if not want_grad:
            return loss
        return loss, np.asarray(result.grad, dtype=grad_dtype).reshape(
            scores_np.shape)

    loss_shape = jax.ShapeDtypeStruct((), loss_dtype)
    grad_shape = jax.ShapeDtypeStruct(scores.shape, grad_dtype)

    def loss_only(s, a, t):
        return _pure_callback(
            lambda s_, a_, t_: call_service(False, s_, a_, t_), loss_shape,
            s, a, t)

    def loss_and_grad(s, a, t):
        return _pure_callback(
            lambda s_, a_, t_: call_service(True, s_, a_, t_),
            (loss_shape, grad_shape), s, a, t)

    @jax.custom_vjp
    def loss_fn(s, a, t):
        return loss_only(s, a, t)

    def loss_fn_fwd(s, a, t):
        loss, grad = loss_and_grad(s, a, t)
        return loss, grad

    def loss_fn_bwd(grad, cotangent):
        d_scores = (grad.astype(jnp.float32) *
                    cotangent.astype(jnp.float32)).astype(scores.dtype)
        # None: zero cotangents for the targets, masks and tags.
        return d_scores, None, None

    loss_fn.defvjp(loss_fn_fwd, loss_fn_bwd)
    return loss_fn(scores, arrays, tags)


indexer_kl_loss.__signature__ = wrapper_signature(  # type: ignore
    npt.ArrayLike, jax.Array)


__all__ = ["indexer_kl_loss", "default_client", "set_default_client"]
