"""The service as a differentiable JAX function.

    from klserve.jax import indexer_kl_loss

    def loss_fn(params, batch):
        scores = indexer(params, batch)                     # [B, T, S]
        return indexer_kl_loss(scores, attention_logits=batch["logits"],
                               causal=True, q_offset=0,  # MaxText's mask
                               scaling_factor=0.01,
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

With a Client(shared_memory=True) the tensors travel through its
shared-memory regions. The client copies the gradients out of its region
before the call returns (copy_outputs=True): the region's next call of the
same shapes, which another thread may make at any moment, writes over it,
and jax.pure_callback copies the callback's results only after the
callback has returned.

The projections form (docs/spec.md) is the same kind of function of what
the job holds, the main attention's q and k and the indexer's own inputs:

    from klserve.jax import indexer_kl_loss_from_projections

    def loss_fn(params, batch):
        x = batch["x"]                                      # [B, T, d]
        q, k = jax.lax.stop_gradient(main_attention_qk(x))  # fixed
        q_i = jnp.einsum("btd,dje->btje", x, params["wq_i"])
        k_i = x @ params["wk_i"]
        w = x @ params["w_w"]
        return indexer_kl_loss_from_projections(
            q, k, q_i, k_i, w, causal=True, q_offset=0,  # MaxText's mask
            softmax_scale=D ** -0.5)

The service returns the gradients of index_query, index_key and
index_weights, which the backward pass carries on into the parameters that
made them; query and key (and lse, masks) get zero cotangents.
"""

import logging
from typing import Any, Optional

import numpy as np
import numpy.typing as npt

from klserve._frameworks import import_framework

jax = import_framework("jax", "JAX")
import jax.numpy as jnp  # noqa: E402

from klserve._client import Client, default_client, set_default_client
from klserve._errors import KlserveError
from klserve._signature import (DECIDED_BY_WRAPPERS, LOGITS_ARGUMENTS,
                                PROJECTIONS_ARGUMENTS, PROJECTIONS_OPTIONS,
                                projections_wrapper_signature, split_arguments,
                                wrapper_signature)
from klserve._tensor_table import BY_NAME, INDEXER_GRADS, PROJECTIONS
from klserve._tensors import (FLOAT_DTYPES, host_array, not_a_float,
                              wire_name_of_float, wrapper_grad_name)

# Integer tags, which are often traced values (the step inside a jitted
# train step): they always travel through the callback as operands.
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


def _take_operands(options):
    """(run, {name: JAX scalar}) out of the options: the integer tags, and
    any other option given as a JAX array (a traced grad_scale of
    1 / total_weights, say), travel through the callback as operands, so
    that they may be traced; the rest stay static."""
    run = options.pop("run", None)
    operands = {}
    for name in list(options):
        value = options[name]
        if value is None:
            continue
        if name in _TRACEABLE_TAGS or isinstance(value, jax.Array):
            operands[name] = jnp.asarray(options.pop(name))
    return run, operands


def _operand_values(operands_np):
    """The operands as the Python scalars the client takes."""
    return {k: np.asarray(v).item() for k, v in operands_np.items()}


class _ServiceErrorLogFilter(logging.Filter):
    """Drops JAX's log of a callback that failed with a KlserveError ("jax.
    pure_callback failed" and the traceback through this module and the
    client): the error reaches the caller anyway, raised itself from an
    eager call and as the text of JAX's error under jax.jit, so the log only
    printed it twice. A callback that fails with anything else (a bug) is
    still logged."""

    def filter(self, record):
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, KlserveError)


# The logger of the module that runs callbacks (jax/_src/callback.py logs
# under its __name__); if JAX moves it, the filter stops applying and the
# log is only noisier.
logging.getLogger("jax._src.callback").addFilter(_ServiceErrorLogFilter())


class _ServiceErrors:
    """The client's last KlserveError in a wrapper's callback.
    jax.pure_callback turns it into a runtime error of JAX's own; where the
    error reaches the wrapper's own call (an eager call), the KlserveError
    itself (code, details) is raised instead. Where it surfaces later
    (jax.jit, or a result that asynchronous dispatch delivers afterwards),
    it is JAX's error, with the KlserveError's text."""

    def __init__(self):
        self._last = None

    def call(self, fn, *args, **kwargs):
        """fn(...) in the callback, keeping its KlserveError."""
        try:
            return fn(*args, **kwargs)
        except KlserveError as e:
            # A copy without the traceback: a jitted function keeps this
            # object, and the frames would keep the request's arrays.
            self._last = KlserveError(e.code, e.details, e.debug_error_string,
                                      e.overloaded)
            raise

    def run(self, fn, *args):
        """fn(...) in the wrapper, raising the kept KlserveError for JAX's."""
        try:
            return fn(*args)
        except KlserveError:
            raise
        except Exception as e:  # JAX's wrapper of the callback's error
            if self._last is not None:
                raise self._last from e
            raise


def _float_array(name, value):
    """A float input (the scores, the projections) as a JAX array; any other
    dtype is refused as the client refuses it (INVALID_ARGUMENT naming the
    field), as the torch wrappers do by passing it on. The dtype named is
    the caller's: without x64, jnp.asarray would make an int64 an int32."""
    array = jnp.asarray(value)
    if not jnp.issubdtype(array.dtype, jnp.floating):
        raise not_a_float(name, getattr(value, "dtype", array.dtype))
    return array


def _integers_as_the_client_sends_them(arrays):
    """`arrays` with every integer one that is not JAX's yet (a NumPy array
    of int64, a list) converted here as the client converts it: top-k
    indices outside int32 become -1, an empty slot, and other integers
    outside int32 are refused naming their field. Without x64, JAX would
    keep only their low 32 bits, and 2**32 + 1 would be key 1. A JAX array
    (traced or not) has its dtype already. The others go on as the host
    arrays read here, so that nothing reads them twice."""
    converted = {}
    for name, value in arrays.items():
        if not isinstance(value, jax.Array):
            value = host_array(name, value)
            if value.dtype.kind in "iu":
                _, value = BY_NAME[name].convert(name, value)
        converted[name] = value
    return converted


def indexer_kl_loss(indexer_scores: npt.ArrayLike, *,
                    client: Optional[Client] = None,
                    **arguments: Any) -> jax.Array:
    """The indexer KL loss (a scalar) computed by the service.

    Keyword arguments as in klserve.Client.compute_loss (the tensors, JAX or
    NumPy arrays, and the fields of klserve.ComputeLossOptions), except
    want_grad, want_row_kl, want_diagnostics, recall_k and copy_outputs,
    which are decided here; grad_dtype defaults to the scores' dtype, but
    float32 for float16 and float64 scores (_tensors.wrapper_grad_name: the
    gradient is multiplied by the cotangent, a loss scale say, before it
    is cast to the scores' dtype). `run` is a static string; `step`,
    `layer` and `microbatch` may be Python ints or traced integer scalars,
    and the float options (grad_scale, scaling_factor, ...) Python floats
    or traced scalars. The loss is float32 (float64 for float64 scores);
    differentiating it gives dL/d indexer_scores in their dtype. Without
    `client`, klserve.default_client().

    The service's errors raise klserve.KlserveError from an eager call.
    Under jax.jit they reach the caller from the compiled call as JAX's
    runtime error (jax.errors.JaxRuntimeError), whose message holds the
    KlserveError's code and details. No gradient flows into the options,
    traced or not (a traced scaling_factor gets a zero cotangent).
    """
    arrays, options = split_arguments(
        "indexer_kl_loss", arguments,
        DECIDED_BY_WRAPPERS | PROJECTIONS_OPTIONS, LOGITS_ARGUMENTS)
    arrays = _integers_as_the_client_sends_them(arrays)
    run, operands = _take_operands(options)
    scores = _float_array("indexer_scores", indexer_scores)
    loss_dtype = jnp.result_type(scores.dtype, jnp.float32)
    grad_name = wrapper_grad_name(options, [wire_name_of_float(scores.dtype)])
    grad_dtype = FLOAT_DTYPES[grad_name]
    client = client if client is not None else default_client()

    errors = _ServiceErrors()

    def call_service(want_grad, scores_np, arrays_np, operands_np):
        result = errors.call(
            client.compute_loss, np.asarray(scores_np),
            **{k: np.asarray(v) for k, v in arrays_np.items()},
            run=run, grad_dtype=grad_name, want_grad=want_grad,
            copy_outputs=True,
            **_operand_values(operands_np), **options)
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
        d_scores = (grad.astype(loss_dtype) *
                    cotangent.astype(loss_dtype)).astype(scores.dtype)
        # None: zero cotangents for the targets, masks and tags.
        return d_scores, None, None

    loss_fn.defvjp(loss_fn_fwd, loss_fn_bwd)
    return errors.run(loss_fn, scores, arrays, operands)


indexer_kl_loss.__signature__ = wrapper_signature(  # type: ignore
    npt.ArrayLike, jax.Array)


def indexer_kl_loss_from_projections(
        query: npt.ArrayLike, key: npt.ArrayLike, index_query: npt.ArrayLike,
        index_key: npt.ArrayLike, index_weights: npt.ArrayLike, *,
        client: Optional[Client] = None, **arguments: Any) -> jax.Array:
    """The indexer KL loss (a scalar) of the projections form, computed by
    the service (klserve.Client.compute_loss_from_projections says what the
    arguments are). Differentiable in index_query, index_key and
    index_weights, with the service's gradients; query, key and every
    other input get zero cotangents. Keywords as there, except want_grad,
    want_row_kl, want_diagnostics, recall_k and copy_outputs, which are
    decided here;
    grad_dtype defaults to the indexer inputs' dtype when they share
    float32 or bfloat16, else float32 (each gradient is multiplied by the
    cotangent, then cast to its input's dtype). Tags, float options and
    errors as in indexer_kl_loss. The loss is float32 (float64 when the indexer
    inputs are). The service's own top-k selection (topk = K) is used but
    not returned here: Client.compute_loss_from_projections returns it.
    """
    arrays, options = split_arguments(
        "indexer_kl_loss_from_projections", arguments, DECIDED_BY_WRAPPERS,
        PROJECTIONS_ARGUMENTS)
    arrays = _integers_as_the_client_sends_them(arrays)
    run, operands = _take_operands(options)
    query, key, *indexer = (
        _float_array(name, value) for name, value in zip(
            PROJECTIONS, (query, key, index_query, index_key, index_weights)))
    indexer = tuple(indexer)
    loss_dtype = jnp.result_type(*(x.dtype for x in indexer), jnp.float32)
    grad_name = wrapper_grad_name(
        options, [wire_name_of_float(x.dtype) for x in indexer])
    grad_dtype = FLOAT_DTYPES[grad_name]
    client = client if client is not None else default_client()

    errors = _ServiceErrors()

    def call_service(want_grad, q, k, indexer_np, arrays_np, operands_np):
        result = errors.call(
            client.compute_loss_from_projections, np.asarray(q),
            np.asarray(k), *map(np.asarray, indexer_np),
            **{name: np.asarray(v) for name, v in arrays_np.items()},
            run=run, grad_dtype=grad_name, want_grad=want_grad,
            copy_outputs=True,
            **_operand_values(operands_np), **options)
        loss = np.asarray(result.loss, dtype=loss_dtype)
        if not want_grad:
            return loss
        return loss, tuple(
            np.asarray(getattr(result, field), dtype=grad_dtype)
            for field in INDEXER_GRADS)

    loss_shape = jax.ShapeDtypeStruct((), loss_dtype)
    grad_shapes = tuple(jax.ShapeDtypeStruct(x.shape, grad_dtype)
                        for x in indexer)

    @jax.custom_vjp
    def loss_fn(q, k, ix, a, t):
        return _pure_callback(
            lambda *operands: call_service(False, *operands), loss_shape,
            q, k, ix, a, t)

    def loss_fn_fwd(q, k, ix, a, t):
        return _pure_callback(
            lambda *operands: call_service(True, *operands),
            (loss_shape, grad_shapes), q, k, ix, a, t)

    def loss_fn_bwd(grads, cotangent):
        def times_cotangent(g, x):
            wide = jnp.result_type(x.dtype, jnp.float32)
            return (g.astype(wide) * cotangent.astype(wide)).astype(x.dtype)
        d_indexer = tuple(times_cotangent(g, x)
                          for g, x in zip(grads, indexer))
        # None: zero cotangents for query, key, lse, the masks and tags.
        return None, None, d_indexer, None, None

    loss_fn.defvjp(loss_fn_fwd, loss_fn_bwd)
    return errors.run(loss_fn, query, key, indexer, arrays, operands)


indexer_kl_loss_from_projections.__signature__ = (  # type: ignore
    projections_wrapper_signature(npt.ArrayLike, jax.Array))


__all__ = ["indexer_kl_loss", "indexer_kl_loss_from_projections",
           "default_client", "set_default_client"]
