"""The stream form of a ComputeLoss call, as the C++ client does it
(client/stream_codec.cc): the request cut into a StreamHeader and RowBlocks,
and the GradBlocks put back together into the response the unary call would
have returned. No gRPC here.

Rows are r = b * T + t over the indexer scores' [B, T, X] (the projections
form: the query's [B, T, H, D]); a block may cross batch boundaries. In a
RowBlock a per-row tensor's rows are laid out as its table entry says
(klserve._tensor_table): per-head logits [H, num_rows, X] (every head's rows
of the block, one head after another) and lse [H, num_rows], the other
per-row tensors [num_rows, X...].

The projections form sends its key side (key, index_key) whole in the
header; each RowBlock is answered by a GradBlock of the rows it completed
(the server computes whole tiles of rows, holding a block's last rows back
until the next block completes their tile), which may begin in an earlier
block or cover no rows; the result carries d_index_key.

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
from klserve._tensor_table import BY_NAME, QUERY, SCORES, TENSORS, Role
from klserve._tensors import FP64, WIRE_DTYPES, to_spec, to_tensor

# The request's tensors as the client sends them: field -> (wire dtype name,
# contiguous little-endian array).
Tensors = Dict[str, Tuple[str, np.ndarray]]


def needs_counting_pass(pb2: Any, options: Any, tensors: Tensors) -> bool:
    """Whether the stream sends its rows twice, counting first (never in the
    projections form, whose N the server counts without the rows, or
    refuses to stream)."""
    return (options.reduction == pb2.REDUCTION_MEAN_VALID and
            "row_valid" not in tensors and QUERY not in tensors)


def stream_carries(pb2: Any, options: Any, tensors: Tensors) -> bool:
    """Whether ComputeLossStream takes the problem at all (as the C++
    client's StreamCarries): the projections form's stream has no counting
    pass, so REDUCTION_MEAN_VALID without row_valid, with the client's
    topk_indices or an attention_mask, must go as one message."""
    return not (QUERY in tensors and
                options.reduction == pb2.REDUCTION_MEAN_VALID and
                "row_valid" not in tensors and
                ("topk_indices" in tensors or "attention_mask" in tensors))


def _shape(shape):
    return "[" + ",".join(str(d) for d in shape) + "]"


class RequestSlicer:
    """Cuts the per-row tensors of one request into row blocks.

    `tensors` maps field names to (wire dtype name, contiguous little-endian
    array), as sent in a ComputeLossRequest.
    """

    def __init__(self, tensors: Tensors) -> None:
        self._tensors = tensors
        # The tensor that fixes B and T: the scores, or the query.
        source = QUERY if QUERY in tensors else SCORES
        entry = BY_NAME[source]
        if source not in tensors:
            raise invalid_argument(source + ": must be given")
        first = tensors[source][1]
        if first.ndim != len(entry.layout):
            raise invalid_argument(
                "%s: must be given with shape %s, got %s" %
                (source, entry.shape_text, _shape(first.shape)))
        if min(first.shape) < 1:
            raise invalid_argument(
                "%s: dimensions must be >= 1, got %s" %
                (source, _shape(first.shape)))
        self.batch, self.rows_per_batch = first.shape[:2]
        self.row_width = first.shape[-1]
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
                        self.rows_per_batch, source, _shape(arr.shape)))
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

    def block_rows_for(self, block_bytes: int,
                       answer_row_bytes: int = 0) -> int:
        """Rows per block so that a block, and its answer of
        answer_row_bytes a row, hold about block_bytes (an answer may be
        the larger: a wide top-k selection, fp32 gradients of bf16
        projections)."""
        per_row = max(self.row_bytes, answer_row_bytes, 1)
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


class ProjectionsAssembler:
    """Rebuilds the projections form's per-row outputs from GradBlocks:
    d_index_query [B, T, H_I, D_I], d_index_weights [B, T, H_I], the
    service's topk_indices [B, T, K] and row_kl [B, T], each where the
    blocks carry it. A block may cover no rows (and then carries nothing)."""

    FIELDS = ("d_index_query", "d_index_weights", "topk_indices", "row_kl")

    def __init__(self, batch: int, rows_per_batch: int) -> None:
        self._batch, self._rows_per_batch = batch, rows_per_batch
        self._total = batch * rows_per_batch
        self.rows_done = 0
        # field -> (wire dtype name, [total, ...] array), from the first
        # block with rows; None until then.
        self._outputs: Optional[Dict[str, Tuple[str, np.ndarray]]] = None

    def add(self, block: Any) -> None:
        n = block.num_rows
        if (block.row_begin != self.rows_done or n < 0 or
                n > self._total - self.rows_done):
            raise _protocol_error(
                "grad block rows [%d, +%d) do not continue at row %d of %d" %
                (block.row_begin, n, self.rows_done, self._total))
        if block.grad.data:
            raise _protocol_error(
                "grad block at row %d carries grad in the projections form" %
                self.rows_done)
        here = {f for f in self.FIELDS if getattr(block, f).data}
        if n == 0:
            if here:
                raise _protocol_error(
                    "grad block of no rows at row %d carries %s" %
                    (self.rows_done, sorted(here)[0]))
            return
        if self._outputs is None:
            self._outputs = {}
            for field in sorted(here, key=self.FIELDS.index):
                tensor = getattr(block, field)
                dtype = WIRE_DTYPES.get(tensor.dtype)
                if dtype is None:
                    raise _protocol_error("%s dtype %r" %
                                          (field, tensor.dtype))
                self._outputs[field] = (tensor.dtype, np.empty(
                    (self._total,) + tuple(tensor.shape[1:]), dtype))
        if here != set(self._outputs):
            raise _protocol_error(
                "grad block at row %d carries %s unlike the first block" %
                (self.rows_done, sorted(here ^ set(self._outputs))[0]))
        rows = slice(self.rows_done, self.rows_done + n)
        for field, (name, out) in self._outputs.items():
            tensor = getattr(block, field)
            expected = n * out[0].nbytes
            if (tensor.dtype != name or
                    tuple(tensor.shape) != (n,) + out.shape[1:] or
                    len(tensor.data) != expected):
                raise _protocol_error(
                    "grad block at row %d: %s must be %d bytes of %s in %d "
                    "rows, got %d bytes of %s" % (
                        self.rows_done, field, expected, name, n,
                        len(tensor.data), tensor.dtype))
            out[rows] = np.frombuffer(tensor.data, out.dtype).reshape(
                (n,) + out.shape[1:])
        self.rows_done += n

    def finish(self) -> Dict[str, np.ndarray]:
        """The assembled outputs, [B, T, ...] each, by field name."""
        if self.rows_done != self._total:
            raise _protocol_error("result arrived after %d of %d rows" %
                                  (self.rows_done, self._total))
        return {field: out.reshape((self._batch, self._rows_per_batch) +
                                   out.shape[1:])
                for field, (_, out) in (self._outputs or {}).items()}
