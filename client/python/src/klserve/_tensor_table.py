"""The request's tensors, each stated once: its name (the field of
ComputeLossRequest, and the keyword argument of the loss call), its role in
a stream, its dtype rule and its layout. Everything that handles a tensor of
the request iterates this table; adding a tensor to the proto is one line
here (tests/python/test_tensor_table.py checks the table against the
generated descriptor)."""

import dataclasses
import enum
from typing import Any, Callable, Tuple

import numpy as np

from klserve._tensors import (bool_input, float_input, fp32_input, index_input,
                              int32_input)


class Role(enum.Enum):
    # Cut into RowBlocks (rows r = b * T + t); the StreamHeader carries its
    # dtype and full shape (a TensorSpec).
    PER_ROW = "per-row"
    # Sent whole in the StreamHeader (a Tensor): small next to the per-row
    # ones, and needed by every row.
    SMALL = "small"
    # The projections form's key side: every query row reads all of it, so
    # it too is sent whole in the StreamHeader, where the server holds it
    # for the stream's life (--max_stream_key_bytes).
    KEY_SIDE = "key side"


class Form(enum.Flag):
    """The loss forms a tensor belongs to (docs/spec.md): the logits forms
    take the indexer scores and a target; the projections form takes the
    projections and recomputes both."""
    LOGITS = enum.auto()
    PROJECTIONS = enum.auto()
    BOTH = LOGITS | PROJECTIONS


@dataclasses.dataclass(frozen=True)
class RequestTensor:
    name: str
    role: Role
    # (field, value) -> (wire dtype name, contiguous little-endian array);
    # raises KlserveError INVALID_ARGUMENT naming the field.
    convert: Callable[[str, Any], Tuple[str, np.ndarray]]
    # Dimension names, outermost first. A per-row tensor has B first and T
    # among them; in a RowBlock its rows are laid out as
    # [dims between B and T..., num_rows, dims after T...].
    layout: Tuple[str, ...]
    forms: Form = Form.BOTH

    @property
    def shape_text(self) -> str:
        return "[" + ", ".join(self.layout) + "]"


# The indexer scores come first: they fix B and T, so a bad scores tensor is
# named as such rather than as the tensor that disagrees with it.
TENSORS = (
    RequestTensor("indexer_scores", Role.PER_ROW, float_input,
                  ("B", "T", "S or K"), Form.LOGITS),
    RequestTensor("attention_logits", Role.PER_ROW, float_input,
                  ("B", "H", "T", "S or K"), Form.LOGITS),
    RequestTensor("attention_weights", Role.PER_ROW, float_input,
                  ("B", "T", "S or K"), Form.LOGITS),
    RequestTensor("topk_indices", Role.PER_ROW, index_input, ("B", "T", "K")),
    RequestTensor("segment_ids_q", Role.SMALL, int32_input, ("B", "T")),
    RequestTensor("segment_ids_kv", Role.SMALL, int32_input, ("B", "S")),
    RequestTensor("attention_mask", Role.PER_ROW, bool_input, ("B", "T", "S")),
    RequestTensor("key_padding_mask", Role.SMALL, bool_input, ("B", "S")),
    RequestTensor("row_valid", Role.SMALL, bool_input, ("B", "T")),
    RequestTensor("key_start", Role.SMALL, int32_input, ("B", "T")),
    RequestTensor("key_end", Role.SMALL, int32_input, ("B", "T")),
    RequestTensor("query", Role.PER_ROW, float_input, ("B", "T", "H", "D"),
                  Form.PROJECTIONS),
    RequestTensor("key", Role.KEY_SIDE, float_input, ("B", "S", "H_kv", "D"),
                  Form.PROJECTIONS),
    RequestTensor("lse", Role.PER_ROW, fp32_input, ("B", "H", "T"),
                  Form.PROJECTIONS),
    RequestTensor("index_query", Role.PER_ROW, float_input,
                  ("B", "T", "H_I", "D_I"), Form.PROJECTIONS),
    RequestTensor("index_key", Role.KEY_SIDE, float_input, ("B", "S", "D_I"),
                  Form.PROJECTIONS),
    RequestTensor("index_weights", Role.PER_ROW, float_input,
                  ("B", "T", "H_I"), Form.PROJECTIONS),
)

BY_NAME = {t.name: t for t in TENSORS}

SCORES = TENSORS[0].name
# What fixes B and T in the projections form, as the scores do in the logits
# form.
QUERY = "query"

# The projections form's tensors that every request of it carries, in the
# order of compute_loss_from_projections' positional arguments.
PROJECTIONS = ("query", "key", "index_query", "index_key", "index_weights")
# Those the service returns a gradient for, and the response fields.
INDEXER_INPUTS = ("index_query", "index_key", "index_weights")
INDEXER_GRADS = tuple("d_" + name for name in INDEXER_INPUTS)


def names(form: Form) -> Tuple[str, ...]:
    """The tensors of a form, in table order."""
    return tuple(t.name for t in TENSORS if t.forms & form)
