"""POSIX shared-memory regions for ComputeLoss's tensors (docs/shared-memory.md
of the klserve repository).

A SharedMemoryRegion is a file of /dev/shm this process creates and maps;
NumPy views of it (region.array) are arrays whose bytes the server reads and
writes in place once the region is registered with it:

    with klserve.SharedMemoryRegion(64 << 20) as region:
        region.register(client)
        scores = region.array(0, (1, 4096, 4096), np.float32)
        scores[...] = ...            # written in place, no copy
        r = client.compute_loss(scores, attention_weights=w)

Client(shared_memory=True) makes and reuses such regions itself; this type
is for a job that wants its inputs to live in shared memory from the start.
"""

import errno
import mmap
import os
import secrets
import weakref
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

from klserve import _shm_reaper

# Where Linux keeps POSIX shared-memory objects: shm_open("/name") is the
# file /dev/shm/name, which is what the server opens for a key.
SHM_DIR = "/dev/shm"

# The alignment of every slice this package lays out itself: a cache line,
# which is also a multiple of every element size the wire has.
ALIGNMENT = 64


def aligned(offset: int, alignment: int = ALIGNMENT) -> int:
    """offset rounded up to a multiple of alignment."""
    return -(-offset // alignment) * alignment


def unique_key(prefix: str = "klserve") -> str:
    """A fresh object name: prefix, this process's pid, 64 random bits. The
    server's rule for keys and names (1-64 of [A-Za-z0-9._-]) holds for the
    default prefix, so the key can be the region's name too."""
    return "%s-%d-%s" % (prefix, os.getpid(), secrets.token_hex(8))


def _unlink(path: str, owner_pid: int) -> None:
    """Removes the file `owner_pid` created, in that process only: a child
    forked from it holds copies of its regions, and their finalizers run at
    the child's exit, but the file is still its parent's."""
    if os.getpid() != owner_pid:
        return
    # The helper hears first: told after, it could take back the word of a
    # thread that makes the same key again in between.
    _shm_reaper.removed(path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class SharedMemoryRegion:
    """A POSIX shared-memory object of `byte_size` bytes, created (never
    opened: an existing name is an error), mapped read-write and owned by
    this object: close() (or leaving a `with`, or garbage collection, or
    the interpreter's exit) unregisters it from the server it was
    registered with, unlinks the file and unmaps it.

    `key`: the object's name under /dev/shm (default: klserve-<pid>-<random>);
    `mode`: its permission bits, 0600 by default: the server must run as
    the same user. A server in another container of the same pod needs the
    same uid, or a group and mode 0660.

    Arrays from array() are views of the mapping: they stay valid after
    close() (the mapping is unmapped when the last of them goes), but the
    server no longer sees them.
    """

    def __init__(self, byte_size: int, *, key: Optional[str] = None,
                 mode: int = 0o600) -> None:
        byte_size = int(byte_size)
        if byte_size < 1:
            raise ValueError("byte_size: must be >= 1, got %d" % byte_size)
        self.key = key if key is not None else unique_key()
        if (not self.key or len(self.key) > 255 or self.key.startswith(".")
                or not all(ch.isascii() and (ch.isalnum() or ch in "._-")
                           for ch in self.key)):
            raise ValueError(
                "key: 1 to 255 of A-Z a-z 0-9 . _ -, not starting with '.', "
                "got %r" % (self.key,))
        self.byte_size = byte_size
        self.path = os.path.join(SHM_DIR, self.key)
        # O_EXCL: a name somebody else holds is never reused; O_NOFOLLOW: a
        # symlink planted under the name is refused rather than followed.
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR |
                     os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        self._owner_pid = os.getpid()
        # At once, so that a job killed while it sizes and maps the file
        # leaves none (the helper removes it).
        _shm_reaper.created(self.path)
        try:
            os.fchmod(fd, mode)  # the umask may have taken bits off
            os.ftruncate(fd, byte_size)
            try:
                # Takes the pages now: a tmpfs too small for them (a
                # container's 64 MiB /dev/shm) then fails here, with
                # ENOSPC, rather than with SIGBUS at the first write.
                os.posix_fallocate(fd, 0, byte_size)
            except OSError as e:
                if e.errno not in (errno.EOPNOTSUPP, errno.ENOSYS,
                                   errno.EINVAL):
                    raise
            self._mmap: Optional[mmap.mmap] = mmap.mmap(
                fd, byte_size, flags=mmap.MAP_SHARED,
                prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            _unlink(self.path, self._owner_pid)
            raise
        os.close(fd)  # the mapping keeps the object; the server opens its own
        # Where the mapping starts, to tell whether an array is a view of
        # it (contains).
        probe = np.ndarray((1,), np.uint8, buffer=self._mmap)
        self._address = probe.ctypes.data
        del probe
        self._registration: Optional[Tuple[Any, str]] = None  # (client, name)
        # Garbage collection and interpreter exit unlink the file; the
        # registration then ends with its lease.
        self._finalizer = weakref.finalize(self, _unlink, self.path,
                                           self._owner_pid)

    # -- views -------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._mmap is None

    def array(self, offset: int, shape: Union[int, Sequence[int]],
              dtype: npt.DTypeLike) -> np.ndarray:
        """A C-contiguous, writable NumPy view of the region: `shape` of
        `dtype` from byte `offset`, which must be a multiple of the dtype's
        element size (the server's rule for slices; the dtype's own
        alignment in memory follows, the mapping being page-aligned). Its
        .base is the region's mmap."""
        if self._mmap is None:
            raise ValueError("region %s: closed" % self.key)
        dtype = np.dtype(dtype)
        shape = (int(shape),) if np.isscalar(shape) else tuple(
            int(d) for d in shape)
        offset = int(offset)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if offset < 0 or offset % dtype.itemsize:
            raise ValueError("offset: must be a non-negative multiple of "
                             "%d (%s), got %d" % (dtype.itemsize, dtype,
                                                  offset))
        if any(d < 0 for d in shape) or offset + nbytes > self.byte_size:
            raise ValueError("%s %s at offset %d: past the region's %d bytes"
                             % (dtype, list(shape), offset, self.byte_size))
        return np.ndarray(shape, dtype, buffer=self._mmap, offset=offset)

    def offset_of(self, array: np.ndarray) -> Optional[int]:
        """The byte offset of `array` in the region when it is a
        C-contiguous view of it (its bytes in the region, element-aligned),
        else None."""
        if self._mmap is None or not isinstance(array, np.ndarray):
            return None
        if not array.flags.c_contiguous:
            return None
        offset = array.ctypes.data - self._address
        if offset < 0 or offset + array.nbytes > self.byte_size:
            return None
        if offset % max(array.dtype.itemsize, 1):
            return None
        return offset

    # -- the server --------------------------------------------------------

    @property
    def name(self) -> Optional[str]:
        """The name it is registered under, or None."""
        return self._registration[1] if self._registration else None

    def register(self, client: Any, name: Optional[str] = None) -> int:
        """Registers the whole region with the client's server under `name`
        (default: the key) and returns the lease in seconds. The client
        then recognises arrays of this region in compute_loss and sends
        them by reference, with no copy."""
        if self._mmap is None:
            raise ValueError("region %s: closed" % self.key)
        name = name if name is not None else self.key
        lease = client.register_region(name, self.key, 0, self.byte_size)
        self._registration = (client, name)
        client._adopt_region(self)  # pylint: disable=protected-access
        return lease

    def unregister(self) -> None:
        """Unregisters it from the server (FAILED_PRECONDITION while calls
        use it). A no-op when not registered."""
        if self._registration is None:
            return
        client, name = self._registration
        client._forget_region(self)  # pylint: disable=protected-access
        self._registration = None
        client.unregister_region(name)

    def close(self) -> None:
        """Unregisters (best effort: a server gone or unreachable leaves it
        to the lease), unlinks and unmaps. Idempotent."""
        if self._mmap is None:
            return
        if self._registration is not None:
            client, name = self._registration
            self._registration = None
            client._drop_region(self, name)  # pylint: disable=protected-access
        # Never mmap.close(): NumPy views hold the mmap object (their .base)
        # but not a buffer export, so closing would unmap memory they still
        # point at. Dropping the reference unmaps it with the last view.
        self._mmap = None
        self._finalizer.detach()
        _unlink(self.path, self._owner_pid)

    def __enter__(self) -> "SharedMemoryRegion":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return "SharedMemoryRegion(key=%r, byte_size=%d%s)" % (
            self.key, self.byte_size, ", closed" if self.closed else "")


__all__ = ["ALIGNMENT", "SharedMemoryRegion", "aligned", "unique_key"]
