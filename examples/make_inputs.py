#!/usr/bin/env python3
"""Writes random inputs for the README's `klctl loss` lines, in this folder or --out.

The logits form: target.npy (head-aggregated attention weights, [B, T, S],
each causal row a distribution) and scores.npy (indexer scores, [B, T, S]).
The projections form: q.npy [B, T, H, D], k.npy [B, S, H_kv, D], qi.npy
[B, T, H_I, D_I], ki.npy [B, S, D_I] and w.npy [B, T, H_I]. All float32.
Needs NumPy only.
"""

import argparse
import os

import numpy as np


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".", help="folder to write into")
    parser.add_argument("--seq", type=int, default=2048,
                        help="T = S of the logits form (default 2048)")
    parser.add_argument("--projections_seq", type=int, default=4096,
                        help="T = S of the projections form (default 4096)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    os.makedirs(args.out, exist_ok=True)

    def save(name, array):
        path = os.path.join(args.out, name)
        np.save(path, array.astype(np.float32))
        print(f"{path}: {list(array.shape)} float32")

    # Causal rows: key s <= t carries the target's mass, the rest is 0.
    n = args.seq
    weights = rng.random((1, n, n), dtype=np.float32)
    weights *= np.tril(np.ones((n, n), dtype=np.float32))
    weights /= weights.sum(axis=-1, keepdims=True)
    save("target.npy", weights)
    save("scores.npy", rng.standard_normal((1, n, n), dtype=np.float32))

    # DeepSeek-V3.2-like heads, scaled down: 4 query heads over one key head,
    # and an indexer of 4 heads of 32.
    m = args.projections_seq
    save("q.npy", rng.standard_normal((1, m, 4, 64), dtype=np.float32) / 8)
    save("k.npy", rng.standard_normal((1, m, 1, 64), dtype=np.float32))
    save("qi.npy", rng.standard_normal((1, m, 4, 32), dtype=np.float32))
    save("ki.npy", rng.standard_normal((1, m, 32), dtype=np.float32))
    save("w.npy", rng.standard_normal((1, m, 4), dtype=np.float32))


if __name__ == "__main__":
    main()
