#!/usr/bin/env python3
"""Writes fuzz/corpus/: small serialized klserve.v1.ComputeLossRequest seeds.

Valid requests of each kind (dense per-head and aggregated, sparse, masked,
each dtype) and a few invalid ones. The wire format is written by hand
(proto/klserve/v1/klserve.proto's field numbers), so no protobuf package is
needed. Rerun after changing it:  python3 fuzz/make_corpus.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def varint(n):
    n &= (1 << 64) - 1  # negative int64: ten-byte two's complement
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def key(field, wire):
    return varint(field << 3 | wire)


def vint(field, n):
    return key(field, 0) + varint(n)


def blob(field, data):
    return key(field, 2) + varint(len(data)) + data


def f32(field, x):
    return key(field, 5) + struct.pack("<f", x)


def f64(field, x):
    return key(field, 1) + struct.pack("<d", x)


def tensor(dtype, shape, data):
    packed = b"".join(varint(d) for d in shape)
    return blob(1, dtype.encode()) + blob(2, packed) + blob(3, data)


def fp32(values):
    return struct.pack("<%df" % len(values), *values)


def fp16(values):
    return struct.pack("<%de" % len(values), *values)


def bf16(values):
    return b"".join(struct.pack("<f", v)[2:] for v in values)


def int32(values):
    return struct.pack("<%di" % len(values), *values)


def boolean(values):
    return bytes(1 if v else 0 for v in values)


# ComputeLossRequest fields.
OPTIONS, LOGITS, WEIGHTS, SCORES, TOPK = 3, 10, 11, 12, 13
SEG_Q, SEG_KV, MASK, KPM, ROW_VALID = 14, 15, 16, 17, 18
KEY_START, KEY_END = 19, 20
QUERY, KEY, LSE, INDEX_QUERY, INDEX_KEY, INDEX_WEIGHTS = 21, 22, 23, 24, 25, 26


def projections(dtype, encode):
    """The projections of B = 1, T = 2, S = 3, H = 2, H_kv = 1, D = 2,
    H_I = 2, D_I = 2."""
    return (
        blob(QUERY, tensor(dtype, [1, 2, 2, 2], encode(ramp(8)))) +
        blob(KEY, tensor(dtype, [1, 3, 1, 2], encode(ramp(6, 0.5)))) +
        blob(INDEX_QUERY, tensor(dtype, [1, 2, 2, 2], encode(ramp(8, 1.0)))) +
        blob(INDEX_KEY, tensor(dtype, [1, 3, 2], encode(ramp(6, 0.75)))) +
        blob(INDEX_WEIGHTS, tensor(dtype, [1, 2, 2], encode(weights(4)))))


def ramp(n, scale=0.25):
    return [((i * 7) % 5 - 2) * scale for i in range(n)]


def weights(n):
    return [float((i % 3) + 1) for i in range(n)]


SEEDS = {
    # Dense, aggregated FP32 target [1, 2, 4]; row KL and diagnostics.
    "dense_weights_fp32": (
        blob(OPTIONS, vint(10, 1) + vint(11, 1) + vint(12, 2)) +
        blob(WEIGHTS, tensor("FP32", [1, 2, 4], fp32(weights(8)))) +
        blob(SCORES, tensor("FP32", [1, 2, 4], fp32(ramp(8))))),
    # Dense, per-head BF16 logits [1, 2, 2, 4], FP16 scores; causal, scale,
    # BF16 gradient, MaxText flavor, sum reduction, c = 0.01.
    "dense_logits_bf16_causal": (
        blob(OPTIONS, vint(1, 1) + f32(4, 0.5) + vint(5, 2) + vint(6, 3) +
             f64(7, 0.01) + blob(8, b"BF16")) +
        blob(LOGITS, tensor("BF16", [1, 2, 2, 4], bf16(ramp(16, 1.0)))) +
        blob(SCORES, tensor("FP16", [1, 2, 4], fp16(ramp(8))))),
    # Sparse: [1, 2, 2] slots over S = 4 keys, one empty slot.
    "sparse_topk": (
        blob(OPTIONS, vint(3, 4) + blob(8, b"FP16") + vint(10, 1)) +
        blob(WEIGHTS, tensor("FP32", [1, 2, 2], fp32([1, 2, 3, 0]))) +
        blob(SCORES, tensor("FP32", [1, 2, 2], fp32([0.5, -0.5, 1, 0]))) +
        blob(TOPK, tensor("INT32", [1, 2, 2], int32([0, 3, 2, -1])))),
    # Packed segments, key padding, row validity; mean over valid rows.
    "masked_segments": (
        blob(OPTIONS, vint(1, 1) + vint(6, 2) + vint(11, 1)) +
        blob(WEIGHTS, tensor("FP32", [2, 2, 3], fp32(weights(12)))) +
        blob(SCORES, tensor("FP32", [2, 2, 3], fp32(ramp(12)))) +
        blob(SEG_Q, tensor("INT32", [2, 2], int32([0, 1, 0, 0]))) +
        blob(SEG_KV, tensor("INT32", [2, 3], int32([0, 1, 1, 0, 0, 0]))) +
        blob(KPM, tensor("BOOL", [2, 3], boolean([1, 1, 0, 1, 1, 1]))) +
        blob(ROW_VALID, tensor("BOOL", [2, 2], boolean([1, 0, 1, 1])))),
    # A dense attention mask [1, 2, 3].
    "attention_mask": (
        blob(WEIGHTS, tensor("FP32", [1, 2, 3], fp32(weights(6)))) +
        blob(SCORES, tensor("FP32", [1, 2, 3], fp32(ramp(6)))) +
        blob(MASK, tensor("BOOL", [1, 2, 3], boolean([1, 0, 1, 0, 0, 0])))),
    # Per-row key bounds: two documents of 2 and 1 rows (THD, B = 1).
    "key_bounds": (
        blob(OPTIONS, vint(10, 1)) +
        blob(WEIGHTS, tensor("FP32", [1, 3, 3], fp32(weights(9)))) +
        blob(SCORES, tensor("FP32", [1, 3, 3], fp32(ramp(9)))) +
        blob(KEY_START, tensor("INT32", [1, 3], int32([0, 0, 2]))) +
        blob(KEY_END, tensor("INT32", [1, 3], int32([1, 2, 3])))),
    # The projections form, dense and causal, FP32; row KL.
    "projections_dense": (
        blob(OPTIONS, vint(1, 1) + vint(10, 1)) + projections("FP32", fp32)),
    # The projections form, BF16, the service's top-2 selection, no relu,
    # index_weight_scale 1, key bounds.
    "projections_server_topk": (
        blob(OPTIONS, f64(14, 1.0) + vint(15, 0) + vint(16, 2)) +
        projections("BF16", bf16) +
        blob(KEY_START, tensor("INT32", [1, 2], int32([0, 1]))) +
        blob(KEY_END, tensor("INT32", [1, 2], int32([2, 3])))),
    # The projections form with the client's indices and an lse.
    "projections_client_topk": (
        projections("FP16", fp16) +
        blob(TOPK, tensor("INT32", [1, 2, 2], int32([0, 2, 1, -1]))) +
        # [B, H, T]: each head's log-sum-exp over its row's valid slots.
        blob(LSE, tensor("FP32", [1, 2, 2], fp32([0.8868710061149, 0.5,
                                                  0.8132616875182228,
                                                  -0.25])))),
    # Invalid: the projections form mixed with indexer scores.
    "invalid_forms_mixed": (
        projections("FP32", fp32) +
        blob(SCORES, tensor("FP32", [1, 2, 3], fp32(ramp(6))))),
    # Invalid: shapes disagree.
    "invalid_shape_mismatch": (
        blob(WEIGHTS, tensor("FP32", [1, 2, 4], fp32(weights(8)))) +
        blob(SCORES, tensor("FP32", [1, 2, 3], fp32(ramp(6))))),
    # Invalid: too few bytes for the shape, unknown dtype, negative shape.
    "invalid_short_data": (
        blob(WEIGHTS, tensor("FP32", [1, 2, 4], fp32(weights(3)))) +
        blob(SCORES, tensor("FP32", [1, 2, 4], fp32(ramp(8))))),
    "invalid_dtype": (
        blob(WEIGHTS, tensor("FP64", [1, 1, 2], fp32(weights(4)))) +
        blob(SCORES, tensor("FP32", [1, 1, 2], fp32(ramp(2))))),
    "invalid_negative_shape": (
        blob(WEIGHTS, tensor("FP32", [1, -1, 2], b"")) +
        blob(SCORES, tensor("FP32", [1, -1, 2], b""))),
    # Invalid: both targets; and no target at all.
    "invalid_two_targets": (
        blob(LOGITS, tensor("FP32", [1, 1, 1, 2], fp32([0, 1]))) +
        blob(WEIGHTS, tensor("FP32", [1, 1, 2], fp32([1, 1]))) +
        blob(SCORES, tensor("FP32", [1, 1, 2], fp32([0, 1])))),
    "invalid_no_target": blob(SCORES, tensor("FP32", [1, 1, 2], fp32([0, 1]))),
    # A top-k index outside [0, S) names no key: an empty slot.
    "sparse_topk_out_of_range": (
        blob(OPTIONS, vint(3, 2)) +
        blob(WEIGHTS, tensor("FP32", [1, 1, 2], fp32([1, 1]))) +
        blob(SCORES, tensor("FP32", [1, 1, 2], fp32([0, 1]))) +
        blob(TOPK, tensor("INT32", [1, 1, 2], int32([0, 7])))),
    # Invalid: a key named twice in a row.
    "invalid_topk_repeat": (
        blob(OPTIONS, vint(3, 2)) +
        blob(WEIGHTS, tensor("FP32", [1, 1, 2], fp32([1, 1]))) +
        blob(SCORES, tensor("FP32", [1, 1, 2], fp32([0, 1]))) +
        blob(TOPK, tensor("INT32", [1, 1, 2], int32([1, 1])))),
}


def main():
    out = os.path.join(HERE, "corpus")
    os.makedirs(out, exist_ok=True)
    for name, data in sorted(SEEDS.items()):
        with open(os.path.join(out, name + ".bin"), "wb") as f:
            f.write(data)
    print("wrote %d seeds to %s" % (len(SEEDS), out))


if __name__ == "__main__":
    main()
