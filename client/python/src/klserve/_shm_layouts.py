"""How Client(shared_memory=True) lays a call out in a region: what a
call's outputs are (which a stream's blocks are sized by too), and the pool
of regions kept for reuse, one per call shape."""

import collections
import dataclasses
import math
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from klserve._tensor_table import BY_NAME, INDEXER_INPUTS, QUERY, SCORES
from klserve._tensors import FLOAT_DTYPES, FP64, INT32
from klserve.shared_memory import SharedMemoryRegion, aligned


# A slot: (byte offset in the region, NumPy dtype, shape).
Slot = Tuple[int, np.dtype, Tuple[int, ...]]


def output_specs(tensors: Dict[str, Tuple[str, np.ndarray]], options: Any
                 ) -> Optional[Dict[str, Tuple[str, np.dtype,
                                               Tuple[int, ...]]]]:
    """The outputs the call produces, field of OutputRegions -> (wire
    dtype, NumPy dtype, shape), as the server will shape them; None for a
    call whose shapes are too malformed to tell (the server then names the
    field, inline)."""
    if any(arr.size == 0 for _, arr in tensors.values()):
        return None
    grad_name = options.grad_dtype or "FP32"
    grad_dtype = FLOAT_DTYPES[grad_name]
    specs: Dict[str, Tuple[str, np.dtype, Tuple[int, ...]]] = {}
    if QUERY in tensors:
        query = tensors[QUERY][1]
        if query.ndim != len(BY_NAME[QUERY].layout) or any(
                name not in tensors for name in INDEXER_INPUTS):
            return None
        rows = query.shape[:2]
        if not options.skip_grad:
            for name in INDEXER_INPUTS:
                specs["d_" + name] = (grad_name, grad_dtype,
                                      tensors[name][1].shape)
        if options.topk > 0:
            specs["topk_indices"] = ("INT32", INT32, rows + (options.topk,))
    else:
        if (SCORES not in tensors or
                tensors[SCORES][1].ndim != len(BY_NAME[SCORES].layout)):
            return None
        scores = tensors[SCORES][1]
        rows = scores.shape[:2]
        if not options.skip_grad:
            specs["grad"] = (grad_name, grad_dtype, scores.shape)
    if options.want_row_kl:
        specs["row_kl"] = ("FP64", FP64, rows)
    return specs


def answer_row_bytes(tensors: Dict[str, Tuple[str, np.ndarray]],
                     options: Any) -> int:
    """Bytes of one (b, t) row's answer in a stream's GradBlock: each
    output the call produces but d_index_key, which the last message
    carries whole; 0 for shapes too malformed to tell."""
    specs = output_specs(tensors, options) or {}
    return sum(math.prod(shape[2:]) * dtype.itemsize
               for field, (_, dtype, shape) in specs.items()
               if field != "d_index_key")


@dataclasses.dataclass
class Layout:
    """One region holding a call shape's inputs and outputs, each at a
    64-byte aligned offset."""
    region: SharedMemoryRegion
    inputs: Dict[str, Slot]
    outputs: Dict[str, Slot]
    busy: bool = False

    @property
    def name(self) -> str:
        return self.region.key  # registered under its key


def plan(inputs: Dict[str, Tuple[np.dtype, Tuple[int, ...]]],
         outputs: Dict[str, Tuple[np.dtype, Tuple[int, ...]]]
         ) -> Tuple[int, Dict[str, Slot], Dict[str, Slot]]:
    """(region bytes, input slots, output slots): the tensors one after
    another, each from a multiple of 64 bytes."""
    offset = 0
    slots: List[Dict[str, Slot]] = [{}, {}]
    for table, specs in zip(slots, (inputs, outputs)):
        for field, (dtype, shape) in specs.items():
            offset = aligned(offset)
            table[field] = (offset, dtype, shape)
            offset += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return max(offset, 1), slots[0], slots[1]


class LayoutPool:
    """The layouts a client keeps, by call shape, most recently used last.
    A layout serves one call at a time (busy); a call that finds all of
    its shape's layouts busy gets a new one. Past `capacity` layouts, idle
    ones are closed, least recently used first."""

    def __init__(self, capacity: int,
                 close: Callable[[Layout], None]) -> None:
        self.capacity = capacity
        self._close = close
        self._lock = threading.Lock()
        self._layouts: "collections.OrderedDict[Any, List[Layout]]" = (
            collections.OrderedDict())

    def empty_copy(self) -> "LayoutPool":
        """A pool of the same capacity and close function, with no layout
        (a forked child's, which must not touch its parent's)."""
        return LayoutPool(self.capacity, self._close)

    def take(self, key: Any) -> Optional[Layout]:
        """An idle layout of this shape, now busy; None when none is."""
        with self._lock:
            for layout in self._layouts.get(key, ()):
                if not layout.busy:
                    layout.busy = True
                    self._layouts.move_to_end(key)
                    return layout
        return None

    def add(self, key: Any, layout: Layout) -> None:
        """Adds a new (busy) layout, closing idle ones past capacity."""
        with self._lock:
            layout.busy = True
            self._layouts.setdefault(key, []).append(layout)
            self._layouts.move_to_end(key)
            victims = self._over_capacity()
        for victim in victims:
            self._close(victim)

    def give_back(self, layout: Layout) -> None:
        with self._lock:
            layout.busy = False

    def discard(self, key: Any, layout: Layout) -> None:
        """Drops a layout (its region is closed by the caller)."""
        with self._lock:
            self._remove(key, layout)

    def drop_idle(self) -> int:
        """Closes every idle layout; returns how many."""
        with self._lock:
            victims = [(key, layout) for key, group in self._layouts.items()
                       for layout in group if not layout.busy]
            for key, layout in victims:
                self._remove(key, layout)
        for _, layout in victims:
            self._close(layout)
        return len(victims)

    def close_all(self) -> None:
        with self._lock:
            victims = [layout for group in self._layouts.values()
                       for layout in group]
            self._layouts.clear()
        for layout in victims:
            self._close(layout)

    def regions(self) -> List[SharedMemoryRegion]:
        with self._lock:
            return [layout.region for group in self._layouts.values()
                    for layout in group]

    def _remove(self, key: Any, layout: Layout) -> None:
        group = self._layouts.get(key, [])
        if layout in group:
            group.remove(layout)
        if not group:
            self._layouts.pop(key, None)

    def _over_capacity(self) -> List[Layout]:
        count = sum(len(group) for group in self._layouts.values())
        victims = []
        for key in list(self._layouts):
            for layout in list(self._layouts[key]):
                if count <= self.capacity:
                    return victims
                if not layout.busy:
                    self._remove(key, layout)
                    victims.append(layout)
                    count -= 1
        return victims
