"""The Python client's tensor table against the generated proto descriptor:
a tensor added to the proto but not to klserve._tensor_table (or given the
wrong role there) fails here, not quietly in a request that leaves it out."""

import inspect

from google.protobuf.descriptor import FieldDescriptor

import klserve
import klserve.jax
from klserve._tensor_table import TENSORS, Role
from klserve.v1 import klserve_pb2 as pb2


def fields_of(message, *, type_name=None, scalar_type=None):
    """Names of the message's fields of a message type or a scalar type."""
    return {f.name for f in message.DESCRIPTOR.fields
            if (type_name is not None and f.message_type is not None and
                f.message_type.full_name == type_name) or
            (scalar_type is not None and f.type == scalar_type)}


def table(role=None):
    return {t.name for t in TENSORS if role is None or t.role is role}


def test_every_request_tensor_is_in_the_table():
    assert fields_of(pb2.ComputeLossRequest,
                     type_name="klserve.v1.Tensor") == table()
    assert len(TENSORS) == len(table())  # no name twice


def test_stream_header_carries_each_tensor_as_its_role_says():
    assert fields_of(pb2.StreamHeader,
                     type_name="klserve.v1.TensorSpec") == table(Role.PER_ROW)
    assert fields_of(pb2.StreamHeader,
                     type_name="klserve.v1.Tensor") == table(Role.SMALL)


def test_row_blocks_carry_the_per_row_tensors():
    assert fields_of(pb2.RowBlock, scalar_type=FieldDescriptor.TYPE_BYTES) == (
        table(Role.PER_ROW))


def test_per_row_layouts_have_b_first_and_t():
    for t in TENSORS:
        if t.role is Role.PER_ROW:
            assert t.layout[0] == "B" and "T" in t.layout, t.name


def test_the_loss_calls_take_every_tensor():
    for function in (klserve.Client.compute_loss,
                     klserve.jax.indexer_kl_loss):
        assert table() <= set(inspect.signature(function).parameters), (
            function)
