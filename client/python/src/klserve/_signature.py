"""The loss call's keyword arguments, stated once for Client.compute_loss,
Client.compute_loss_from_projections and the JAX and PyTorch wrappers: the
request's tensors (the tensor table) and the fields of ComputeLossOptions."""

import dataclasses
import inspect
from typing import Any, Dict, FrozenSet, Iterable, Optional, Tuple, Union

import numpy.typing as npt

from klserve._tensor_table import PROJECTIONS, SCORES, TENSORS, Form, names

# The tensors other than the scores: the scores are the call's first
# argument (and, in the wrappers, the one that is differentiated).
ARRAY_ARGUMENTS = tuple(t.name for t in TENSORS if t.name != SCORES)
# What the logits form's wrappers take besides the scores.
LOGITS_ARGUMENTS = tuple(n for n in names(Form.LOGITS) if n != SCORES)
# What the projections form's calls take as keywords besides the five
# projections, their positional arguments.
PROJECTIONS_ARGUMENTS = tuple(n for n in names(Form.PROJECTIONS)
                              if n not in PROJECTIONS)


@dataclasses.dataclass(frozen=True)
class ComputeLossOptions:
    """Every keyword argument of the loss call that is not a tensor
    (docs/spec.md defines what they do to the loss).

    causal: the causal cut, key s visible to query t when
        s <= t + q_offset; q_offset defaults to S - T (the last query
        sees the last key). MaxText's and Megatron's masks align the first
        query with the first key: their jobs send q_offset=0 when T != S.
    num_keys: S; required with topk_indices (the sparse stage).
    softmax_scale: multiplies the attention logits (default 1); in the
        projections form, query . key. Refused with attention_weights
        (probabilities), unless 1.
    flavor: "exact" or "maxtext" (or the proto enum value).
    reduction: "mean", "mean_valid" or "sum" (or the proto enum value).
    scaling_factor: c, the loss's factor (default 1).
    grad_scale: multiplies the returned gradient only, never the loss (an
        upstream factor of the backward pass; default 1).
    grad_dtype: the gradient's dtype: a NumPy or PyTorch dtype, or
        "fp32", "bf16", "fp16". The JAX and PyTorch wrappers default it to
        the scores' dtype (float32 for float64 scores); in the projections
        form to the indexer inputs' dtype when they share one, else
        float32.
    index_weight_scale: the projections form only; multiplies
        index_weights in the indexer scores (default H_I^-1/2 * D_I^-1/2,
        for raw weights_proj output as MaxText and DeepSeek apply it;
        Megatron's weights come scaled: send 1).
    use_relu: the projections form only; relu on each indexer head's dot
        product (default True; False gives the plain product, GLM-5).
    topk: the projections form only; the sparse stage with the service's
        own selection of K >= 1 keys per row (the highest indexer scores,
        ties to the lower key), returned as topk_indices. Not with
        topk_indices or lse.
    want_grad, want_row_kl, want_diagnostics, recall_k: what the answer
        carries (the gradient; each row's KL; the entropies and, with
        recall_k > 0, the top-k recall). The wrappers decide these.
    run, step, layer, microbatch: tags the server aggregates per step
        (README.md, "Watching the loss"; a run's steps only go forward).
    request_id: echoed in the answer.
    deadline: this call's deadline in seconds, for all it sends (retries,
        the fallback inline from shared memory); None takes the client's
        (Client(deadline=)). A client's first call through shared memory
        registers its region under the client's deadline.
    stream: None streams when the tensors' bytes exceed the client's
        stream_threshold_bytes; True or False forces it.
    copy_outputs: through shared memory, True copies this call's outputs
        out of the client's region before the call returns, False leaves
        them views of it (valid until the next call of the same shapes,
        from any thread); None follows Client(copy_outputs=). The JAX and
        PyTorch wrappers copy: they keep the gradients past other calls,
        which other threads may make at any moment.
    """
    causal: bool = False
    q_offset: Optional[int] = None
    num_keys: Optional[int] = None
    softmax_scale: Optional[float] = None
    flavor: Union[str, int] = "exact"
    reduction: Union[str, int] = "mean"
    scaling_factor: Optional[float] = None
    grad_scale: Optional[float] = None
    index_weight_scale: Optional[float] = None
    use_relu: Optional[bool] = None
    topk: Optional[int] = None
    grad_dtype: Optional[npt.DTypeLike] = "fp32"
    want_grad: bool = True
    want_row_kl: bool = False
    want_diagnostics: bool = False
    recall_k: int = 0
    run: Optional[str] = None
    step: Optional[int] = None
    layer: Optional[int] = None
    microbatch: Optional[int] = None
    request_id: str = ""
    stream: Optional[bool] = None
    copy_outputs: Optional[bool] = None
    deadline: Optional[float] = None


OPTION_FIELDS = tuple(dataclasses.fields(ComputeLossOptions))

# What the answer must carry for differentiation; the JAX and PyTorch
# wrappers set these themselves.
DECIDED_BY_WRAPPERS: FrozenSet[str] = frozenset(
    ("want_grad", "want_row_kl", "want_diagnostics", "recall_k",
     "copy_outputs"))
# Options of the projections form alone, which the logits form's wrappers
# do not take.
PROJECTIONS_OPTIONS: FrozenSet[str] = frozenset(
    ("index_weight_scale", "use_relu", "topk"))


def split_arguments(caller: str, arguments: Dict[str, Any],
                    decided: Iterable[str] = (),
                    array_names: Tuple[str, ...] = ARRAY_ARGUMENTS
                    ) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(arrays, options) from a loss call's keyword arguments: the tensors
    of array_names given (None left out) and the options. TypeError, as for
    any Python call, for a name that is neither, or one the caller decides
    itself."""
    decided = frozenset(decided)
    option_names = {f.name for f in OPTION_FIELDS} - decided
    unknown = sorted(set(arguments) - set(array_names) - option_names)
    if unknown:
        raise TypeError(
            "%s: unexpected keyword arguments %s (it takes the tensors %s "
            "and the fields of klserve.ComputeLossOptions%s)" % (
                caller, unknown, ", ".join(array_names),
                " but " + ", ".join(sorted(decided)) if decided else ""))
    arrays = {name: value for name, value in arguments.items()
              if name in array_names and value is not None}
    options = {name: value for name, value in arguments.items()
               if name in option_names}
    return arrays, options


def loss_signature(leading: Iterable[inspect.Parameter],
                   trailing: Iterable[inspect.Parameter] = (),
                   decided: Iterable[str] = (),
                   defaults: Optional[Dict[str, Any]] = None,
                   returns: Any = inspect.Signature.empty,
                   array_names: Tuple[str, ...] = ARRAY_ARGUMENTS
                   ) -> inspect.Signature:
    """The signature a loss call shows to help() and inspect: `leading`
    (self, the scores), the array arguments, every option but `decided`
    (with `defaults` overriding ComputeLossOptions'), then `trailing`."""
    decided = frozenset(decided)
    defaults = defaults or {}
    keyword = inspect.Parameter.KEYWORD_ONLY
    params = list(leading)
    params += [inspect.Parameter(name, keyword, default=None,
                                 annotation=Optional[npt.ArrayLike])
               for name in array_names]
    params += [inspect.Parameter(f.name, keyword,
                                 default=defaults.get(f.name, f.default),
                                 annotation=f.type)
               for f in OPTION_FIELDS if f.name not in decided]
    params += list(trailing)
    return inspect.Signature(params, return_annotation=returns)


def _client_parameter() -> inspect.Parameter:
    return inspect.Parameter("client", inspect.Parameter.KEYWORD_ONLY,
                             default=None,
                             annotation="Optional[klserve.Client]")


def wrapper_signature(scores_annotation: Any,
                      returns: Any) -> inspect.Signature:
    """The signature of the logits form's JAX and PyTorch wrappers: the
    scores, that form's keyword arguments but DECIDED_BY_WRAPPERS
    (grad_dtype defaulting to the scores' dtype), and the client."""
    return loss_signature(
        [inspect.Parameter(SCORES, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                           annotation=scores_annotation)],
        [_client_parameter()],
        decided=DECIDED_BY_WRAPPERS | PROJECTIONS_OPTIONS,
        defaults={"grad_dtype": None}, returns=returns,
        array_names=LOGITS_ARGUMENTS)


def projections_parameters(annotation: Any) -> Tuple[inspect.Parameter, ...]:
    """The five projections, positional, in PROJECTIONS order."""
    return tuple(inspect.Parameter(name,
                                   inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                   annotation=annotation)
                 for name in PROJECTIONS)


def projections_wrapper_signature(annotation: Any,
                                  returns: Any) -> inspect.Signature:
    """The signature of the projections form's JAX and PyTorch wrappers:
    the five projections, the form's other tensors and options but
    DECIDED_BY_WRAPPERS (grad_dtype defaulting to the indexer inputs'),
    and the client."""
    return loss_signature(
        projections_parameters(annotation), [_client_parameter()],
        decided=DECIDED_BY_WRAPPERS, defaults={"grad_dtype": None},
        returns=returns, array_names=PROJECTIONS_ARGUMENTS)
