"""klserve on other CPUs than this machine's, emulated by qemu-user: AVX2
machines without AVX-512 (an AMD EPYC and an Intel Haswell) and an
x86-64-v2 machine without AVX (a Nehalem). On each, --isa=auto must pick
the widest variant that CPU runs, --isa must refuse a wider one, and every
answer must carry the bits of this machine's own server, so that a job's
loss and gradients do not depend on the CPU of the replica that answered.

qemu emulates no AVX-512 at all: an AVX-512 instruction outside the
dispatched variant ends the emulated server with SIGILL. It also answers
CPUID as the emulated CPU does, so glibc and OpenBLAS pick their own per-CPU
code (libm's FMA paths, OpenBLAS's kernels) as they would on such a machine.

The projections form's products go through OpenBLAS, whose kernels sum in
their own orders. klserve runs its Haswell kernels on every CPU with AVX2
(kernels/cpu/blas.cc), so those CPUs agree bit for bit; a CPU without AVX2
runs older kernels, and its projections-form answers agree to rounding only
(docs/blas.md).

CMake passes the emulator's command (tests/CMakeLists.txt) as
KLSERVE_EMULATOR and the CPUs, each with the variant it must get, as
KLSERVE_EMULATED_CPUS ("EPYC-Rome-v1=avx2 ..."); scripts/klserve.sh installs
Debian's qemu-user."""

import os
import shlex
import subprocess

import grpc
import ml_dtypes
import numpy as np
import pytest

from conftest import Server, klserve_bin
from reference import indexer_kl_reference

EMULATOR = shlex.split(os.environ.get("KLSERVE_EMULATOR", ""))
CPUS = [tuple(entry.split("=", 1))
        for entry in os.environ.get("KLSERVE_EMULATED_CPUS", "").split()]
# What a CPU of each variant must do: the OpenBLAS kernels it runs, and
# the variant and the OpenBLAS kernels one step wider, which it must refuse.
BY_VARIANT = {
    "baseline": {"blas": "Nehalem", "wider": "avx2", "wider_blas": "Haswell"},
    "avx2": {"blas": "Haswell", "wider": "avx512", "wider_blas": "SkylakeX"},
}

pytestmark = pytest.mark.skipif(
    not EMULATOR or not CPUS,
    reason="KLSERVE_EMULATOR or KLSERVE_EMULATED_CPUS unset (CMake sets them "
           "where qemu-x86_64 is installed: apt-get install qemu-user)")


def launcher(cpu):
    return (*EMULATOR, "-cpu", cpu)


def logits_problems():
    """Rows long enough for every vector width and its tail (203 keys),
    every dtype, both flavors, the sparse stage, diagnostics and row KL."""
    rng = np.random.default_rng(20261203)
    batch, heads, rows, keys, k = 2, 4, 24, 203, 37
    normal = rng.standard_normal
    scores = normal((batch, rows, keys)).astype(np.float32)
    logits = (3 * normal((batch, heads, rows, keys))).astype(np.float32)
    weights = rng.dirichlet(np.ones(keys), (batch, rows)).astype(np.float32)
    topk = np.argsort(-normal((batch, rows, keys)), axis=-1)[..., :k]
    sparse_scores = np.take_along_axis(scores, topk, axis=-1)
    sparse_logits = np.take_along_axis(
        logits, np.broadcast_to(topk[:, None], (batch, heads, rows, k)),
        axis=-1)
    extras = dict(want_row_kl=True, want_diagnostics=True, recall_k=8)
    return {
        "dense_per_head_fp32": dict(indexer_scores=scores,
                                    attention_logits=logits, causal=True,
                                    softmax_scale=0.7, **extras),
        "dense_weights_maxtext": dict(indexer_scores=scores,
                                      attention_weights=weights,
                                      flavor="maxtext", **extras),
        "sparse_per_head": dict(indexer_scores=sparse_scores,
                                attention_logits=sparse_logits,
                                topk_indices=topk, num_keys=keys,
                                causal=True, **extras),
        "dense_bf16": dict(indexer_scores=scores.astype(ml_dtypes.bfloat16),
                           attention_logits=logits.astype(ml_dtypes.bfloat16),
                           grad_dtype="bf16", reduction="sum", **extras),
        "dense_fp16_streamed": dict(indexer_scores=scores.astype(np.float16),
                                    attention_logits=logits.astype(np.float16),
                                    grad_dtype="fp16", stream=True, **extras),
    }


def projections_problems():
    """GQA projections, dense and with the service's own top-k selection,
    unary and streamed."""
    rng = np.random.default_rng(31)
    batch, rows, keys, heads, kv_heads, dim = 2, 20, 150, 4, 2, 32
    index_heads, index_dim = 3, 16
    normal = rng.standard_normal
    arrays = dict(
        query=normal((batch, rows, heads, dim)).astype(np.float32),
        key=normal((batch, keys, kv_heads, dim)).astype(np.float32),
        index_query=normal((batch, rows, index_heads, index_dim)).astype(
            np.float32),
        index_key=normal((batch, keys, index_dim)).astype(np.float32),
        index_weights=normal((batch, rows, index_heads)).astype(np.float32))
    return {
        "projections_dense": dict(arrays, causal=True, q_offset=keys - rows,
                                  want_row_kl=True),
        "projections_topk": dict(arrays, topk=24, want_row_kl=True),
        "projections_topk_streamed": dict(arrays, topk=24, stream=True),
    }


PROBLEMS = {**logits_problems(), **projections_problems()}
ARRAYS = ("grad", "row_kl", "d_index_query", "d_index_key", "d_index_weights",
          "topk_indices")
SCALARS = ("loss", "unscaled_loss", "denominator", "rows_counted",
           "rows_fully_masked", "rows_zero_target", "diagnostics")


def answer(server, name):
    with server.client(deadline=120.0) as client:
        return client.compute_loss(**PROBLEMS[name])


@pytest.fixture(scope="module")
def native():
    # Without the OpenBLAS settings a host may have, as the emulated servers
    # run (KLSERVE_EMULATOR unsets them): the kernels OpenBLAS runs are then
    # klserve's own choice.
    srv = Server(launcher=("env", "-u", "OPENBLAS_CORETYPE", "-u",
                           "OPENBLAS_L2_SIZE"))
    yield srv
    assert srv.stop() == 0, "".join(srv.log)


@pytest.fixture(scope="module")
def native_answers(native):
    return {name: answer(native, name) for name in PROBLEMS}


@pytest.fixture(scope="module", params=CPUS, ids=[cpu for cpu, _ in CPUS])
def emulated(request):
    cpu, variant = request.param
    srv = Server(launcher=launcher(cpu), timeout=120.0)
    yield srv, cpu, variant
    assert srv.stop() == 0, "".join(srv.log)


def test_native_answers_match_the_float64_reference(native_answers):
    """What the emulated servers are held to is right to begin with."""
    for name, problem in logits_problems().items():
        if "stream" in problem or problem.get("grad_dtype", "fp32") != "fp32":
            continue
        arguments = {key: problem[key] for key in (
            "indexer_scores", "attention_logits", "attention_weights",
            "topk_indices", "num_keys", "causal", "softmax_scale", "flavor")
            if key in problem}
        want = indexer_kl_reference(**arguments)
        got = native_answers[name]
        assert got.loss == pytest.approx(want["loss"], rel=2e-5), name
        scale = np.abs(want["grad"]).max()
        np.testing.assert_allclose(got.grad, want["grad"], rtol=2e-5,
                                   atol=2e-6 * scale, err_msg=name)
        np.testing.assert_allclose(got.row_kl, want["row_kl"], rtol=2e-5,
                                   atol=1e-7, err_msg=name)


def test_auto_picks_the_widest_variant_the_cpu_runs(emulated):
    srv, cpu, variant = emulated
    log = "".join(srv.log)
    assert f"CPU kernels: {variant} (the best this CPU runs)" in log, log
    blas = BY_VARIANT[variant]["blas"]
    assert f"projections form: OpenBLAS, {blas} kernels" in log, log
    with srv.client() as client:
        assert client.server_info().device == (
            f"2 threads, {variant} kernels, OpenBLAS {blas}")


def bits(value):
    """A scalar's bytes (so that -0.0 and 0.0 differ), a dict's by key."""
    if isinstance(value, dict):
        return {key: bits(v) for key, v in value.items()}
    return np.float64(value).tobytes() if value is not None else None


def assert_same_bits(got, want, cpu):
    for field in SCALARS:
        assert bits(getattr(got, field)) == bits(getattr(want, field)), (
            cpu, field)
    for field in ARRAYS:
        a, b = getattr(got, field), getattr(want, field)
        assert (a is None) == (b is None), (cpu, field)
        if a is not None:
            assert a.dtype == b.dtype and a.shape == b.shape, (cpu, field)
            assert a.tobytes() == b.tobytes(), (cpu, field)


def assert_same_to_rounding(got, want, cpu):
    """The projections form off the AVX2 kernels: another OpenBLAS kernel
    rounds the products differently, and nothing more."""
    assert got.loss == pytest.approx(want.loss, rel=1e-5), cpu
    assert got.denominator == want.denominator, cpu
    for field in ("row_kl", "d_index_query", "d_index_key",
                  "d_index_weights"):
        a, b = getattr(got, field), getattr(want, field)
        if b is not None:
            scale = np.abs(b).max()
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * scale,
                                       err_msg=f"{cpu} {field}")


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_every_answer_has_the_native_servers_bits(emulated, native_answers,
                                                 name):
    srv, cpu, variant = emulated
    got, want = answer(srv, name), native_answers[name]
    if name in projections_problems() and variant == "baseline":
        assert_same_to_rounding(got, want, cpu)
    else:
        assert_same_bits(got, want, cpu)


def test_a_wider_variant_is_refused_at_start(emulated):
    _, cpu, variant = emulated
    if variant not in BY_VARIANT:
        pytest.skip(f"{cpu} runs the widest variant")
    wider = BY_VARIANT[variant]["wider"]
    run = subprocess.run(
        [*launcher(cpu), klserve_bin(), "--listen=127.0.0.1:0",
         "--metrics_listen=", f"--isa={wider}"],
        capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert (f"--isa={wider}: this CPU cannot run the {wider} kernels; the "
            f"best it runs is {variant} (--isa=auto picks it)") in run.stderr


def test_a_cpu_below_x86_64_v2_is_refused_by_name():
    """A Core 2 has no SSE4.2 or POPCNT, which the code outside the variants
    is compiled with: the loader refuses the binaries with a message (their
    ELF note, CMakeLists.txt) instead of a SIGILL at some instruction."""
    klctl = os.path.join(os.path.dirname(os.path.dirname(klserve_bin())),
                         "client", "klctl")
    for binary in (klserve_bin(), klctl):
        run = subprocess.run([*launcher("core2duo-v1"), binary, "--help"],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 127, (binary, run.returncode, run.stderr)
        assert "CPU ISA level is lower than required" in run.stderr, binary



def test_blas_kernels_the_cpu_cannot_run_are_refused_not_run(emulated):
    """OpenBLAS runs the kernels OPENBLAS_CORETYPE names without asking the
    CPU: a fleet-wide setting that reaches an older node would end the
    server with SIGILL at its first projections-form call, after it had
    reported itself healthy. It refuses that form instead, saying why, and
    serves the rest."""
    _, cpu, variant = emulated
    if variant not in BY_VARIANT:
        pytest.skip(f"{cpu} runs every kernel set")
    kernels = BY_VARIANT[variant]["wider_blas"]
    srv = Server(launcher=(*EMULATOR, "-E", f"OPENBLAS_CORETYPE={kernels}",
                           "-cpu", cpu), timeout=120.0)
    try:
        assert any(f"projections form: refused: OpenBLAS would run its "
                   f"{kernels} kernels" in line for line in srv.log), (
            "".join(srv.log))
        with srv.client(deadline=120.0) as client:
            with pytest.raises(grpc.RpcError) as refused:
                client.compute_loss(**PROBLEMS["projections_dense"])
            assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert f"OPENBLAS_CORETYPE={kernels}" in refused.value.details
            assert client.compute_loss(
                **PROBLEMS["dense_per_head_fp32"]).loss > 0
    finally:
        assert srv.stop() == 0, "".join(srv.log)
