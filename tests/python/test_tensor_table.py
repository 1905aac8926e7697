"""The Python client's tensor table against the generated proto descriptor:
a tensor added to the proto but not to klserve._tensor_table (or given the
wrong role there) fails here, not quietly in a request that leaves it out."""

import dataclasses
import inspect

from google.protobuf.descriptor import FieldDescriptor

import klserve
import klserve.jax
from klserve._tensor_table import (INDEXER_GRADS, INDEXER_INPUTS, PROJECTIONS,
                                   TENSORS, Form, Role, names)
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
    assert fields_of(pb2.StreamHeader, type_name="klserve.v1.Tensor") == (
        table(Role.SMALL) | table(Role.KEY_SIDE))


def test_the_key_side_is_whole_in_the_header_and_the_query_side_in_blocks():
    assert table(Role.KEY_SIDE) == {"key", "index_key"}
    query_side = set(PROJECTIONS) - table(Role.KEY_SIDE) | {"lse"}
    assert query_side <= table(Role.PER_ROW)
    block = {f.name for f in pb2.RowBlock.DESCRIPTOR.fields}
    assert query_side <= block and not table(Role.KEY_SIDE) & block


def test_the_indexer_gradients_are_response_tensors():
    assert set(INDEXER_INPUTS) <= set(PROJECTIONS)
    assert set(INDEXER_GRADS) | {"grad", "row_kl", "topk_indices"} == (
        fields_of(pb2.ComputeLossResponse, type_name="klserve.v1.Tensor"))


def test_the_options_of_the_call_are_loss_options_or_the_clients():
    proto = {f.name for f in pb2.LossOptions.DESCRIPTOR.fields}
    call = {f.name for f in dataclasses.fields(klserve.ComputeLossOptions)}
    # Named for Python, tags and the transport: the rest is the proto's.
    renamed = {"want_grad": "skip_grad"}
    not_options = {"run", "step", "layer", "microbatch", "request_id",
                   "stream", "copy_outputs", "deadline"}
    assert {renamed.get(n, n) for n in call - not_options} == proto


def test_row_blocks_carry_the_per_row_tensors():
    assert fields_of(pb2.RowBlock, scalar_type=FieldDescriptor.TYPE_BYTES) == (
        table(Role.PER_ROW))


def test_per_row_layouts_have_b_first_and_t():
    for t in TENSORS:
        if t.role is Role.PER_ROW:
            assert t.layout[0] == "B" and "T" in t.layout, t.name


def test_the_loss_calls_take_every_tensor_of_their_form():
    def parameters(function):
        return set(inspect.signature(function).parameters)

    assert table() <= parameters(klserve.Client.compute_loss)
    for function in (klserve.Client.compute_loss_from_projections,
                     klserve.jax.indexer_kl_loss_from_projections):
        assert set(names(Form.PROJECTIONS)) <= parameters(function), function
        assert not set(names(Form.LOGITS)) - set(names(Form.PROJECTIONS)) & (
            parameters(function)), function
    logits = parameters(klserve.jax.indexer_kl_loss)
    assert set(names(Form.LOGITS)) <= logits
    assert not set(PROJECTIONS) & logits
