"""The stream form of a ComputeLoss call, as the C++ client does it
(client/stream_codec.cc): the request cut into a StreamHeader and RowBlocks,
and the GradBlocks put back together into the response the unary call would
have returned. No gRPC here.

Rows are r = b * T + t over the indexer scores' [B, T, X]; a block may cross
batch boundaries. In a RowBlock a per-row tensor's rows are laid out as its
table entry says (klserve._tensor_table): per-head logits [H, num_rows, X]
(every head's rows of the block, one head after another), the other
per-row tensors [num_rows, X].

A REDUCTION_MEAN_VALID problem without row_valid is sent twice (protocol:
RowBlock.counting in klserve.proto): its N is known only once every row has
been seen, so the server counts in a first pass, answered by GradBlocks
without tensors, and computes in the second.
"""

import math
from typing import Any, Dict, Iterator, Optional, Tuple

import grpc
import numpy as np

from klserve._errors import KlserveError, invalid_argument
from klserve._tensor_table import SCORES, TENSORS, Role
from klserve._tensors import FP64, WIRE_DTYPES, to_spec, to_tensor

# The request's tensors as the client sends them: field -> (wire dtype name,
# contiguous little-endian array).
Tensors = Dict[str, Tuple[str, np.ndarray]]


def needs_counting_pass(pb2: Any, options: Any, tensors: Tensors) -> bool:
    """Whether the stream sends its rows twice, counting first."""
    return (options.reduction == pb2.REDUCTION_MEAN_VALID and
            "row_valid" not in tensors)


def _shape(shape):
    return "[" + ",".join(str(d) for d in shape) + "]"


class RequestSlicer:
    """Cuts the per-row tensors of one request into row blocks.

    `tensors` maps field names to (wire dtype name, contiguous little-endian
    array), as sent in a ComputeLossRequest.
    """

    def __init__(self, tensors: Tensors) -> None:
        self._tensors = tensors
        unary = [t.name for t in TENSORS
                 if t.role is Role.UNARY and t.name in tensors]
        if unary:
            # The StreamHeader has no field for them: leaving them out would
            # send another problem.
            raise invalid_argument(
                "%s: not carried by ComputeLossStream (the projections form "
                "is not streamed yet), got a stream request with it" %
                unary[0])
        if SCORES not in tensors:
            raise invalid_argument(SCORES + ": must be given")
        scores = tensors[SCORES][1]
        if scores.ndim != 3:
            raise invalid_argument(
                "indexer_scores: must be given with shape [B, T, S or K], "
                "got " + _shape(scores.shape))
        if min(scores.shape) < 1:
            raise invalid_argument(
                "indexer_scores: dimensions must be >= 1, got " +
                _shape(scores.shape))
        self.batch, self.rows_per_batch, self.row_width = scores.shape
        # (field, array viewed as [B, dims between B and T, T, dims after
        # T], each group of dims flattened into one)
        self._parts = []
        for entry in TENSORS:
            if entry.role is not Role.PER_ROW or entry.name not in tensors:
                continue
            arr = tensors[entry.name][1]
            t_axis = entry.layout.index("T")
            if (arr.ndim != len(entry.layout) or
                    arr.shape[0] != self.batch or
                    arr.shape[t_axis] != self.rows_per_batch):
                raise invalid_argument(
                    "%s: shape must be %s with B = %d and T = %d (from "
                    "%s), got %s" % (
                        entry.name, entry.shape_text, self.batch,
                        self.rows_per_batch, SCORES, _shape(arr.shape)))
            view = arr.reshape(self.batch, math.prod(arr.shape[1:t_axis]),
                               self.rows_per_batch,
                               math.prod(arr.shape[t_axis + 1:]))
            self._parts.append((entry.name, view))

    @property
    def num_rows(self) -> int:
        return self.batch * self.rows_per_batch

    @property
    def row_bytes(self) -> int:
        """Bytes of all per-row tensors for one row (every head's logits)."""
        return sum(view.shape[1] * view.shape[3] * view.itemsize
                   for _, view in self._parts)

    def block_rows_for(self, block_bytes: int) -> int:
        """Rows per block so that a block holds about block_bytes."""
        per_row = max(self.row_bytes, 1)
        return int(min(max(block_bytes // per_row, 1), self.num_rows))

    def make_header(self, pb2: Any, request_id: str, tags: Optional[Any],
                    options: Any) -> Any:
        header = pb2.StreamHeader(request_id=request_id, options=options)
        if tags is not None:
            header.tags.CopyFrom(tags)
        for entry in TENSORS:
            if entry.name not in self._tensors:
                continue
            name, arr = self._tensors[entry.name]
            message = (to_spec if entry.role is Role.PER_ROW else to_tensor)(
                pb2, name, arr)
            getattr(header, entry.name).CopyFrom(message)
        return header

    def _part_bytes(self, view, row_begin, num_rows):
        row_end = row_begin + num_rows
        pieces = []
        r = row_begin
        while r < row_end:
            b, t = divmod(r, self.rows_per_batch)
            run = min(row_end - r, self.rows_per_batch - t)
            pieces.append(view[b, :, t:t + run])  # [H, run, X]
            r += run
        if len(pieces) == 1:
            return pieces[0].tobytes()  # C order: [H, num_rows, X]
        return np.concatenate(pieces, axis=1).tobytes()

    def make_block(self, pb2: Any, row_begin: int, num_rows: int,
                   counting: bool = False) -> Any:
        block = pb2.RowBlock(row_begin=row_begin, num_rows=num_rows,
                             counting=counting)
        for field, view in self._parts:
            setattr(block, field, self._part_bytes(view, row_begin, num_rows))
        return block

    def blocks(self, pb2: Any, block_rows: int,
               counting_pass: bool) -> Iterator[Any]:
        """Every row in blocks of block_rows; all of them twice, the first
        time with counting set, when counting_pass."""
        for counting in (True, False) if counting_pass else (False,):
            for row in range(0, self.num_rows, block_rows):
                yield self.make_block(pb2, row,
                                      min(block_rows, self.num_rows - row),
                                      counting)


def _protocol_error(what):
    return KlserveError(grpc.StatusCode.INTERNAL,
                        "ComputeLossStream: server broke the protocol: " +
                        what)


class ResponseAssembler:
    """Rebuilds the gradient [B, T, X] and row_kl [B, T] from GradBlocks,
    after discarding those of the counting pass when there is one."""

    def __init__(self, scores_shape: Tuple[int, int, int],
                 counting_pass: bool) -> None:
        self._batch, self._rows_per_batch, self._width = scores_shape
        self._total = self._batch * self._rows_per_batch
        # Rows the counting pass has yet to answer.
        self._rows_to_count = self._total if counting_pass else 0
        self.rows_done = 0
        self._blocks = 0
        self._grad = None  # [rows, X] once the first block has a grad
        self._row_kl = None
        self._has_grad = self._has_row_kl = False

    def add(self, block: Any) -> None:
        if self._rows_to_count:
            self._add_counted(block)
            return
        n = block.num_rows
        if (block.row_begin != self.rows_done or n < 1 or
                n > self._total - self.rows_done):
            raise _protocol_error(
                "grad block rows [%d, +%d) do not continue at row %d of %d" %
                (block.row_begin, n, self.rows_done, self._total))
        grad_here = len(block.grad.data) > 0
        row_kl_here = len(block.row_kl.data) > 0
        if self._blocks == 0:
            self._has_grad, self._has_row_kl = grad_here, row_kl_here
            if grad_here:
                dtype = WIRE_DTYPES.get(block.grad.dtype)
                if dtype is None or block.grad.dtype in ("INT32", "BOOL"):
                    raise _protocol_error(
                        "grad dtype %r" % block.grad.dtype)
                self._grad_name = block.grad.dtype
                self._grad = np.empty((self._total, self._width), dtype)
            if row_kl_here:
                self._row_kl = np.empty(self._total, FP64)
        if grad_here != self._has_grad or row_kl_here != self._has_row_kl:
            raise _protocol_error(
                "grad block at row %d carries grad/row_kl unlike the first "
                "block" % self.rows_done)
        rows = slice(self.rows_done, self.rows_done + n)
        if self._has_grad:
            expected = n * self._width * self._grad.itemsize
            if (block.grad.dtype != self._grad_name or
                    len(block.grad.data) != expected):
                raise _protocol_error(
                    "grad block at row %d: grad must be %d bytes of %s, got "
                    "%d bytes of %s" % (self.rows_done, expected,
                                        self._grad_name, len(block.grad.data),
                                        block.grad.dtype))
            self._grad[rows] = np.frombuffer(
                block.grad.data, self._grad.dtype).reshape(n, self._width)
        if self._has_row_kl:
            if (block.row_kl.dtype != "FP64" or
                    len(block.row_kl.data) != n * 8):
                raise _protocol_error(
                    "grad block at row %d: row_kl must be %d bytes of FP64, "
                    "got %d bytes of %s" % (self.rows_done, n * 8,
                                            len(block.row_kl.data),
                                            block.row_kl.dtype))
            self._row_kl[rows] = np.frombuffer(block.row_kl.data, FP64)
        self.rows_done += n
        self._blocks += 1

    def _add_counted(self, block):
        counted = self._total - self._rows_to_count
        n = block.num_rows
        if (block.row_begin != counted or n < 1 or
                n > self._rows_to_count):
            raise _protocol_error(
                "counting pass: grad block rows [%d, +%d) do not continue at "
                "row %d of %d" % (block.row_begin, n, counted, self._total))
        if block.grad.data or block.row_kl.data:
            raise _protocol_error(
                "counting pass: grad block at row %d carries grad or row_kl"
                % counted)
        self._rows_to_count -= n

    def finish(self) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
        """(grad [B, T, X] or None, row_kl [B, T] or None)."""
        if self.rows_done != self._total:
            raise _protocol_error("result arrived after %d of %d rows" %
                                  (self.rows_done, self._total))
        grad = row_kl = None
        if self._has_grad:
            grad = self._grad.reshape(self._batch, self._rows_per_batch,
                                      self._width)
        if self._has_row_kl:
            row_kl = self._row_kl.reshape(self._batch, self._rows_per_batch)
        return grad, row_kl
