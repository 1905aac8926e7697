"""Shared-memory transport (klserve.SharedMemoryRegion, Client(shared_memory=
True)) against real servers started with --shared_memory, with real POSIX
shared memory: the answers equal the inline ones and the float64 reference,
the outputs land in the client's region, regions are reused, refusals fall
back inline with one log line, and an expired lease is registered again."""

import gc
import logging
import mmap
import os
import subprocess
import sys
import tempfile
import threading
import time

import grpc
import ml_dtypes
import numpy as np
import pytest

import klserve
from conftest import Server
from klserve._targets import is_local_target
from reference import indexer_kl_reference, projections_reference
from test_projections import projections
from test_stream import big_problem

SHM = "/dev/shm"


@pytest.fixture(scope="module")
def shm_server():
    srv = Server("--shared_memory")
    yield srv
    assert srv.stop() == 0, "".join(srv.log)


@pytest.fixture
def shm_client(shm_server):
    with shm_server.client(shared_memory=True) as c:
        yield c


def weights_problem(seed, batch=2, rows=16, keys=24):
    """Head-aggregated target (attention_weights), float32."""
    rng = np.random.default_rng(seed)
    return dict(
        indexer_scores=rng.standard_normal((batch, rows, keys)).astype(
            np.float32),
        attention_weights=rng.random((batch, rows, keys)).astype(np.float32))


def logits_problem(seed):
    """Per-head logits, float32, small."""
    return big_problem(seed, batch=2, heads=3, rows=8, keys=8)


def assert_matches_reference(result, ref, rtol=2e-5):
    assert result.denominator == ref["denominator"]
    assert result.loss == pytest.approx(ref["loss"], rel=rtol, abs=1e-9)
    scale = max(np.abs(ref["grad"]).max(), 1e-30)
    np.testing.assert_allclose(result.grad.astype(np.float64), ref["grad"],
                               rtol=rtol, atol=2e-6 * scale)


def region_names(client):
    return sorted(r.name for r in client.list_regions().regions)


def own_region(client):
    """The client's one layout region (the test's only call shape)."""
    (region,) = client._layouts.regions()
    return region


# -- the region type, without a server ---------------------------------------


def test_region_is_a_private_file_of_dev_shm_mapped_as_numpy():
    with klserve.SharedMemoryRegion(4096) as region:
        assert region.path == os.path.join(SHM, region.key)
        assert region.key.startswith("klserve-%d-" % os.getpid())
        assert os.stat(region.path).st_mode & 0o777 == 0o600
        a = region.array(64, (4, 8), np.float32)
        assert isinstance(a.base, mmap.mmap) and a.flags.writeable
        a[...] = 3.0
        # Another mapping of the same object sees the bytes: shared memory.
        with open(region.path, "rb") as f:
            raw = f.read()
        assert np.frombuffer(raw[64:64 + a.nbytes], np.float32).tolist() == (
            [3.0] * 32)
        assert region.offset_of(a) == 64
        assert region.offset_of(a[1:]) == 64 + 32
        assert region.offset_of(a[:, :2]) is None  # not contiguous
        assert region.offset_of(np.zeros(4, np.float32)) is None
        with pytest.raises(ValueError, match="multiple of 4"):
            region.array(2, (4,), np.float32)
        with pytest.raises(ValueError, match="past the region"):
            region.array(4000, (100,), np.float32)
        path = region.path
    assert not os.path.exists(path)
    assert region.closed
    # The view outlives close(): the mapping goes with the last view.
    assert float(a.sum()) == 96.0
    with pytest.raises(ValueError, match="closed"):
        region.array(0, (1,), np.uint8)


def test_region_never_reuses_or_follows_an_existing_name():
    with klserve.SharedMemoryRegion(16) as region:
        with pytest.raises(FileExistsError):
            klserve.SharedMemoryRegion(16, key=region.key)
    with tempfile.NamedTemporaryFile() as target:
        key = "klserve-test-link-%d" % os.getpid()
        os.symlink(target.name, os.path.join(SHM, key))
        try:
            with pytest.raises(OSError):
                klserve.SharedMemoryRegion(16, key=key)
        finally:
            os.unlink(os.path.join(SHM, key))
    for bad in ("", ".hidden", "a/b", "../x", "x" * 256):
        with pytest.raises(ValueError, match="key"):
            klserve.SharedMemoryRegion(16, key=bad)
    with pytest.raises(ValueError, match="byte_size"):
        klserve.SharedMemoryRegion(0)


def test_garbage_collection_unlinks_the_region():
    region = klserve.SharedMemoryRegion(16)
    path = region.path
    del region
    assert not os.path.exists(path)


@pytest.mark.parametrize("target, local", [
    ("unix:/run/klserve.sock", True), ("unix:///run/klserve.sock", True),
    ("localhost:50051", True), ("127.0.0.1:50051", True),
    ("127.3.2.1:1", True), ("[::1]:50051", True),
    ("dns:///localhost:50051", True), ("ipv4:127.0.0.1:50051", True),
    ("10.0.0.7:50051", False), ("klserve.example:50051", False),
    ("[2001:db8::1]:50051", False), ("localhost.example:1", False)])
def test_local_targets(target, local):
    assert is_local_target(target) is local


# -- against a server with --shared_memory ------------------------------------


def test_server_says_it_serves_regions(shm_server, server):
    with shm_server.client() as c:
        assert c.server_info().shared_memory is True
    with server.client() as c:
        assert c.server_info().shared_memory is False


def test_loss_and_grad_equal_inline_and_the_reference(shm_server, shm_client):
    p = weights_problem(1)
    got = shm_client.compute_loss(**p, causal=True, want_row_kl=True,
                                  want_diagnostics=True, recall_k=4)
    with shm_server.client() as inline_client:
        want = inline_client.compute_loss(**p, causal=True, want_row_kl=True,
                                          want_diagnostics=True, recall_k=4)
    assert got.shared_memory is True and want.shared_memory is False
    assert got.loss == want.loss and got.unscaled_loss == want.unscaled_loss
    assert got.diagnostics == want.diagnostics
    assert got.grad.tobytes() == want.grad.tobytes()
    assert got.row_kl.tobytes() == want.row_kl.tobytes()
    ref = indexer_kl_reference(p["indexer_scores"],
                               attention_weights=p["attention_weights"],
                               causal=True, recall_k=4)
    assert_matches_reference(got, ref)
    np.testing.assert_allclose(got.row_kl, ref["row_kl"], rtol=2e-5,
                               atol=1e-7)
    # The outputs are the region's bytes, not copies.
    region = own_region(shm_client)
    for arr in (got.grad, got.row_kl):
        assert isinstance(arr.base, mmap.mmap)
        assert region.offset_of(arr) is not None
        assert region.offset_of(arr) % 64 == 0
    assert region.key in region_names(shm_client)


def test_per_head_logits_bf16_and_fp16_grads(shm_client):
    p = logits_problem(2)
    ref = indexer_kl_reference(p["indexer_scores"],
                               attention_logits=p["attention_logits"],
                               causal=True, scaling_factor=0.01)
    got = shm_client.compute_loss(**p, causal=True, scaling_factor=0.01)
    assert_matches_reference(got, ref)
    for name, dtype in (("bf16", ml_dtypes.bfloat16), ("fp16", np.float16)):
        r = shm_client.compute_loss(**p, causal=True, scaling_factor=0.01,
                                    grad_dtype=name)
        assert r.shared_memory and r.grad.dtype == dtype
        scale = abs(ref["grad"]).max()
        np.testing.assert_allclose(r.grad.astype(np.float64), ref["grad"],
                                   rtol=1e-2, atol=1e-2 * scale)
    bf16 = {k: v.astype(ml_dtypes.bfloat16) for k, v in p.items()}
    r = shm_client.compute_loss(**bf16, causal=True)
    ref = indexer_kl_reference(bf16["indexer_scores"],
                               attention_logits=bf16["attention_logits"],
                               causal=True)
    assert_matches_reference(r, ref)


def test_sparse_stage_with_masks(shm_server, shm_client):
    rng = np.random.default_rng(3)
    batch, rows, keys, k = 2, 8, 32, 6
    topk = np.stack([np.stack([rng.choice(keys, k, replace=False)
                               for _ in range(rows)]) for _ in range(batch)])
    topk[0, 0, 3:] = -1
    p = dict(indexer_scores=rng.standard_normal((batch, rows, k)).astype(
                 np.float32),
             attention_weights=rng.random((batch, rows, k)).astype(
                 np.float32),
             topk_indices=topk.astype(np.int32),
             key_padding_mask=rng.random((batch, keys)) > 0.2,
             row_valid=rng.random((batch, rows)) > 0.1)
    options = dict(num_keys=keys, reduction="mean_valid")
    got = shm_client.compute_loss(**p, **options)
    with shm_server.client() as inline_client:
        want = inline_client.compute_loss(**p, **options)
    assert got.shared_memory
    assert got.loss == want.loss
    assert got.grad.tobytes() == want.grad.tobytes()
    assert_matches_reference(got, indexer_kl_reference(**p, **options))


def test_projections_form_over_shared_memory(shm_server, shm_client):
    rng = np.random.default_rng(4)
    f32 = np.float32
    p = dict(query=rng.standard_normal((2, 16, 4, 8)).astype(f32),
             key=rng.standard_normal((2, 16, 2, 8)).astype(f32),
             index_query=rng.standard_normal((2, 16, 3, 8)).astype(f32),
             index_key=rng.standard_normal((2, 16, 8)).astype(f32),
             index_weights=rng.standard_normal((2, 16, 3)).astype(f32))
    for options in (dict(causal=True), dict(causal=True, topk=5)):
        got = shm_client.compute_loss_from_projections(**p, **options)
        with shm_server.client() as inline_client:
            want = inline_client.compute_loss_from_projections(**p, **options)
        assert got.shared_memory and got.loss == want.loss
        fields = ["d_index_query", "d_index_key", "d_index_weights"]
        if "topk" in options:
            fields.append("topk_indices")
        for field in fields:
            arr = getattr(got, field)
            assert isinstance(arr.base, mmap.mmap), field
            assert arr.tobytes() == getattr(want, field).tobytes(), field
        ref = projections_reference(**p, **options)
        assert got.loss == pytest.approx(ref["loss"], rel=1e-4)
        for field in fields[:3]:
            scale = np.abs(ref[field]).max()
            np.testing.assert_allclose(getattr(got, field), ref[field],
                                       rtol=1e-3, atol=1e-4 * scale)
        if "topk" in options:
            np.testing.assert_array_equal(got.topk_indices,
                                          ref["topk_indices"])


def test_an_output_past_the_servers_limit_leaves_shared_memory_on(
        shm_server, caplog, monkeypatch):
    """A topk the server refuses (2^31) gives an output past its tensor
    limit: the call goes inline and the server names topk, rather than the
    client failing to make a 34 GB region and turning shared memory off for
    the rest of its life (an ML-engineer helper's finding)."""
    p = projections(5, batch=1, rows=4, keys=6, heads=2, kv_heads=2, dim=8,
                    index_heads=2, index_dim=8)
    # The sizes of the regions the client makes (where /dev/shm could hold
    # 34 GB, one that size would be made, and allocated).
    made = []
    real = klserve._client.SharedMemoryRegion

    def recording(size, *args, **kwargs):
        made.append(size)
        return real(size, *args, **kwargs)

    monkeypatch.setattr(klserve._client, "SharedMemoryRegion", recording)
    with shm_server.client(shared_memory=True) as c:
        assert c.compute_loss_from_projections(**p).shared_memory
        with caplog.at_level(logging.WARNING, logger="klserve"):
            with pytest.raises(klserve.KlserveError) as refused:
                c.compute_loss_from_projections(**p, topk=2**31)
        assert made and max(made) < 1 << 20, made
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "topk" in refused.value.details
        assert not [r for r in caplog.records if "shared memory off" in
                    r.getMessage()]
        assert c.compute_loss_from_projections(**p).shared_memory


def test_a_call_shape_keeps_its_region(shm_client):
    p, q = weights_problem(5), weights_problem(6)
    first = shm_client.compute_loss(**p)
    kept = first.grad.copy()
    names = region_names(shm_client)
    second = shm_client.compute_loss(**q)
    # The same region, reused: no new one on the server.
    assert region_names(shm_client) == names
    assert own_region(shm_client).offset_of(second.grad) is not None
    # As documented: the second call wrote over the first one's outputs.
    assert np.shares_memory(first.grad, second.grad)
    assert first.grad.tobytes() == second.grad.tobytes()
    assert kept.tobytes() != second.grad.tobytes()
    assert_matches_reference(second, indexer_kl_reference(**q))
    # Other shapes, another region.
    shm_client.compute_loss(**weights_problem(7, rows=8))
    assert len(region_names(shm_client)) == len(names) + 1


def forked_child_check(target):
    """Forks while a client holds a region; run in a fresh interpreter
    (test_a_forked_child_makes_regions_of_its_own), where no other
    library's threads (JAX's) are running at the fork."""
    problems = [weights_problem(60 + i) for i in range(8)]
    refs = [indexer_kl_reference(**p) for p in problems]

    def wrong_answers(client, order):
        wrong = 0
        for _ in range(4):
            for i in order:
                r = client.compute_loss(**problems[i], copy_outputs=True)
                try:
                    assert_matches_reference(r, refs[i])
                except AssertionError:
                    wrong += 1
        return wrong

    # One attempt: a connection the two processes shared would show as
    # UNAVAILABLE, which retries would hide.
    with klserve.Client(target, shared_memory=True, max_attempts=1) as client:
        assert wrong_answers(client, [0]) == 0
        (parent_region,) = client._layouts.regions()
        parents_names = region_names(client)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report and leave at once, whatever happens
            code = 1
            try:
                os.close(read)
                wrong = wrong_answers(client, range(4, 8))
                (own,) = client._layouts.regions()
                os.write(write, b"%d %s" % (wrong, own.key.encode()))
                client.close()
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        wrong = wrong_answers(client, range(4))
        with os.fdopen(read, "rb") as f:
            child_wrong, child_key = f.read().split()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert (wrong, int(child_wrong)) == (0, 0)
        assert child_key.decode().startswith("klserve-%d-" % pid)
        # The child's close() left the parent's region and connection to
        # the parent.
        assert region_names(client) == parents_names
        assert client._layouts.regions() == [parent_region]
        assert wrong_answers(client, [1]) == 0


def test_a_forked_child_makes_regions_of_its_own(shm_server):
    # A child forked from a process whose client has a region must not
    # write into it: the parent goes on using it, and the two processes'
    # tensors would mix, with no error anywhere.
    here = os.path.dirname(os.path.abspath(__file__))
    run = subprocess.run(
        [sys.executable, "-c",
         "import sys; sys.path.insert(0, %r); import test_shared_memory as t; "
         "t.forked_child_check(%r)" % (here, shm_server.target)],
        capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_copy_outputs_returns_arrays_of_their_own(shm_server):
    with shm_server.client(shared_memory=True, copy_outputs=True) as client:
        p, q = weights_problem(8), weights_problem(9)
        first = client.compute_loss(**p)
        second = client.compute_loss(**q)
        assert first.shared_memory and not np.shares_memory(first.grad,
                                                            second.grad)
        assert_matches_reference(first, indexer_kl_reference(**p))
        assert_matches_reference(second, indexer_kl_reference(**q))


def test_concurrent_calls_of_one_shape_get_regions_of_their_own(
        shm_server):
    problems = [weights_problem(30 + i) for i in range(6)]
    results = [None] * len(problems)
    with shm_server.client(shared_memory=True, copy_outputs=True) as client:
        def work(i):
            for _ in range(3):
                results[i] = client.compute_loss(**problems[i])

        threads = [threading.Thread(target=work, args=(i,))
                   for i in range(len(problems))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # No call read or wrote another's inputs or outputs.
        for result, p in zip(results, problems):
            assert result.shared_memory
            assert_matches_reference(result, indexer_kl_reference(**p))
        assert 1 <= len(client._layouts.regions()) <= len(problems)


def test_least_recently_used_shape_is_closed_past_capacity(shm_server):
    with shm_server.client(shared_memory=True,
                           shared_memory_layouts=1) as client:
        client.compute_loss(**weights_problem(10, rows=4))
        (first,) = client._layouts.regions()
        client.compute_loss(**weights_problem(10, rows=5))
        (second,) = client._layouts.regions()
        assert first.closed and not os.path.exists(first.path)
        names = region_names(client)
        assert first.key not in names and second.key in names


def test_close_unregisters_and_removes_the_regions(shm_server):
    client = shm_server.client(shared_memory=True)
    result = client.compute_loss(**weights_problem(11))
    region = own_region(client)
    assert region.key in region_names(client)
    client.close()
    assert not os.path.exists(region.path)
    with shm_server.client() as other:
        assert region.key not in region_names(other)
    # The caller's outputs stay readable: the mapping goes with them.
    assert np.isfinite(result.grad).all()


def test_a_client_dropped_without_close_unregisters_its_regions(shm_server):
    # Otherwise the server keeps each for its lease, against --max_regions,
    # which every job on the host shares.
    client = shm_server.client(shared_memory=True)
    client.compute_loss(**weights_problem(12))
    layout = own_region(client)
    mine = klserve.SharedMemoryRegion(64)
    mine.register(client, name="dropped-" + mine.key)
    names = {layout.key, "dropped-" + mine.key}
    with shm_server.client() as other:
        assert names <= set(region_names(other))
        del client, layout, mine
        gc.collect()
        assert not names & set(region_names(other))


def test_a_job_killed_leaves_no_files_in_dev_shm(shm_server):
    """However a job ends (SIGTERM at its default, SIGKILL, its own SIGTERM
    handler exiting), its regions' files go, the client's and its own, and
    it dies as it would have. A forked child, killed or exiting, takes none
    of its parent's files or registrations with it."""
    child = """
import os, signal, sys, numpy as np, klserve
mine = klserve.SharedMemoryRegion(4096)
client = klserve.Client(sys.argv[1], shared_memory=True)
mine.register(client, name="killed-" + mine.key)
w = np.ones((1, 64, 64), np.float32)
assert client.compute_loss(w, attention_weights=w).shared_memory
print(mine.key, client._layouts.regions()[0].key, flush=True)
how = sys.argv[2]
if how == "fork":
    # One child killed, one that exits through sys.exit (its copies of the
    # parent's regions and client are finalized there).
    pid = os.fork()
    if pid == 0:
        signal.pause()
    os.kill(pid, signal.SIGTERM)
    os.waitpid(pid, 0)
    pid = os.fork()
    if pid == 0:
        sys.exit(0)
    os.waitpid(pid, 0)
    assert os.path.exists(mine.path), "a child took the parent's file"
    assert client.compute_loss(w, attention_weights=w).shared_memory
    with klserve.Client(sys.argv[1]) as other:
        names = {r.name for r in other.list_regions().regions}
    assert "killed-" + mine.key in names, "a child ended its registration"
    how = "default"
if how == "own":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGTERM)
"""

    def gone(paths):
        for _ in range(200):
            if not any(os.path.exists(p) for p in paths):
                return True
            time.sleep(0.01)
        return False

    for how, code in (("default", -15), ("kill", -9), ("fork", -15),
                      ("own", 7)):
        proc = subprocess.run([sys.executable, "-c", child, shm_server.target,
                               how], capture_output=True, text=True,
                              timeout=60, check=False)
        assert proc.returncode == code, (how, proc.stderr)
        keys = proc.stdout.split()
        assert gone([os.path.join(SHM, key) for key in keys]), how
        if how == "own":  # its finalizers ran: the registrations end too
            with shm_server.client() as other:
                names = set(region_names(other))
            assert not {"killed-" + keys[0], keys[1]} & names


def test_callers_own_region_goes_by_reference(shm_server, shm_client):
    p = weights_problem(12)
    size = 2 * p["indexer_scores"].nbytes + 64
    with klserve.SharedMemoryRegion(size) as region:
        lease = region.register(shm_client, name="caller-inputs")
        assert lease > 0 and region.name == "caller-inputs"
        scores = region.array(0, p["indexer_scores"].shape, np.float32)
        weights = region.array(klserve.shared_memory.aligned(scores.nbytes),
                               p["attention_weights"].shape, np.float32)
        scores[...] = p["indexer_scores"]
        weights[...] = p["attention_weights"]
        got = shm_client.compute_loss(scores, attention_weights=weights,
                                      causal=True)
        assert_matches_reference(got, indexer_kl_reference(**p, causal=True))
        # The inputs were not copied: the client's own region holds the
        # gradient alone.
        listed = {r.name: r for r in shm_client.list_regions().regions}
        own = listed[own_region(shm_client).key]
        assert own.byte_size == got.grad.nbytes
        assert listed["caller-inputs"].key == region.key
        # Written in place, read in place by the next call.
        scores *= 2.0
        again = shm_client.compute_loss(scores, attention_weights=weights,
                                        causal=True)
        assert_matches_reference(again, indexer_kl_reference(
            p["indexer_scores"] * 2.0,
            attention_weights=p["attention_weights"], causal=True))
    assert "caller-inputs" not in region_names(shm_client)


def test_stream_true_keeps_inline_bytes_and_no_threshold_applies(shm_server):
    p = weights_problem(13)
    with shm_server.client(shared_memory=True,
                           stream_threshold_bytes=1024) as client:
        unary = client.compute_loss(**p)
        assert unary.shared_memory and not unary.streamed
        streamed = client.compute_loss(**p, stream=True)
        assert streamed.streamed and not streamed.shared_memory
        assert streamed.grad.tobytes() == unary.grad.tobytes()


def test_unix_socket_target(tmp_path):
    path = tmp_path / "klserve.sock"
    server = Server("--shared_memory", listen="127.0.0.1:0,unix:%s" % path)
    try:
        with klserve.Client("unix:%s" % path, shared_memory=True) as client:
            p = weights_problem(14)
            got = client.compute_loss(**p, causal=True)
            assert got.shared_memory
            assert isinstance(got.grad.base, mmap.mmap)
            assert_matches_reference(got, indexer_kl_reference(**p,
                                                               causal=True))
    finally:
        assert server.stop() == 0, "".join(server.log)


def test_server_without_regions_falls_back_with_one_log_line(server, caplog):
    p = weights_problem(15)
    with caplog.at_level(logging.INFO, logger="klserve"):
        with server.client(shared_memory=True) as client:
            first = client.compute_loss(**p)
            second = client.compute_loss(**p)
    lines = [r for r in caplog.records if r.name == "klserve"]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].levelno == logging.WARNING
    assert "--shared_memory" in lines[0].getMessage()
    assert not first.shared_memory and not second.shared_memory
    assert_matches_reference(second, indexer_kl_reference(**p))


def test_refused_registration_falls_back_with_one_log_line(tmp_path, caplog):
    # --max_region_bytes smaller than the call's layout: RESOURCE_EXHAUSTED.
    server = Server("--shared_memory", "--max_region_bytes=1024")
    try:
        p = weights_problem(16)
        with caplog.at_level(logging.INFO, logger="klserve"):
            with server.client(shared_memory=True) as client:
                results = [client.compute_loss(**p) for _ in range(2)]
                assert client.list_regions().regions == ()
        lines = [r for r in caplog.records if r.name == "klserve"]
        assert len(lines) == 1, [r.getMessage() for r in lines]
        assert "RESOURCE_EXHAUSTED" in lines[0].getMessage()
        assert not any(r.shared_memory for r in results)
        assert_matches_reference(results[1], indexer_kl_reference(**p))
    finally:
        assert server.stop() == 0, "".join(server.log)


def test_expired_lease_is_registered_again(caplog):
    server = Server("--shared_memory", "--region_lease=1s")
    try:
        with server.client(shared_memory=True) as client:
            p, q = weights_problem(17), weights_problem(18)
            assert_matches_reference(client.compute_loss(**p),
                                     indexer_kl_reference(**p))
            key = own_region(client).key
            assert key in region_names(client)
            deadline = time.monotonic() + 20
            while key in region_names(client):
                assert time.monotonic() < deadline, "the lease never ended"
                time.sleep(0.25)
            with caplog.at_level(logging.INFO, logger="klserve"):
                again = client.compute_loss(**q)
            assert again.shared_memory
            assert_matches_reference(again, indexer_kl_reference(**q))
            assert own_region(client).key == key
            assert not [r for r in caplog.records if r.name == "klserve"]
    finally:
        assert server.stop() == 0, "".join(server.log)


# -- the frameworks ----------------------------------------------------------


def test_jax_grad_through_a_shared_memory_client(shm_client):
    jax = pytest.importorskip("jax")
    from klserve.jax import indexer_kl_loss

    p, q = weights_problem(19), weights_problem(20)

    def loss(scores, weights):
        return indexer_kl_loss(scores, attention_weights=weights,
                               causal=True, client=shm_client)

    grad = jax.jit(jax.grad(loss))
    g_p = grad(p["indexer_scores"], p["attention_weights"])
    # The same shapes again write the client's region over; JAX's arrays
    # must be copies of it, not views.
    g_q = grad(q["indexer_scores"], q["attention_weights"])
    for g, problem in ((g_p, p), (g_q, q)):
        ref = indexer_kl_reference(**problem, causal=True)["grad"]
        np.testing.assert_allclose(np.asarray(g), ref, rtol=2e-5,
                                   atol=2e-6 * abs(ref).max())
    # vmap: one call per element, each of the same shape.
    batched = jax.vmap(grad)(np.stack([p["indexer_scores"],
                                       q["indexer_scores"]]),
                             np.stack([p["attention_weights"],
                                       q["attention_weights"]]))
    np.testing.assert_array_equal(np.asarray(batched[0]), np.asarray(g_p))
    np.testing.assert_array_equal(np.asarray(batched[1]), np.asarray(g_q))


def test_torch_backward_through_a_shared_memory_client(shm_client):
    torch = pytest.importorskip("torch")
    from klserve.torch import indexer_kl_loss

    problems = [weights_problem(21), weights_problem(22)]
    scores = [torch.tensor(p["indexer_scores"], requires_grad=True)
              for p in problems]
    # Two forward passes of the same shapes before either backward (two
    # microbatches): the first's gradient must survive the second call.
    losses = [indexer_kl_loss(s, attention_weights=torch.tensor(
        p["attention_weights"]), causal=True, client=shm_client)
        for s, p in zip(scores, problems)]
    for loss in losses:
        loss.backward()
    for s, p in zip(scores, problems):
        ref = indexer_kl_reference(**p, causal=True)
        np.testing.assert_allclose(s.grad.numpy(), ref["grad"], rtol=2e-5,
                                   atol=2e-6 * abs(ref["grad"]).max())


class CallInBetween:
    """A client whose every answer is followed, before its caller has it,
    by another call of the same shapes with other values: as another
    thread's call sharing the client may come. The region's views in the
    first answer then hold the second call's numbers."""

    def __init__(self, client, other):
        self.client = client
        self.other = other

    def compute_loss(self, indexer_scores, **arguments):
        result = self.client.compute_loss(indexer_scores, **arguments)
        arguments.pop("copy_outputs", None)
        arguments["attention_weights"] = self.other["attention_weights"]
        self.client.compute_loss(self.other["indexer_scores"], **arguments)
        return result


def test_wrappers_copy_gradients_before_another_call_can_write_them(
        shm_client):
    # Threads sharing a shared-memory client: a call's gradients were views
    # of the region until the wrapper copied them, after the call had
    # given the region back (3-6% of the calls of 4 threads took another
    # thread's gradient, a helper found).
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    import klserve.jax
    import klserve.torch

    p, q = weights_problem(23), weights_problem(24)
    client = CallInBetween(shm_client, q)
    ref = indexer_kl_reference(**p, causal=True)["grad"]
    tolerance = dict(rtol=2e-5, atol=2e-6 * abs(ref).max())

    scores = torch.tensor(p["indexer_scores"], requires_grad=True)
    klserve.torch.indexer_kl_loss(
        scores, attention_weights=torch.tensor(p["attention_weights"]),
        causal=True, client=client).backward()
    np.testing.assert_allclose(scores.grad.numpy(), ref, **tolerance)

    grad = jax.grad(lambda s, w: klserve.jax.indexer_kl_loss(
        s, attention_weights=w, causal=True, client=client))
    np.testing.assert_allclose(
        np.asarray(grad(p["indexer_scores"], p["attention_weights"])), ref,
        **tolerance)


def test_copy_outputs_per_call(shm_client):
    p, q = weights_problem(25), weights_problem(26)
    kept = shm_client.compute_loss(**p, copy_outputs=True)
    view = shm_client.compute_loss(**q)
    assert kept.shared_memory and not np.shares_memory(kept.grad, view.grad)
    assert_matches_reference(kept, indexer_kl_reference(**p))
    # The view is the region's: the next call of these shapes writes it.
    again = shm_client.compute_loss(**p)
    assert np.shares_memory(view.grad, again.grad)


def test_default_client_takes_shared_memory_from_the_environment(
        shm_server, monkeypatch):
    import klserve._client
    monkeypatch.setattr(klserve._client, "_default_client", None)
    monkeypatch.setenv("KLSERVE_TARGET", shm_server.target)
    monkeypatch.setenv("KLSERVE_SHARED_MEMORY", "1")
    client = klserve.default_client()
    try:
        p = weights_problem(40)
        result = client.compute_loss(**p)
        assert result.shared_memory
        assert_matches_reference(result, indexer_kl_reference(**p))
    finally:
        client.close()
