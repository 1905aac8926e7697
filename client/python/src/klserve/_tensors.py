"""NumPy arrays to and from the wire's Tensor (raw little-endian bytes, a
dtype name and a shape)."""

import sys

import ml_dtypes
import numpy as np

from klserve._errors import invalid_argument

BF16 = np.dtype(ml_dtypes.bfloat16)
FP32 = np.dtype("<f4")
FP16 = np.dtype("<f2")
FP64 = np.dtype("<f8")
INT32 = np.dtype("<i4")
BOOL = np.dtype("bool")

# Wire names of the float inputs / gradients and their NumPy dtypes.
FLOAT_DTYPES = {"FP32": FP32, "BF16": BF16, "FP16": FP16}
WIRE_DTYPES = dict(FLOAT_DTYPES, FP64=FP64, INT32=INT32, BOOL=BOOL)

_GRAD_NAMES = {
    "fp32": "FP32", "float32": "FP32", "f32": "FP32",
    "bf16": "BF16", "bfloat16": "BF16",
    "fp16": "FP16", "float16": "FP16", "f16": "FP16", "half": "FP16",
}


def wire_name_of_float(dtype):
    """The wire name of a float dtype, or None."""
    dtype = np.dtype(dtype)
    if dtype == BF16:
        return "BF16"
    if dtype.kind == "f" and dtype.itemsize == 4:
        return "FP32"
    if dtype.kind == "f" and dtype.itemsize == 2:
        return "FP16"
    return None


def wrapper_grad_name(options, input_names):
    """The wire name of the gradient dtype a JAX or torch wrapper asks the
    service for: the caller's `grad_dtype` (taken out of `options`), else
    one from the wire names (None for float64) of the inputs it
    differentiates: theirs when they share FP32 or BF16, else FP32. Not
    FP16: a wrapper keeps the gradient from the forward pass and
    multiplies it by the cotangent only in backward, and fp16 training
    scales the loss there (a GradScaler's 2^16), so an FP16 c / N (q - p)
    would underflow to 0 before the scale could lift it. The wrapper casts
    the product to the input's dtype."""
    chosen = options.pop("grad_dtype", None)
    if chosen is not None:
        return grad_wire_name(chosen)
    names = set(input_names)
    if len(names) == 1 and names <= {"FP32", "BF16"}:
        return names.pop()
    return "FP32"


def grad_wire_name(grad_dtype):
    """"FP32", "BF16" or "FP16" from a NumPy or PyTorch dtype, or a name such
    as "bf16"."""
    if grad_dtype is None:
        return "FP32"
    torch = sys.modules.get("torch")
    text = grad_dtype
    if torch is not None and isinstance(grad_dtype, torch.dtype):
        text = str(grad_dtype).rpartition(".")[2]  # torch.float16
    if isinstance(text, str):
        name = _GRAD_NAMES.get(text.lower())
        if name is not None:
            return name
        if text.upper() in FLOAT_DTYPES:
            return text.upper()
    else:
        try:
            name = wire_name_of_float(grad_dtype)
        except TypeError:
            name = None
        if name is not None:
            return name
    raise invalid_argument(
        "grad_dtype: must be float32, bfloat16 or float16 (a NumPy or "
        "PyTorch dtype, or 'fp32', 'bf16', 'fp16'), got %r" % (grad_dtype,))


def host_array(field, value):
    """`value` as a NumPy array in host memory: a PyTorch tensor detached and
    copied to the host as needed (bfloat16 as ml_dtypes.bfloat16), anything
    else as np.asarray takes it; INVALID_ARGUMENT naming the field when it
    is neither. A device's own error while copying (CUDA's) is raised as
    it is."""
    torch = sys.modules.get("torch")  # a tensor's module is imported already
    if torch is not None and isinstance(value, torch.Tensor):
        if value.device.type == "meta":
            raise invalid_argument(
                "%s: a tensor on the 'meta' device holds no values" % field)
        tensor = value.detach().cpu().contiguous()
        if tensor.dtype == torch.bfloat16:
            return tensor.view(torch.int16).numpy().view(BF16)
        try:
            return tensor.numpy()
        except TypeError as e:  # a dtype NumPy has none of (float8, ...)
            raise invalid_argument("%s: cannot be read as an array: %s" %
                                   (field, e)) from e
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as e:
        raise invalid_argument("%s: cannot be read as an array: %s" %
                               (field, e)) from e


def _little_endian(arr):
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return np.ascontiguousarray(arr)


def not_a_float(field, dtype):
    """The refusal of a float input given in another dtype."""
    return invalid_argument(
        "%s: dtype must be float32, float16 or bfloat16, got %s" %
        (field, dtype))


def float_input(field, value):
    """A float tensor as float32, float16 or bfloat16 (float64 is narrowed to
    float32, the precision the service computes in)."""
    arr = host_array(field, value)
    name = wire_name_of_float(arr.dtype)
    if name is None:
        if arr.dtype.kind == "f" and arr.dtype.itemsize == 8:
            arr = arr.astype(FP32)
            name = "FP32"
        else:
            raise not_a_float(field, arr.dtype)
    return name, _little_endian(arr)


def fp32_input(field, value):
    """A float tensor the wire takes as float32 only (lse): float16 and
    bfloat16 are widened, exactly; float64 is narrowed."""
    arr = host_array(field, value)
    if arr.dtype != BF16 and arr.dtype.kind != "f":
        raise invalid_argument("%s: dtype must be float32, got %s" %
                               (field, arr.dtype))
    return "FP32", _little_endian(arr.astype(FP32, copy=False))


def _integer_array(field, value):
    arr = host_array(field, value)
    if arr.dtype.kind not in "iu":
        raise invalid_argument(
            "%s: dtype must be an integer type (sent as int32), got %s" %
            (field, arr.dtype))
    return arr


def _outside_int32(arr):
    return (arr < np.iinfo(np.int32).min) | (arr > np.iinfo(np.int32).max)


def _fits_int32(arr):
    """Whether every value fits int32, from the extremes alone (no mask of
    the array's size)."""
    return not arr.size or (int(arr.min()) >= np.iinfo(np.int32).min and
                            int(arr.max()) <= np.iinfo(np.int32).max)


def int32_input(field, value):
    arr = _integer_array(field, value)
    if arr.dtype != INT32:
        if not _fits_int32(arr):
            raise invalid_argument("%s: values must fit in int32" % field)
        arr = arr.astype(INT32)
    return "INT32", _little_endian(arr)


def index_input(field, value):
    """Key indices (topk_indices), sent as int32. An index outside [0, S) is
    an empty slot whatever its value (docs/spec.md), and every index outside
    int32 is outside [0, S): it goes as -1, the same empty slot, so that an
    int64 table with a sentinel such as int64's max is taken as it is."""
    arr = _integer_array(field, value)
    if arr.dtype != INT32:
        given = arr
        arr = given.astype(INT32)  # wraps where outside, set just below
        if not _fits_int32(given):
            arr[_outside_int32(given)] = -1
    return "INT32", _little_endian(arr)


def bool_input(field, value):
    arr = host_array(field, value)
    if arr.dtype != BOOL:
        if arr.dtype.kind not in "iub":
            raise invalid_argument(
                "%s: dtype must be bool (or integer, nonzero is true), got %s"
                % (field, arr.dtype))
        arr = arr != 0
    return "BOOL", np.ascontiguousarray(arr)


def to_tensor(pb2, name, arr):
    return pb2.Tensor(dtype=name, shape=list(arr.shape), data=arr.tobytes())


def to_spec(pb2, name, arr):
    return pb2.TensorSpec(dtype=name, shape=list(arr.shape))


def from_tensor(tensor, field, writable=True):
    """A response Tensor as a NumPy array: writable (a copy of the message's
    bytes), or without that copy a read-only view of them."""
    dtype = WIRE_DTYPES.get(tensor.dtype)
    if dtype is None:
        raise _protocol_error("%s: unknown dtype %r" % (field, tensor.dtype))
    shape = tuple(tensor.shape)
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if len(tensor.data) != count * dtype.itemsize:
        raise _protocol_error("%s: %d bytes for %s %s" % (
            field, len(tensor.data), tensor.dtype, list(shape)))
    arr = np.frombuffer(tensor.data, dtype=dtype).reshape(shape)
    return arr.copy() if writable else arr


def _protocol_error(what):
    import grpc
    from klserve._errors import KlserveError
    return KlserveError(grpc.StatusCode.INTERNAL,
                        "server broke the protocol: " + what)
