#!/usr/bin/env python3
"""The Python client over shared memory against the same client inline and
against jax.jit computing the same loss and gradient in this process, in
one run (issue 16's criterion: shared memory at least 3x faster than JAX).

The problem is klserve_bench's dense_agg_fp32: the head-aggregated target
attention_weights and indexer_scores, float32 [B, T, S] (default
[1, 4096, 4096]), no mask, EXACT flavour, MEAN reduction, loss and the
float32 gradient. Timed, each as the median of --iterations calls after
--warmup:

  shm, zero-copy  the inputs already live in a region registered with the
                  client (klserve.SharedMemoryRegion), the gradient comes
                  back as a view of the client's region: no byte is copied
  shm             Client(shared_memory=True) given ordinary NumPy arrays:
                  one copy of each input into the client's region
  inline          Client() as it is by default (bytes in the messages;
                  past 64 MiB through ComputeLossStream)
  jax.jit         jax.value_and_grad of the loss below, jitted, on
                  --threads CPUs (this process is pinned to them before JAX
                  starts)
  kernel alone    klserve_bench's dense_agg_fp32 on --threads threads (the
                  default shape only), the baseline of the shm ratios

Against a server of your own (on this host, for shared memory):

    build/server/klserve --listen=unix:/tmp/klserve.sock --shared_memory \\
        --threads=2 --metrics_listen=
    python bench/python_shm_vs_jax.py --target=unix:/tmp/klserve.sock

Without --target it starts build/server/klserve (or --klserve_bin) itself
that way, on a Unix socket in a temporary directory, with --threads.
Needs numpy, jax and the klserve package (pip install client/python).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=None,
                        help="a running server (default: start one)")
    parser.add_argument("--klserve_bin",
                        default=os.path.join(REPO, "build", "server",
                                             "klserve"))
    parser.add_argument("--threads", type=int, default=2,
                        help="the server's --threads and JAX's CPUs")
    parser.add_argument("--shape", default="1,4096,4096",
                        help="B,T,S of the problem")
    parser.add_argument("--klserve_bench",
                        default=os.path.join(REPO, "build", "bench",
                                             "klserve_bench"),
                        help="times the kernel alone on the same problem "
                        "(its dense_agg_fp32 is [1, 4096, 4096] only)")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    return parser.parse_args()


def pin_to_cpus(count):
    """Confines this process (JAX's thread pools, created when it starts)
    to `count` of the CPUs it may use."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < count:
        print("note: only %d CPUs available, JAX gets all of them" %
              len(cpus), file=sys.stderr)
        return
    os.sched_setaffinity(0, cpus[:count])


class StartedServer:
    """klserve on a Unix socket of a temporary directory."""

    def __init__(self, binary, threads):
        if not os.access(binary, os.X_OK):
            sys.exit("no klserve binary at %s (build it, or pass "
                     "--klserve_bin or --target)" % binary)
        self.directory = tempfile.TemporaryDirectory(prefix="klserve-bench-")
        path = os.path.join(self.directory.name, "klserve.sock")
        self.target = "unix:" + path
        # A loopback port too, only because the server names it on stderr
        # once it is listening: the moment to go on.
        self.proc = subprocess.Popen(
            [binary, "--listen=127.0.0.1:0,unix:" + path, "--metrics_listen=",
             "--shared_memory", "--threads=%d" % threads],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        started = threading.Event()
        log = []

        def drain():
            for line in self.proc.stderr:
                log.append(line)
                if re.search(r"serving on port \d+", line):
                    started.set()
            started.set()

        threading.Thread(target=drain, daemon=True).start()
        if not started.wait(60) or self.proc.poll() is not None:
            self.stop()
            sys.exit("klserve did not start:\n" + "".join(log))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.directory.cleanup()


def problem(shape):
    """klserve_bench's dense_agg_fp32 data: N(0, 1) scores, and each row's
    weights exp(3 N(0, 1)) normalised to sum 1."""
    import numpy as np
    rng = np.random.default_rng(0)
    scores = rng.standard_normal(shape, dtype=np.float32)
    weights = np.exp(3.0 * rng.standard_normal(shape, dtype=np.float32))
    weights /= weights.sum(-1, keepdims=True)
    return scores, weights


def jax_loss_and_grad():
    """jax.jit of the EXACT loss with a head-aggregated target over all
    keys (no mask): p = w / sum(w), q = softmax(scores),
    KL_t = sum p (log p - log q), loss = sum_t KL_t / N with N = B * T
    (MEAN); the gradient, (q - p) / N, by jax.value_and_grad."""
    import jax
    import jax.numpy as jnp

    def loss(scores, weights):
        batch, rows, _ = scores.shape
        total = weights.sum(-1, keepdims=True)
        p = jnp.where(total > 0, weights / jnp.where(total > 0, total, 1.0),
                      0.0)
        p = jax.lax.stop_gradient(p)
        log_q = jax.nn.log_softmax(scores, axis=-1)
        safe_p = jnp.where(p > 0, p, 1.0)
        kl = jnp.where(p > 0, p * (jnp.log(safe_p) - log_q), 0.0).sum(-1)
        return kl.sum() / (batch * rows)

    return jax.jit(jax.value_and_grad(loss))


def timed(fn, iterations, warmup):
    """Median and minimum seconds of fn() over `iterations` calls, after
    `warmup` untimed ones; and the last call's value."""
    value = None
    for _ in range(warmup):
        value = fn()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times), value


def kernel_alone(binary, threads):
    """klserve_bench's dense_agg_fp32 on `threads` threads, in seconds: the
    kernels' own time for this problem, without any transport."""
    import json
    out = subprocess.run(
        [binary, "--klserve_threads=%d" % threads,
         "--benchmark_filter=^dense_agg_fp32/", "--benchmark_format=json"],
        check=True, capture_output=True, text=True).stdout
    (bench,) = json.loads(out)["benchmarks"]
    assert bench["time_unit"] == "ms", bench
    return 1e-3 * bench["real_time"]


def main():
    args = parse_args()
    pin_to_cpus(args.threads)
    import jax  # after pinning: its thread pools size to the CPUs it sees
    import numpy as np

    import klserve

    shape = tuple(int(d) for d in args.shape.split(","))
    scores, weights = problem(shape)
    server = None if args.target else StartedServer(args.klserve_bin,
                                                    args.threads)
    target = args.target or server.target
    rows = []
    try:
        with klserve.Client(target, shared_memory=True) as shm, \
                klserve.Client(target) as inline:
            info = shm.server_info()
            print("server %s: %s, %s; shared_memory %s" % (
                target, info.version, info.device, info.shared_memory))
            if not info.shared_memory:
                sys.exit("the server does not serve regions: start it with "
                         "--shared_memory")
            print("problem: dense head-aggregated %s fp32, loss and "
                  "gradient; %d iterations (median), %d warm-up" % (
                      list(shape), args.iterations, args.warmup))

            # Inputs in a region of the caller's, registered with the
            # client: sent by reference.
            size = 2 * scores.nbytes + 64
            with klserve.SharedMemoryRegion(size) as region:
                region.register(shm)
                in_scores = region.array(0, shape, np.float32)
                in_weights = region.array(
                    klserve.shared_memory.aligned(scores.nbytes), shape,
                    np.float32)
                in_scores[...] = scores
                in_weights[...] = weights

                def zero_copy():
                    return shm.compute_loss(in_scores,
                                            attention_weights=in_weights)

                median, best, r = timed(zero_copy, args.iterations,
                                        args.warmup)
                assert r.shared_memory
                zero_copy_result = (r.loss, r.grad.copy())
                rows.append(("shm, zero-copy", median, best))

            def copied():
                return shm.compute_loss(scores, attention_weights=weights)

            median, best, r = timed(copied, args.iterations, args.warmup)
            assert r.shared_memory
            shm_result = (r.loss, r.grad.copy())
            rows.append(("shm", median, best))

            def inline_call():
                return inline.compute_loss(scores, attention_weights=weights)

            median, best, r = timed(inline_call, args.iterations,
                                    args.warmup)
            inline_result = (r.loss, r.grad)
            rows.append(("inline (%s)" % ("streamed" if r.streamed
                                          else "unary"), median, best))

        fn = jax_loss_and_grad()
        j_scores, j_weights = jax.device_put(scores), jax.device_put(weights)

        def jax_call():
            loss, grad = fn(j_scores, j_weights)
            grad.block_until_ready()
            return loss, grad

        median, best, (j_loss, j_grad) = timed(jax_call, args.iterations,
                                               args.warmup)
        rows.append(("jax.jit, in process", median, best))
        kernel = None
        if shape == (1, 4096, 4096) and os.path.exists(args.klserve_bench):
            kernel = kernel_alone(args.klserve_bench, args.threads)
    finally:
        if server is not None:
            server.stop()

    # The four agree (float32 arithmetic, different summation orders).
    j_grad = np.asarray(j_grad)
    scale = float(np.abs(j_grad).max())
    for name, (loss, grad) in (("shm, zero-copy", zero_copy_result),
                               ("shm", shm_result),
                               ("inline", inline_result)):
        if (abs(loss - float(j_loss)) > 1e-4 * abs(float(j_loss)) or
                float(np.abs(grad - j_grad).max()) > 1e-4 * scale):
            sys.exit("%s disagrees with jax: loss %r vs %r" %
                     (name, loss, float(j_loss)))

    print("%-22s %10s %10s" % ("path", "median ms", "min ms"))
    for name, median, best in rows:
        print("%-22s %10.1f %10.1f" % (name, 1e3 * median, 1e3 * best))
    times = {name: median for name, median, _ in rows}
    jax_time = times["jax.jit, in process"]
    print("jax/shm, zero-copy: %.2fx" % (jax_time / times["shm, zero-copy"]))
    print("jax/shm:            %.2fx" % (jax_time / times["shm"]))
    if kernel is not None:
        print("%-22s %10.1f %10s" % ("kernel alone", 1e3 * kernel,
                                     "(mean)"))
        print("shm, zero-copy/kernel: %.2fx" %
              (times["shm, zero-copy"] / kernel))
        print("shm/kernel:            %.2fx" % (times["shm"] / kernel))


if __name__ == "__main__":
    main()
