#!/usr/bin/env python3
"""Trains a toy lightning indexer against a running klserve.

A fixed "main attention" (causal, per head, with fixed random projections
q, k of token and position embeddings) is the target; a toy DeepSeek-style
lightning indexer,

    score[t, s] = sum_j w[t, j] * relu(q_I[t, j] . k_I[s]),
    q_I = x Wq_I (H_I heads), k_I = x Wk_I (one key head), w = x W_w,

(plus a bias on w) learns to match it through klserve's KL loss. By
default (--form=projections) the job sends what it holds, the main
attention's q and k (detached) and the indexer's q_I, k_I and w; the
service recomputes the logits and the scores and returns the gradients of
q_I, k_I and w (klserve.jax.indexer_kl_loss_from_projections, a
jax.custom_vjp over jax.pure_callback), and JAX's backward pass carries
them into Wq_I, Wk_I and W_w. --form=logits sends the materialised logits
[B, H, T, S] and scores [B, T, S] instead (klserve.jax.indexer_kl_loss).
The update is optax's Adam (cosine decay). Every step draws fresh
synthetic tokens. Requests are tagged run/step/layer, so the loss can be
watched in the server's Prometheus metrics (klserve_indexer_loss{run=...})
or its TensorBoard files (--tensorboard_dir).

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
from klserve.jax import indexer_kl_loss, indexer_kl_loss_from_projections


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
    p.add_argument("--form", choices=("projections", "logits"),
                   default="projections",
                   help="send the projections (the service recomputes the "
                   "logits and scores) or the materialised logits and "
                   "scores")
    return p.parse_args()


def main():
    args = parse_args()
    if args.run is None:
        args.run = time.strftime("toy_indexer-%Y%m%d-%H%M%S")
    client = klserve.Client(args.target, deadline=30.0)
    if not client.health():
        sys.exit("klserve at %s is not SERVING" % args.target)
    info = client.server_info()
    print("klserve %s at %s: %s backend, %s; run %r, layer %d, the %s "
          "form" % (info.version, args.target, info.backend, info.device,
                    args.run, args.layer, args.form))

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

    # The main attention's logits are softmax_scale * q . k; the service
    # applies the causal mask.
    softmax_scale = args.sharpness / math.sqrt(DH)

    def main_attention_qk(x):  # q [B, T, H, DH], k [B, S, H, DH]
        return (jnp.einsum("btd,hde->bthe", x, main_wq),
                jnp.einsum("bsd,hde->bshe", x, main_wk))

    ki = jax.random.split(k_init, 3)
    params = {
        "wq": 0.3 * jax.random.normal(ki[0], (D, HI, DI)) / math.sqrt(D),
        "wk": 0.3 * jax.random.normal(ki[1], (D, DI)) / math.sqrt(D),
        "ww": 0.3 * jax.random.normal(ki[2], (D, HI)) / math.sqrt(D),
        "bw": jnp.full((HI,), 1.0 / HI),
    }

    def indexer_projections(params, x):  # q_I, k_I, w
        return (jnp.einsum("btd,dje->btje", x, params["wq"]),
                jnp.einsum("bsd,de->bse", x, params["wk"]),
                jnp.einsum("btd,dj->btj", x, params["ww"]) + params["bw"])

    tags = dict(causal=True, scaling_factor=args.scaling_factor,
                client=client, run=args.run, layer=args.layer)

    def projections_loss(params, x, step):
        q, k = jax.lax.stop_gradient(main_attention_qk(x))
        # The toy's w is not scaled by H_I^-1/2 * D_I^-1/2 (its bias and
        # initialisation take that role): index_weight_scale 1.
        return indexer_kl_loss_from_projections(
            q, k, *indexer_projections(params, x), softmax_scale=softmax_scale,
            index_weight_scale=1.0, step=step, **tags)

    def logits_loss(params, x, step):
        q, k = main_attention_qk(x)
        logits = jax.lax.stop_gradient(
            softmax_scale * jnp.einsum("bthe,bshe->bhts", q, k))
        q_i, k_i, w = indexer_projections(params, x)
        dots = jax.nn.relu(jnp.einsum("btje,bse->btjs", q_i, k_i))
        scores = jnp.einsum("btj,btjs->bts", w, dots)
        return indexer_kl_loss(scores, attention_logits=logits, step=step,
                               **tags)

    loss_of = projections_loss if args.form == "projections" else logits_loss

    optimizer = optax.adam(optax.cosine_decay_schedule(args.lr, args.steps))
    opt_state = optimizer.init(params)

    @jax.jit
    def train_step(params, opt_state, key, step):
        tokens = jax.random.randint(key, (B, T), 0, V)
        x = embed(tokens)
        loss, grads = jax.value_and_grad(loss_of)(params, x, step)
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
    # The default 400 steps take it below half; a shorter run (--steps=60
    # reached 49% lower) need only see it fall.
    halves = args.steps >= 400
    if not last < (0.5 if halves else 1.0) * first:
        sys.exit("the indexer loss did not fall%s over %d steps" %
                 (" by half" if halves else "", args.steps))


if __name__ == "__main__":
    main()
