"""klserve.jax.indexer_kl_loss and indexer_kl_loss_from_projections:
jax.grad through the service against jax.grad of a pure-JAX implementation
of the same loss."""

import logging
import time

import grpc
import numpy as np
import pytest

import klserve

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from klserve.jax import (indexer_kl_loss,  # noqa: E402
                         indexer_kl_loss_from_projections)
from reference import validity  # noqa: E402

EPS = 1e-8


def jax_indexer_kl(scores, *, valid, attention_logits=None,
                   attention_weights=None, row_valid=None, flavor="exact",
                   reduction="mean", scaling_factor=1.0, softmax_scale=1.0):
    """The spec's loss in plain JAX (float32), differentiated by JAX. The
    target is under stop_gradient; masking is by `valid` (a static bool
    [B, T, S])."""
    batch, rows, _ = scores.shape
    valid = jnp.asarray(valid)
    has_valid = valid.any(-1)
    if attention_logits is not None:
        heads = attention_logits.shape[1]
        a = jnp.where(valid[:, None], softmax_scale * attention_logits, -1e30)
        x = jnp.where(valid, jax.nn.softmax(a, axis=-1).sum(1), 0.0)
    else:
        heads = None
        x = jnp.where(valid, attention_weights, 0.0)
    x = jax.lax.stop_gradient(x)
    x_sum = x.sum(-1)
    computed = has_valid & (x_sum > 0)
    if flavor == "maxtext":
        p = x / (x_sum + EPS)[..., None]
    elif heads is not None:
        p = x / heads
    else:
        p = x / jnp.where(x_sum > 0, x_sum, 1.0)[..., None]
    masked = jnp.where(valid, scores, -1e30)
    logq = jax.nn.log_softmax(masked, axis=-1)
    if flavor == "maxtext":
        q = jnp.exp(logq)
        kl = jnp.where(valid, p * (jnp.log(p + EPS) - jnp.log(q + EPS)),
                       0.0).sum(-1)
    else:
        safe_p = jnp.where(p > 0, p, 1.0)
        kl = jnp.where(valid & (p > 0), p * (jnp.log(safe_p) - logq),
                       0.0).sum(-1)
    counted = computed
    if row_valid is not None:
        counted = counted & jnp.asarray(row_valid)
    if reduction == "mean":
        n = batch * rows
    elif reduction == "mean_valid":
        n = (int(np.asarray(row_valid).sum()) if row_valid is not None
             else int(np.asarray(computed).sum()))
    else:
        n = 1
    return scaling_factor * jnp.where(counted, kl, 0.0).sum() / n


def problem(seed, batch=2, heads=3, rows=8, keys=8):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.standard_normal((batch, rows, keys)),
                        jnp.float32),
            jnp.asarray(2 * rng.standard_normal((batch, heads, rows, keys)),
                        jnp.float32))


def assert_grads_close(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(np.abs(want).max(), 1e-30)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-6 * scale)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("flavor", ["exact", "maxtext"])
def test_grad_matches_pure_jax_per_head(client, jit, flavor):
    scores, logits = problem(1)
    valid = validity(2, 8, 8, causal=True)
    opts = dict(causal=True, flavor=flavor, scaling_factor=0.01,
                softmax_scale=0.8)

    def service(s):
        # A cotangent other than 1 and a second term: the chain rule.
        return 3.0 * indexer_kl_loss(s, attention_logits=logits,
                                     client=client, **opts) + 0.1 * jnp.sum(
                                         s ** 2)

    def pure(s):
        return 3.0 * jax_indexer_kl(s, valid=valid, attention_logits=logits,
                                    flavor=flavor, scaling_factor=0.01,
                                    softmax_scale=0.8) + 0.1 * jnp.sum(s ** 2)

    vg_service = jax.value_and_grad(service)
    vg_pure = jax.value_and_grad(pure)
    if jit:
        vg_service, vg_pure = jax.jit(vg_service), jax.jit(vg_pure)
    value, grad = vg_service(scores)
    want_value, want_grad = vg_pure(scores)
    assert grad.dtype == jnp.float32 and grad.shape == scores.shape
    assert float(value) == pytest.approx(float(want_value), rel=1e-5)
    assert_grads_close(grad, want_grad)
    # The forward alone (no differentiation) gives the same number.
    fwd = jax.jit(service) if jit else service
    assert float(fwd(scores)) == pytest.approx(float(value), rel=1e-6)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "mean_valid", "sum"])
def test_grad_matches_pure_jax_weights_with_masks(client, jit, reduction):
    rng = np.random.default_rng(2)
    batch, rows, keys = 2, 6, 10
    scores = jnp.asarray(rng.standard_normal((batch, rows, keys)),
                         jnp.float32)
    weights = jnp.asarray(rng.random((batch, rows, keys)), jnp.float32)
    key_padding = np.ones((batch, keys), bool)
    key_padding[1, 7:] = False
    row_valid = np.ones((batch, rows), bool)
    row_valid[0, 1] = False
    valid = validity(batch, rows, keys, causal=True, q_offset=4,
                     key_padding_mask=key_padding)

    def service(s):
        return indexer_kl_loss(s, attention_weights=weights,
                               key_padding_mask=key_padding,
                               row_valid=row_valid, causal=True, q_offset=4,
                               reduction=reduction, client=client)

    def pure(s):
        return jax_indexer_kl(s, valid=valid, attention_weights=weights,
                              row_valid=row_valid, reduction=reduction)

    g_service, g_pure = jax.grad(service), jax.grad(pure)
    if jit:
        g_service, g_pure = jax.jit(g_service), jax.jit(g_pure)
    assert_grads_close(g_service(scores), g_pure(scores))
    assert float(service(scores)) == pytest.approx(float(pure(scores)),
                                                   rel=1e-5)


def test_targets_get_zero_cotangent(client):
    scores, logits = problem(3)

    def f(s, a):
        return indexer_kl_loss(s, attention_logits=a, causal=True,
                               client=client)

    d_scores, d_logits = jax.jit(jax.grad(f, argnums=(0, 1)))(scores, logits)
    assert np.abs(np.asarray(d_scores)).max() > 0
    np.testing.assert_array_equal(np.asarray(d_logits), 0)


def test_bf16_scores_give_bf16_grad(client):
    scores, logits = problem(4)
    scores = scores.astype(jnp.bfloat16)

    def f(s):
        return indexer_kl_loss(s, attention_logits=logits, causal=True,
                               client=client)

    loss, grad = jax.jit(jax.value_and_grad(f))(scores)
    assert loss.dtype == jnp.float32
    assert grad.dtype == jnp.bfloat16
    direct = client.compute_loss(np.asarray(scores),
                                 attention_logits=np.asarray(logits),
                                 causal=True, grad_dtype="bf16")
    np.testing.assert_array_equal(np.asarray(grad).view(np.uint16),
                                  direct.grad.view(np.uint16))


def test_traced_step_tag_under_jit(client):
    run = "pytest-jax-%d" % time.monotonic_ns()
    scores, logits = problem(5)

    @jax.jit
    def train_step(s, step):
        return jax.value_and_grad(lambda s: indexer_kl_loss(
            s, attention_logits=logits, causal=True, client=client,
            run=run, step=step, layer=0))(s)

    for step in range(3):
        loss, _ = train_step(scores, jnp.int32(step))
    published = client.finish_step(run, 2)
    assert published.requests == 1
    assert published.indexer_loss == pytest.approx(float(loss), rel=1e-6)


def test_traced_float_options_under_jit(client):
    # MaxText's grad_scale is 1 / total_weights, a traced value in a jitted
    # step; scaling_factor may be one too.
    scores, logits = problem(8)

    @jax.jit
    def step(s, grad_scale, c):
        return jax.value_and_grad(lambda s: indexer_kl_loss(
            s, attention_logits=logits, causal=True, client=client,
            grad_scale=grad_scale, scaling_factor=c))(s)

    loss, grad = step(scores, jnp.float32(0.25), jnp.float32(0.5))
    direct = client.compute_loss(np.asarray(scores),
                                 attention_logits=np.asarray(logits),
                                 causal=True, grad_scale=0.25,
                                 scaling_factor=0.5)
    assert float(loss) == float(np.float32(direct.loss))
    np.testing.assert_array_equal(np.asarray(grad), direct.grad)


def test_fp16_scores_keep_a_loss_scaled_gradient(client):
    # fp16 training scales the loss (2^16 here) so that small gradients
    # survive fp16: the wrapper must multiply before it rounds to fp16.
    rng = np.random.default_rng(9)
    scores = rng.standard_normal((1, 2048, 64)).astype(np.float16)
    logits = rng.standard_normal((1, 1, 2048, 64)).astype(np.float32)
    loss_scale = 65536.0
    grad = jax.grad(lambda s: loss_scale * indexer_kl_loss(
        s, attention_logits=logits, scaling_factor=0.01, client=client))(
            jnp.asarray(scores))
    assert grad.dtype == jnp.float16
    want = loss_scale * client.compute_loss(
        scores, attention_logits=logits, scaling_factor=0.01,
        grad_dtype="fp32").grad.astype(np.float64)
    np.testing.assert_array_equal(np.asarray(grad),
                                  want.astype(np.float32).astype(np.float16))


def test_vmap_one_request_per_element(client):
    scores, logits = problem(6, batch=3)
    per_element = jax.vmap(lambda s, a: indexer_kl_loss(
        s[None], attention_logits=a[None], causal=True, client=client))(
            scores, logits)
    for i in range(3):
        single = client.compute_loss(np.asarray(scores[i:i + 1]),
                                     attention_logits=np.asarray(
                                         logits[i:i + 1]), causal=True,
                                     want_grad=False)
        assert float(per_element[i]) == pytest.approx(single.loss, rel=1e-6)


def test_errors_surface_through_jax(client, caplog):
    scores, logits = problem(7)
    scores = scores.at[0, 0, 0].set(jnp.nan)
    caplog.set_level(logging.DEBUG)
    # Eager: the client's own error, code and details.
    for call in (
            lambda s: indexer_kl_loss(s, attention_logits=logits,
                                      client=client),
            jax.grad(lambda s: indexer_kl_loss(s, attention_logits=logits,
                                               client=client))):
        with pytest.raises(klserve.KlserveError) as info:
            jax.block_until_ready(call(scores))
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details.startswith("indexer_scores")
    # Under jit: JAX's error, with the client's text.
    with pytest.raises(Exception) as info:
        jax.block_until_ready(jax.jit(lambda s: indexer_kl_loss(
            s, attention_logits=logits, client=client))(scores))
    assert "INVALID_ARGUMENT" in str(info.value)
    assert "indexer_scores" in str(info.value)
    # The error is said once, where it is raised: JAX's log of the failed
    # callback, with its traceback, is not printed beside it.
    logged = [r.getMessage() for r in caplog.records
              if r.exc_info and isinstance(r.exc_info[1], klserve.KlserveError)]
    assert logged == []
    with pytest.raises(TypeError):
        indexer_kl_loss(scores, attention_logits=logits, client=client,
                        want_row_kl=True)


def test_integer_inputs_are_refused_by_name(client):
    # As the client (and so the torch wrappers) refuse them: the status and
    # the field, not a TypeError of the wrapper's own.
    scores, logits = problem(8)
    query, key, iq, ik, iw = projections_problem(16)
    for call, field in (
            (lambda: indexer_kl_loss(scores.astype(jnp.int32),
                                     attention_logits=logits, client=client),
             "indexer_scores"),
            (lambda: indexer_kl_loss_from_projections(
                query, key, iq, ik.astype(jnp.int32), iw, client=client),
             "index_key")):
        with pytest.raises(klserve.KlserveError) as info:
            call()
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details.startswith(field + ": dtype must be")
        assert "int32" in info.value.details


def test_a_gradient_of_the_gradient_raises(client):
    # The service returns the gradient, not its derivatives: differentiating
    # the gradient (a gradient penalty) must raise, not count it constant.
    scores, logits = problem(19)

    def penalty(s):
        grad = jax.grad(lambda x: indexer_kl_loss(
            x, attention_logits=logits, client=client))(s)
        return jnp.sum(grad ** 2)

    with pytest.raises(ValueError, match="do not support JVP"):
        jax.grad(penalty)(scores)


def test_int64_indices_outside_int32_are_empty_slots_not_wrapped(client):
    # JAX without x64 keeps an int64 array's low 32 bits: 2**32 + 1 became
    # key 1, and the loss counted a slot the job had left empty. The
    # wrappers convert integers as the client does before JAX sees them.
    assert not jax.config.jax_enable_x64
    scores, logits = problem(17, keys=3)
    empty = np.tile(np.array([1, 4, 6], np.int64), (2, 8, 1))
    empty[:, :, 0] = -1
    want = indexer_kl_loss(scores, attention_logits=logits,
                           topk_indices=empty, num_keys=8, client=client)
    for sentinel in (2**32, 2**32 + 1, np.iinfo(np.int64).min,
                     np.iinfo(np.int64).max):
        indices = empty.copy()
        indices[:, :, 0] = sentinel
        eager = indexer_kl_loss(scores, attention_logits=logits,
                                topk_indices=indices, num_keys=8,
                                client=client)
        jitted = jax.jit(lambda s, i=indices: indexer_kl_loss(
            s, attention_logits=logits, topk_indices=i, num_keys=8,
            client=client))(scores)
        assert float(eager) == float(want), sentinel
        assert float(jitted) == float(want), sentinel
    query, key, iq, ik, iw = projections_problem(17)
    indices = np.tile(np.array([2**32 + 1, 0, 3], np.int64), (2, 8, 1))
    got = indexer_kl_loss_from_projections(query, key, iq, ik, iw,
                                           topk_indices=indices, client=client)
    indices[:, :, 0] = -1
    want = indexer_kl_loss_from_projections(query, key, iq, ik, iw,
                                            topk_indices=indices,
                                            client=client)
    assert float(got) == float(want)
    # Other integers outside int32 are refused by name, as the client does.
    bounds = np.zeros((2, 8), np.int64)
    with pytest.raises(klserve.KlserveError) as info:
        indexer_kl_loss(problem(18)[0], attention_logits=problem(18)[1],
                        key_start=bounds, key_end=bounds + 2**32,
                        client=client)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details == "key_end: values must fit in int32"


def test_an_overload_refusal_keeps_its_mark_through_jax():
    # The wrapper's copy of the client's error dropped .overloaded.
    from conftest import Server, held_stream_slot
    scores, logits = problem(8)
    server = Server("--max_open_streams=1", "--stream_idle_timeout=5s")
    try:
        with held_stream_slot(server), server.client(max_attempts=1) as c:
            with pytest.raises(klserve.KlserveError) as info:
                jax.block_until_ready(indexer_kl_loss(
                    scores, attention_logits=logits, client=c, stream=True))
            assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert info.value.overloaded
    finally:
        assert server.stop() == 0, "".join(server.log)


# -- the projections form ----------------------------------------------------


def jax_projections_kl(query, key, index_query, index_key, index_weights, *,
                       valid, softmax_scale, index_weight_scale,
                       use_relu=True, **loss_options):
    """The spec's projections form in plain JAX, materialised: the main
    logits of every head (GQA: query head h reads key head h // group),
    the indexer scores sum_j w_eff * relu(q_I . k_I), then jax_indexer_kl
    (per-head softmax, mean over heads, KL, the reduction)."""
    group = query.shape[2] // key.shape[2]
    logits = softmax_scale * jnp.einsum(
        "bthd,bshd->bhts", query, jnp.repeat(key, group, axis=2))
    dots = jnp.einsum("btjd,bsd->btjs", index_query, index_key)
    if use_relu:
        dots = jax.nn.relu(dots)
    scores = jnp.einsum("btj,btjs->bts", index_weight_scale * index_weights,
                        dots)
    return jax_indexer_kl(scores, valid=valid, attention_logits=logits,
                          **loss_options)


def projections_problem(seed, batch=2, rows=8, keys=8, heads=4, kv_heads=2,
                        dim=16, index_heads=3, index_dim=8):
    rng = np.random.default_rng(seed)
    shapes = ((batch, rows, heads, dim), (batch, keys, kv_heads, dim),
              (batch, rows, index_heads, index_dim),
              (batch, keys, index_dim), (batch, rows, index_heads))
    return tuple(jnp.asarray(rng.standard_normal(shape), jnp.float32)
                 for shape in shapes)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("flavor,use_relu", [("exact", True),
                                             ("maxtext", True),
                                             ("exact", False)])
def test_projections_grad_matches_pure_jax(client, jit, flavor, use_relu):
    query, key, iq, ik, iw = projections_problem(11)
    valid = validity(2, 8, 8, causal=True)
    options = dict(causal=True, softmax_scale=0.25, index_weight_scale=0.5,
                   use_relu=use_relu, flavor=flavor, scaling_factor=0.01)

    def service(iq, ik, iw):
        # A cotangent other than 1 and a second term: the chain rule.
        return 3.0 * indexer_kl_loss_from_projections(
            query, key, iq, ik, iw, client=client, **options) + 0.1 * (
                jnp.sum(iq ** 2) + jnp.sum(iw))

    def pure(iq, ik, iw):
        return 3.0 * jax_projections_kl(
            query, key, iq, ik, iw, valid=valid, softmax_scale=0.25,
            index_weight_scale=0.5, use_relu=use_relu, flavor=flavor,
            scaling_factor=0.01) + 0.1 * (jnp.sum(iq ** 2) + jnp.sum(iw))

    vg_service = jax.value_and_grad(service, argnums=(0, 1, 2))
    vg_pure = jax.value_and_grad(pure, argnums=(0, 1, 2))
    if jit:
        vg_service, vg_pure = jax.jit(vg_service), jax.jit(vg_pure)
    value, grads = vg_service(iq, ik, iw)
    want_value, want_grads = vg_pure(iq, ik, iw)
    assert float(value) == pytest.approx(float(want_value), rel=1e-4)
    for got, want, like in zip(grads, want_grads, (iq, ik, iw)):
        assert got.dtype == jnp.float32 and got.shape == like.shape
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        scale = max(np.abs(want).max(), 1e-30)
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * scale)
    fwd = jax.jit(service) if jit else service
    assert float(fwd(iq, ik, iw)) == pytest.approx(float(value), rel=1e-6)


def test_projections_grad_through_parameters_under_jit(client):
    """The indexer's own projections, as a training step has them: the
    gradient reaches the parameters that made index_query, index_key and
    index_weights, and is JAX's chain rule on the service's gradients."""
    rng = np.random.default_rng(12)
    x = jnp.asarray(rng.standard_normal((1, 8, 6)), jnp.float32)
    query, key, _, _, _ = projections_problem(12, batch=1)
    params = {name: jnp.asarray(rng.standard_normal(shape), jnp.float32)
              for name, shape in (("wq", (6, 3, 8)), ("wk", (6, 8)),
                                  ("ww", (6, 3)))}
    valid = validity(1, 8, 8, causal=True)

    def indexer(params):
        return (jnp.einsum("btd,dje->btje", x, params["wq"]),
                x @ params["wk"], x @ params["ww"])

    def service(params):
        return indexer_kl_loss_from_projections(
            query, key, *indexer(params), causal=True, softmax_scale=0.25,
            client=client)

    def pure(params):
        return jax_projections_kl(query, key, *indexer(params), valid=valid,
                                  softmax_scale=0.25,
                                  index_weight_scale=(3 * 8) ** -0.5)

    got = jax.jit(jax.grad(service))(params)
    want = jax.grad(pure)(params)
    for name in params:
        g, w = np.asarray(got[name]), np.asarray(want[name])
        np.testing.assert_allclose(g, w, rtol=1e-3,
                                   atol=1e-4 * np.abs(w).max())


def test_projections_query_and_key_get_zero_cotangent(client):
    query, key, iq, ik, iw = projections_problem(13)

    def f(query, key, iq):
        return indexer_kl_loss_from_projections(query, key, iq, ik, iw,
                                                causal=True, client=client)

    d_query, d_key, d_iq = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(
        query, key, iq)
    np.testing.assert_array_equal(np.asarray(d_query), 0)
    np.testing.assert_array_equal(np.asarray(d_key), 0)
    assert np.abs(np.asarray(d_iq)).max() > 0


def test_projections_bf16_inputs_give_bf16_grads(client):
    query, key, iq, ik, iw = (x.astype(jnp.bfloat16)
                              for x in projections_problem(14))

    def f(iq, ik, iw):
        return indexer_kl_loss_from_projections(query, key, iq, ik, iw,
                                                causal=True, client=client)

    loss, grads = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(
        iq, ik, iw)
    assert loss.dtype == jnp.float32
    assert all(g.dtype == jnp.bfloat16 for g in grads)
    direct = client.compute_loss_from_projections(
        *(np.asarray(v) for v in (query, key, iq, ik, iw)), causal=True,
        grad_dtype="bf16")
    for g, field in zip(grads, ("d_index_query", "d_index_key",
                                "d_index_weights")):
        np.testing.assert_array_equal(np.asarray(g).view(np.uint16),
                                      getattr(direct, field).view(np.uint16))


def test_projections_wrapper_takes_its_form_only(client):
    query, key, iq, ik, iw = projections_problem(15)
    with pytest.raises(TypeError):
        indexer_kl_loss_from_projections(
            query, key, iq, ik, iw, client=client,
            attention_logits=jnp.zeros((2, 4, 8, 8)))
    with pytest.raises(TypeError):
        indexer_kl_loss(jnp.zeros((2, 8, 8)), attention_logits=jnp.zeros(
            (2, 4, 8, 8)), query=query, client=client)


def test_projections_traced_step_tag_and_vmap(client):
    run = "pytest-jax-projections-%d" % time.monotonic_ns()
    query, key, iq, ik, iw = projections_problem(16, batch=3)

    @jax.jit
    def train_step(iq, step):
        return jax.value_and_grad(lambda iq: indexer_kl_loss_from_projections(
            query, key, iq, ik, iw, causal=True, client=client, run=run,
            step=step, layer=0))(iq)

    for step in range(2):
        loss, _ = train_step(iq, jnp.int32(step))
    assert client.finish_step(run, 1).indexer_loss == pytest.approx(
        float(loss), rel=1e-6)
    # One request per mapped element.
    per_element = jax.vmap(
        lambda *xs: indexer_kl_loss_from_projections(
            *(x[None] for x in xs), causal=True, client=client))(
                query, key, iq, ik, iw)
    for i in range(3):
        single = client.compute_loss_from_projections(
            *(np.asarray(x[i:i + 1]) for x in (query, key, iq, ik, iw)),
            causal=True, want_grad=False)
        assert float(per_element[i]) == pytest.approx(single.loss, rel=1e-6)
