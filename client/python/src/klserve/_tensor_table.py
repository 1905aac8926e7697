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

from klserve._tensors import bool_input, float_input, int32_input


class Role(enum.Enum):
    # Cut into RowBlocks (rows r = b * T + t); the StreamHeader carries its
    # dtype and full shape (a TensorSpec).
    PER_ROW = "per-row"
    # Sent whole in the StreamHeader (a Tensor): small next to the per-row
    # ones, and needed by every row.
    SMALL = "small"


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

    @property
    def shape_text(self) -> str:
        return "[" + ", ".join(self.layout) + "]"


# The indexer scores come first: they fix B and T, so a bad scores tensor is
# named as such rather than as the tensor that disagrees with it.
TENSORS = (
    RequestTensor("indexer_scores", Role.PER_ROW, float_input,
                  ("B", "T", "S or K")),
    RequestTensor("attention_logits", Role.PER_ROW, float_input,
                  ("B", "H", "T", "S or K")),
    RequestTensor("attention_weights", Role.PER_ROW, float_input,
                  ("B", "T", "S or K")),
    RequestTensor("topk_indices", Role.PER_ROW, int32_input, ("B", "T", "K")),
    RequestTensor("segment_ids_q", Role.SMALL, int32_input, ("B", "T")),
    RequestTensor("segment_ids_kv", Role.SMALL, int32_input, ("B", "S")),
    RequestTensor("attention_mask", Role.PER_ROW, bool_input, ("B", "T", "S")),
    RequestTensor("key_padding_mask", Role.SMALL, bool_input, ("B", "S")),
    RequestTensor("row_valid", Role.SMALL, bool_input, ("B", "T")),
)

SCORES = TENSORS[0].name
