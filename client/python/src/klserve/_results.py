"""What the Client's calls answer, as plain Python values: a loss call's
result, the server's description, its regions and a published step."""

import dataclasses
from typing import Any, Dict, Optional, Tuple

import numpy as np


@dataclasses.dataclass
class LossResult:
    """The answer to one compute_loss call."""
    loss: float            # c * sum_t KL_t / N (0 when N = 0)
    unscaled_loss: float   # sum_t KL_t / N
    denominator: int       # N
    rows_counted: int
    rows_fully_masked: int
    rows_zero_target: int
    # mean_entropy_p, mean_entropy_q (nats) and, with recall_k,
    # topk_recall; None unless want_diagnostics.
    diagnostics: Optional[Dict[str, float]]
    # dL/d indexer_scores, shaped like them, in grad_dtype; None when
    # want_grad is False.
    grad: Optional[np.ndarray]
    # Each row's unscaled KL, float64 [B, T]; None unless want_row_kl.
    row_kl: Optional[np.ndarray]
    request_id: str = ""
    streamed: bool = False  # whether it went through ComputeLossStream
    # The projections form: dL/d index_query, index_key, index_weights,
    # shaped like them, in grad_dtype (None when want_grad is False), and
    # the service's own top-k selection, int32 [B, T, K], when topk was
    # given. Read-only views of the answer's bytes, which saves a copy of
    # each; .copy() one to write to it.
    d_index_query: Optional[np.ndarray] = None
    d_index_key: Optional[np.ndarray] = None
    d_index_weights: Optional[np.ndarray] = None
    topk_indices: Optional[np.ndarray] = None
    # Whether the call went through shared memory (Client(shared_memory=
    # True)). Its output arrays (grad, row_kl, d_index_*, topk_indices)
    # are then writable views of the client's region for this call shape,
    # which the next call of the same shapes overwrites, unless the client
    # has copy_outputs=True.
    shared_memory: bool = False


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    """GetServerInfo's answer: what the server runs and its limits."""
    version: str
    backend: str
    device: str
    threads: int
    max_message_bytes: int
    max_tensor_bytes: int
    max_concurrent_requests: int
    input_dtypes: Tuple[str, ...]
    grad_dtypes: Tuple[str, ...]
    # Streams open at once, and what one stream of the projections form may
    # hold for its key side, a unary call for its d_index_key sum
    # (--max_stream_key_bytes).
    max_open_streams: int
    max_stream_key_bytes: int
    # What one compute thread may hold for a logits-form row or a tile of a
    # projections-form request (--max_thread_scratch_bytes).
    max_thread_scratch_bytes: int
    # Whether it serves shared-memory regions (--shared_memory), to callers
    # on its host.
    shared_memory: bool = False


@dataclasses.dataclass(frozen=True)
class RegionStatus:
    """A registered region (ListRegions)."""
    name: str
    key: str               # the object, /dev/shm/<key>
    offset: int
    byte_size: int
    users: int             # calls using it now
    lease_left_seconds: int


@dataclasses.dataclass(frozen=True)
class RegionList:
    """ListRegions' answer: the regions, by name, and the server's limits
    on all of them together (--max_regions, --max_region_bytes)."""
    regions: Tuple[RegionStatus, ...]
    max_regions: int
    max_region_bytes: int


@dataclasses.dataclass(frozen=True)
class StepResult:
    """A published step (FinishStep). already_finished: it had been
    published before (by another rank's finish_step, the run's next step or
    the idle timeout); the values are then the published ones when it is
    the run's last finished step, else NaN (and requests 0)."""
    indexer_loss: float
    indexer_loss_unscaled: float
    requests: int
    already_finished: bool = False


def loss_result(response: Any, grad: Optional[np.ndarray],
                row_kl: Optional[np.ndarray], streamed: bool) -> LossResult:
    """A LossResult of a ComputeLossResponse's result, with the output
    arrays the caller made of its tensors."""
    r = response.result
    diagnostics = None
    if r.HasField("diagnostics"):
        d = r.diagnostics
        diagnostics = {"mean_entropy_p": d.mean_entropy_p,
                       "mean_entropy_q": d.mean_entropy_q}
        if d.HasField("topk_recall"):
            diagnostics["topk_recall"] = d.topk_recall
    return LossResult(
        loss=r.loss, unscaled_loss=r.unscaled_loss,
        denominator=r.denominator, rows_counted=r.rows_counted,
        rows_fully_masked=r.rows_fully_masked,
        rows_zero_target=r.rows_zero_target, diagnostics=diagnostics,
        grad=grad, row_kl=row_kl, request_id=response.request_id,
        streamed=streamed)
