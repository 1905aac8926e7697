#!/usr/bin/env python3
"""Trains a toy lightning indexer against a running klserve.

A fixed "main attention" (per-head causal logits from fixed random
projections of token and position embeddings) is the target; a toy
DeepSeek-style lightning indexer,

    score[t, s] = sum_j w[t, j] * relu(q[t, j] . k[s]),
    q = x Wq (H_I heads), k = x Wk (one key head), w = x Ww,

(plus a bias on w) learns to match it through klserve's KL loss: the loss and the gradient with
respect to the indexer scores come from the service (klserve.jax, a
jax.custom_vjp over jax.pure_callback), the rest of the backward pass is
JAX's, and the update is optax's Adam (cosine decay). Every step draws fresh synthetic
tokens. Requests are tagged run/step/layer, so the loss can be watched in
the server's Prometheus metrics (klserve_indexer_loss{run=...}) or its
TensorBoard files (--tensorboard_dir).

    python examples/train_toy_indexer.py --target=localhost:50051

Needs: pip install ./client/python jax optax
"""

import argparse
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import klserve
from klserve.jax import indexer_kl_loss


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target",
                   default=os.environ.get("KLSERVE_TARGET", "localhost:50051"))
    p.add_argument("--run", default=None,
                   help="the run tag (default toy_indexer-YYYYmmdd-HHMMSS: "
                   "a run's steps must not go back, so reruns get new names)")
    p.add_argument("--layer", type=int, default=0)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--print_every", type=int, default=25)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--d_model", type=int, default=32)
    p.add_argument("--heads", type=int, default=4, help="main attention heads")
    p.add_argument("--indexer_heads", type=int, default=8)
    p.add_argument("--indexer_dim", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-2,
                   help="Adam's peak learning rate (cosine decay)")
    p.add_argument("--sharpness", type=float, default=2.0,
                   help="multiplies the main attention logits")
    p.add_argument("--scaling_factor", type=float, default=0.01,
                   help="the loss coefficient c (MaxText/Megatron use 0.01)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main():
    args = parse_args()
    if args.run is None:
        args.run = time.strftime("toy_indexer-%Y%m%d-%H%M%S")
    client = klserve.Client(args.target, deadline=30.0)
    if not client.health():
        sys.exit("klserve at %s is not SERVING" % args.target)
    info = client.server_info()
    print("klserve %s at %s: %s backend, %s; run %r, layer %d" % (
        info.version, args.target, info.backend, info.device, args.run,
        args.layer))

    B, T, V, D = args.batch, args.seq, args.vocab, args.d_model
    H, HI, DI = args.heads, args.indexer_heads, args.indexer_dim
    DH = 16  # main attention head dim

    # The fixed world: embeddings and the main attention's projections.
    k_world, k_init, k_data = jax.random.split(jax.random.PRNGKey(args.seed),
                                               3)
    kw = jax.random.split(k_world, 4)
    tok_emb = jax.random.normal(kw[0], (V, D))
    pos_emb = 0.5 * jax.random.normal(kw[1], (T, D))
    main_wq = jax.random.normal(kw[2], (H, D, DH)) / math.sqrt(D)
    main_wk = jax.random.normal(kw[3], (H, D, DH)) / math.sqrt(D)

    def embed(tokens):
        return tok_emb[tokens] + pos_emb[None]  # [B, T, D]

    def main_attention_logits(x):  # [B, H, T, S], causal mask by the service
        q = jnp.einsum("btd,hde->bhte", x, main_wq)
        k = jnp.einsum("bsd,hde->bhse", x, main_wk)
        return args.sharpness * jnp.einsum("bhte,bhse->bhts", q, k) / math.sqrt(DH)

    ki = jax.random.split(k_init, 3)
    params = {
        "wq": 0.3 * jax.random.normal(ki[0], (D, HI, DI)) / math.sqrt(D),
        "wk": 0.3 * jax.random.normal(ki[1], (D, DI)) / math.sqrt(D),
        "ww": 0.3 * jax.random.normal(ki[2], (D, HI)) / math.sqrt(D),
        "bw": jnp.full((HI,), 1.0 / HI),
    }

    def indexer_scores(params, x):  # [B, T, S]
        q = jnp.einsum("btd,dje->btje", x, params["wq"])
        k = jnp.einsum("bsd,de->bse", x, params["wk"])
        w = jnp.einsum("btd,dj->btj", x, params["ww"]) + params["bw"]
        dots = jax.nn.relu(jnp.einsum("btje,bse->btjs", q, k))
        return jnp.einsum("btj,btjs->bts", w, dots)

    optimizer = optax.adam(optax.cosine_decay_schedule(args.lr, args.steps))
    opt_state = optimizer.init(params)

    @jax.jit
    def train_step(params, opt_state, key, step):
        tokens = jax.random.randint(key, (B, T), 0, V)
        x = embed(tokens)
        target = jax.lax.stop_gradient(main_attention_logits(x))

        def loss_fn(params):
            return indexer_kl_loss(
                indexer_scores(params, x), attention_logits=target,
                causal=True, scaling_factor=args.scaling_factor,
                client=client, run=args.run, step=step, layer=args.layer)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    losses = []
    start = time.monotonic()
    for step in range(args.steps):
        k_data, key = jax.random.split(k_data)
        params, opt_state, loss = train_step(params, opt_state, key,
                                             jnp.int32(step))
        losses.append(float(loss))
        if step % args.print_every == 0 or step == args.steps - 1:
            print("step %4d  indexer_loss %.6f  (KL %.4f nats)" % (
                step, losses[-1], losses[-1] / args.scaling_factor),
                flush=True)
    published = client.finish_step(args.run, args.steps - 1)
    elapsed = time.monotonic() - start

    window = max(1, min(10, args.steps // 10))
    first = float(np.mean(losses[:window]))
    last = float(np.mean(losses[-window:]))
    print("%d steps in %.1f s; loss (mean of %d steps) first %.6f, last "
          "%.6f (%.0f%% lower); server published step %d: %.6f" % (
              args.steps, elapsed, window, first, last,
              100 * (1 - last / first), args.steps - 1,
              published.indexer_loss))
    assert last < 0.5 * first, "the indexer loss did not fall"


if __name__ == "__main__":
    main()
