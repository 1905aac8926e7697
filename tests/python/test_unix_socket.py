"""klserve.Client over a Unix-domain socket (--listen=unix:/path): the same
answer, bit for bit, as over TCP, unary and streamed."""

import os
import tempfile

import numpy as np

import klserve
from conftest import Server


def test_socket_and_tcp_give_the_same_bits():
    with tempfile.TemporaryDirectory(prefix="klserve-py-") as directory:
        path = os.path.join(directory, "klserve.sock")
        server = Server(listen="127.0.0.1:0,unix:" + path)
        try:
            rng = np.random.default_rng(5)
            problem = dict(
                indexer_scores=rng.standard_normal((2, 64, 300)).astype(
                    np.float32),
                attention_weights=rng.random((2, 64, 300)).astype(np.float32))
            # 300 KB of input: past the client's threshold, so it streams.
            small = {k: v[:, :4] for k, v in problem.items()}
            results = {}
            for target in (server.target, "unix:" + path):
                with klserve.Client(target,
                                    stream_threshold_bytes=128 << 10) as client:
                    assert client.health() is True
                    results[target] = (client.compute_loss(**small,
                                                           causal=True),
                                       client.compute_loss(**problem,
                                                           causal=True))
            tcp, uds = results.values()
            for over_tcp, over_socket in zip(tcp, uds):
                assert over_tcp.loss == over_socket.loss
                assert over_tcp.grad.tobytes() == over_socket.grad.tobytes()
            assert tcp[0].streamed is False and tcp[1].streamed is True
            assert uds[1].streamed is True
        finally:
            assert server.stop() == 0, "".join(server.log)
        assert not os.path.exists(path), "the socket outlived the server"
