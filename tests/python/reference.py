"""A float64 NumPy reference of the indexer KL loss, written from
docs/spec.md for these tests (vectorised; not fast, not
clever). Inputs are taken as the values the service receives: pass bf16 /
fp16 arrays and they are widened exactly."""

import numpy as np

EPS = 1e-8


def _f64(x):
    return None if x is None else np.asarray(x).astype(np.float64)


def validity(batch, rows, keys, *, topk_indices=None, segment_ids_q=None,
             segment_ids_kv=None, attention_mask=None, key_padding_mask=None,
             key_start=None, key_end=None, causal=False, q_offset=None):
    """valid[b, t, slot]: [B, T, S] dense, [B, T, K] sparse."""
    q_offset = keys - rows if q_offset is None else q_offset
    valid = np.ones((batch, rows, keys), bool)
    if causal:
        pos = np.arange(rows)[:, None] + q_offset
        valid &= np.arange(keys)[None, :] <= pos
    if segment_ids_q is not None:
        sq = np.asarray(segment_ids_q)[:, :, None]
        skv = np.asarray(segment_ids_kv)[:, None, :]
        valid &= (sq == skv) & (skv >= 0)
    if attention_mask is not None:
        valid &= np.asarray(attention_mask, bool)
    if key_padding_mask is not None:
        valid &= np.asarray(key_padding_mask, bool)[:, None, :]
    if key_start is not None:
        s = np.arange(keys)[None, None, :]
        valid &= (np.asarray(key_start)[..., None] <= s) & (
            s < np.asarray(key_end)[..., None])
    if topk_indices is None:
        return valid
    idx = np.asarray(topk_indices).astype(np.int64)
    in_range = (idx >= 0) & (idx < keys)
    safe = np.where(in_range, idx, 0)
    return in_range & np.take_along_axis(valid, safe, axis=2)


def _masked_softmax(x, valid):
    """softmax over the last axis among valid entries; (probs, log-probs);
    rows without a valid entry give zeros / -inf."""
    xm = np.where(valid, x, -np.inf)
    m = xm.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        e = np.where(valid, np.exp(xm - m), 0.0)
        total = e.sum(axis=-1, keepdims=True)
        lse = m + np.log(total)
        logp = np.where(valid, xm - lse, -np.inf)
        prob = np.where(valid & (total > 0), e / np.where(total > 0, total, 1),
                        0.0)
    return prob, logp


def indexer_kl_reference(indexer_scores, *, attention_logits=None,
                         attention_weights=None, topk_indices=None,
                         segment_ids_q=None, segment_ids_kv=None,
                         attention_mask=None, key_padding_mask=None,
                         key_start=None, key_end=None,
                         row_valid=None, causal=False, q_offset=None,
                         num_keys=None, softmax_scale=None, flavor="exact",
                         reduction="mean", scaling_factor=None, grad_scale=None,
                         recall_k=0):
    """Returns a dict: loss, unscaled_loss, denominator, rows_counted,
    rows_fully_masked, rows_zero_target, grad (float64, like the scores),
    row_kl [B, T], mean_entropy_p, mean_entropy_q, topk_recall."""
    scores = _f64(indexer_scores)
    batch, rows, width = scores.shape
    keys = num_keys if topk_indices is not None else width
    scale = 1.0 if softmax_scale is None else softmax_scale
    c = 1.0 if scaling_factor is None else scaling_factor
    valid = validity(batch, rows, keys, topk_indices=topk_indices,
                     segment_ids_q=segment_ids_q,
                     segment_ids_kv=segment_ids_kv,
                     attention_mask=attention_mask,
                     key_padding_mask=key_padding_mask, key_start=key_start,
                     key_end=key_end, causal=causal, q_offset=q_offset)
    has_valid = valid.any(axis=-1)

    # The target: x = sum over heads of P_h, or the aggregated weights.
    if attention_logits is not None:
        logits = _f64(attention_logits) * scale
        heads = logits.shape[1]
        per_head, _ = _masked_softmax(logits, valid[:, None])
        x = per_head.sum(axis=1)
    else:
        heads = None
        x = np.where(valid, _f64(attention_weights), 0.0)
    x_sum = x.sum(axis=-1)
    zero_target = has_valid & (x_sum == 0)
    computed = has_valid & ~zero_target
    with np.errstate(invalid="ignore", divide="ignore"):
        if flavor == "maxtext":
            p = x / (x_sum + EPS)[..., None]
        elif heads is not None:
            p = x / heads
        else:
            p = x / np.where(x_sum > 0, x_sum, 1)[..., None]
    p = np.where(computed[..., None] & valid, p, 0.0)

    q, logq = _masked_softmax(scores, valid)
    with np.errstate(invalid="ignore", divide="ignore"):
        if flavor == "maxtext":
            kl = np.where(valid, p * (np.log(p + EPS) - np.log(q + EPS)),
                          0.0).sum(-1)
            g = -p / (q + EPS)
            qg = np.where(valid, q * g, 0.0).sum(-1, keepdims=True)
            dkl = np.where(valid, q * (g - qg), 0.0)
        else:
            kl = np.where(valid & (p > 0), p * (np.log(p) - logq),
                          0.0).sum(-1)
            dkl = np.where(valid, q - p, 0.0)
        ent_p = -np.where(valid & (p > 0), p * np.log(p), 0.0).sum(-1)
        ent_q = -np.where(valid & (q > 0), q * logq, 0.0).sum(-1)

    counted = computed.copy()
    if row_valid is not None:
        counted &= np.asarray(row_valid, bool)
    row_kl = np.where(counted, kl, 0.0)

    if reduction == "mean":
        n = batch * rows
    elif reduction == "mean_valid":
        n = (int(np.asarray(row_valid, bool).sum()) if row_valid is not None
             else int(computed.sum()))
    elif reduction == "sum":
        n = 1
    else:
        raise ValueError(reduction)
    unscaled = row_kl.sum() / n if n > 0 else 0.0
    g = 1.0 if grad_scale is None else grad_scale
    grad = np.where(counted[..., None], dkl, 0.0) * (c / n * g if n > 0 else 0.0)

    recall = None
    if recall_k:
        total = 0.0
        for b, t in zip(*np.nonzero(counted)):
            slots = np.nonzero(valid[b, t])[0]
            # Highest score first, ties to the lower key (the slot's key in
            # the sparse stage).
            slot_keys = (slots if topk_indices is None else
                         np.asarray(topk_indices)[b, t, slots])
            order = slots[np.lexsort((slot_keys, -scores[b, t, slots]))]
            total += p[b, t, order[:recall_k]].sum()
        recall = total / counted.sum() if counted.any() else 0.0

    n_counted = int(counted.sum())
    return dict(
        loss=c * unscaled, unscaled_loss=unscaled, denominator=n,
        rows_counted=n_counted,
        rows_fully_masked=int((~has_valid).sum()),
        rows_zero_target=int(zero_target.sum()),
        grad=grad, row_kl=row_kl,
        mean_entropy_p=ent_p[counted].sum() / max(n_counted, 1),
        mean_entropy_q=ent_q[counted].sum() / max(n_counted, 1),
        topk_recall=recall)


def projection_scores(query, key, index_query, index_key, index_weights, *,
                      softmax_scale=None, index_weight_scale=None,
                      use_relu=True):
    """The projections form's two score tensors in float64, materialised:
    (a [B, H, T, S], I [B, T, S], u [B, T, H_I, S], w_eff [B, T, H_I])."""
    q, k = _f64(query), _f64(key)
    iq, ik, iw = _f64(index_query), _f64(index_key), _f64(index_weights)
    heads, kv_heads = q.shape[2], k.shape[2]
    group = heads // kv_heads
    k_per_head = np.repeat(k, group, axis=2)  # head h reads h // group
    scale = 1.0 if softmax_scale is None else softmax_scale
    a = scale * np.einsum("bthd,bshd->bhts", q, k_per_head)
    h_i, d_i = iq.shape[2], iq.shape[3]
    w_scale = (1.0 / np.sqrt(h_i * d_i) if index_weight_scale is None
               else index_weight_scale)
    w_eff = w_scale * iw
    u = np.einsum("btjd,bsd->btjs", iq, ik)
    r = np.maximum(u, 0.0) if use_relu else u
    scores = np.einsum("btj,btjs->bts", w_eff, r)
    return a, scores, u, w_eff


def server_topk(scores, valid, k):
    """The service's selection: per row the k valid keys of highest score,
    ties to the lower key, in ascending key order, then -1."""
    batch, rows, keys = scores.shape
    out = np.full((batch, rows, k), -1, np.int32)
    for b in range(batch):
        for t in range(rows):
            cand = np.nonzero(valid[b, t])[0]
            # Stable sort on -score keeps the lower key first among ties.
            order = cand[np.argsort(-scores[b, t, cand], kind="stable")]
            chosen = np.sort(order[:k])
            out[b, t, :len(chosen)] = chosen
    return out


def projections_reference(query, key, index_query, index_key, index_weights,
                          *, topk_indices=None, topk=None, softmax_scale=None,
                          index_weight_scale=None, use_relu=True,
                          flavor="exact", reduction="mean",
                          scaling_factor=None, grad_scale=None, **masks):
    """The projections form in float64: the logits form fed a and I from
    the same projections (indexer_kl_reference), its gradient G = dL/dI
    carried by hand into index_query, index_key and index_weights. `masks`:
    causal, q_offset, segment ids, attention_mask, key_padding_mask, key
    bounds, row_valid. Returns indexer_kl_reference's dict plus
    d_index_query, d_index_key, d_index_weights and topk_indices."""
    # S is the keys' count here; the logits-form reference is told it.
    masks.pop("num_keys", None)
    a, scores, u, w_eff = projection_scores(
        query, key, index_query, index_key, index_weights,
        softmax_scale=softmax_scale, index_weight_scale=index_weight_scale,
        use_relu=use_relu)
    batch, rows, keys = scores.shape
    mask_args = {name: masks.get(name) for name in (
        "segment_ids_q", "segment_ids_kv", "attention_mask",
        "key_padding_mask", "key_start", "key_end")}
    dense_valid = validity(batch, rows, keys, causal=masks.get("causal",
                                                               False),
                           q_offset=masks.get("q_offset"), **mask_args)
    if topk is not None:
        topk_indices = server_topk(scores, dense_valid, topk)
    options = dict(masks, flavor=flavor, reduction=reduction,
                   scaling_factor=scaling_factor, grad_scale=grad_scale)
    if topk_indices is None:
        result = indexer_kl_reference(scores, attention_logits=a, **options)
        g = result["grad"]
    else:
        idx = np.asarray(topk_indices).astype(np.int64)
        names_key = (idx >= 0) & (idx < keys)  # else an empty slot
        safe = np.where(names_key, idx, 0)
        result = indexer_kl_reference(
            np.take_along_axis(scores, safe, axis=2),
            attention_logits=np.take_along_axis(a, safe[:, None], axis=3),
            topk_indices=idx, num_keys=keys, **options)
        # The compact gradient back on its keys (0 at invalid slots; a key
        # named twice is an error, so no two slots land on one key).
        g = np.zeros_like(scores)
        b_i, t_i, j_i = np.nonzero(names_key)
        g[b_i, t_i, idx[b_i, t_i, j_i]] = result["grad"][b_i, t_i, j_i]
    r = np.maximum(u, 0.0) if use_relu else u
    dr = (u > 0).astype(np.float64) if use_relu else np.ones_like(u)
    h_i, d_i = u.shape[2], _f64(index_query).shape[3]
    iws = (1.0 / np.sqrt(h_i * d_i) if index_weight_scale is None
           else index_weight_scale)
    coef = g[:, :, None, :] * w_eff[..., None] * dr  # [B, T, H_I, S]
    result.update(
        d_index_weights=iws * np.einsum("bts,btjs->btj", g, r),
        d_index_query=np.einsum("btjs,bsd->btjd", coef, _f64(index_key)),
        d_index_key=np.einsum("btjs,btjd->bsd", coef, _f64(index_query)),
        topk_indices=topk_indices)
    return result


def lse_of(a, valid):
    """Each head's natural-log log-sum-exp of the logits a [B, H, T, S]
    over the valid keys [B, T, S], float32 [B, H, T] (+inf where a row has
    none, the usual value there)."""
    am = np.where(valid[:, None], a, -np.inf)
    m = am.max(-1)
    finite = np.isfinite(m)
    with np.errstate(invalid="ignore", divide="ignore"):
        total = np.where(valid[:, None], np.exp(am - np.where(
            finite, m, 0)[..., None]), 0).sum(-1)
        lse = np.where(finite, m + np.log(total), np.inf)
    return lse.astype(np.float32)
