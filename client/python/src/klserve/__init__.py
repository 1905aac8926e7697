"""Python client of klserve, the lightning-indexer KL loss service.

    import klserve
    client = klserve.Client("localhost:50051")
    # causal: q_offset defaults to S - T; MaxText and Megatron want 0.
    result = client.compute_loss(scores, attention_logits=logits, causal=True)
    result.loss, result.grad

    # The projections form: the service recomputes the logits and scores.
    result = client.compute_loss_from_projections(
        query, key, index_query, index_key, index_weights, causal=True)
    result.d_index_query, result.d_index_key, result.d_index_weights

The call's keyword arguments are the request's tensors and the fields of
`klserve.ComputeLossOptions`, which says what each does.
`klserve.jax.indexer_kl_loss` makes the service a differentiable JAX
function; `klserve.torch.IndexerKlLoss` a torch.autograd.Function;
`indexer_kl_loss_from_projections` in both is the projections form. The loss
itself is specified in docs/spec.md of the klserve repository; the wire
contract is proto/klserve/v1/klserve.proto (its generated stubs are
`klserve.v1`).
"""

from klserve._errors import KlserveError
from klserve._client import Client, default_client, set_default_client
from klserve._results import (LossResult, RegionList, RegionStatus,
                              ServerInfo, StepResult)
from klserve._signature import ComputeLossOptions
from klserve.shared_memory import SharedMemoryRegion

__version__ = "0.1.0"

__all__ = ["Client", "ComputeLossOptions", "KlserveError", "LossResult",
           "RegionList", "RegionStatus", "ServerInfo", "SharedMemoryRegion",
           "StepResult", "default_client", "set_default_client",
           "__version__"]
