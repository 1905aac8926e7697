"""klserve's per-step loss, end to end, through the real tools.

Starts the real klserve binary and a real Prometheus server (Debian's
`prometheus`) scraping it, both on loopback with temporary storage; drives
tagged requests with klctl; then checks
- through Prometheus's HTTP API, that the loss series holds each step's value
  as computed here from the per-request losses klctl printed;
- that every PromQL expression of the shipped dashboard and alert rules is
  accepted by Prometheus, and that the dashboard's return data;
- with TensorBoard's own reader (EventAccumulator), that the run's event file
  holds the exact scalar of every step.

Environment: KLSERVE_BIN, KLCTL_BIN, PROMETHEUS_BIN (all required).
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = "e2e/run-1"  # a slash: a subdirectory, shown as the run "e2e/run-1"
C = 0.01
STEPS = 4
LAYERS = 2
MICROBATCHES = 2
# Expressions that are valid but rightly return nothing in a healthy run.
EMPTY_OK = re.compile(
    r'nonfinite|tensorboard_write_errors|late_samples|refused_at_limit_total\[1m\]|code!="OK"')


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout, what):
    """Polls `predicate` until truthy; a refused connection or an HTTP error
    (urllib.error.HTTPError is a URLError) counts as not yet."""
    deadline = time.time() + timeout
    last_error = None
    while time.time() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (urllib.error.URLError, ConnectionError) as e:
            last_error = e
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what} (last error: {last_error})")


def http_get_json(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


class Prometheus:
    def __init__(self, port):
        self.url = f"http://127.0.0.1:{port}"

    def query(self, expr):
        q = urllib.parse.urlencode({"query": expr})
        try:
            return http_get_json(f"{self.url}/api/v1/query?{q}")
        except urllib.error.HTTPError as e:
            # 400/422 answer a bad expression in JSON; anything else (503
            # while Prometheus starts) is raised, and wait_for polls again.
            if e.code not in (400, 422):
                raise
            return json.load(e)

    def value(self, expr):
        result = self.query(expr)["data"]["result"]
        return float(result[0]["value"][1]) if result else None


@pytest.fixture(scope="module")
def stack():
    for var in ("KLSERVE_BIN", "KLCTL_BIN", "PROMETHEUS_BIN"):
        if not os.environ.get(var):
            pytest.fail(f"{var} is not set")
    tmp = tempfile.mkdtemp(prefix="klserve_e2e_")
    grpc_port, metrics_port, prom_port = free_port(), free_port(), free_port()
    tb_dir = os.path.join(tmp, "tb")
    server = subprocess.Popen(
        [os.environ["KLSERVE_BIN"], f"--listen=127.0.0.1:{grpc_port}",
         f"--metrics_listen=127.0.0.1:{metrics_port}", f"--tensorboard_dir={tb_dir}",
         "--threads=2", "--step_idle_timeout=10m"],
        stderr=subprocess.PIPE, text=True)
    config = os.path.join(tmp, "prometheus.yml")
    with open(config, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                "scrape_configs:\n  - job_name: klserve\n    static_configs:\n"
                f"      - targets: ['127.0.0.1:{metrics_port}']\n")
    prom = subprocess.Popen(
        [os.environ["PROMETHEUS_BIN"], f"--config.file={config}",
         f"--storage.tsdb.path={os.path.join(tmp, 'data')}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    prometheus = Prometheus(prom_port)
    try:
        wait_for(lambda: klctl(grpc_port, "health", check=False).returncode == 0,
                 30, "klserve SERVING")
        wait_for(lambda: prometheus.value('up{job="klserve"}') == 1.0, 60,
                 "Prometheus to scrape klserve")
        yield {"grpc": grpc_port, "prometheus": prometheus, "tb_dir": tb_dir,
               "tmp": tmp}
    finally:
        prom.terminate()
        server.send_signal(signal.SIGTERM)  # drains: closes the event files
        try:
            assert server.wait(timeout=30) == 0
        finally:
            prom.kill()
            server.kill()


def klctl(port, *args, check=True):
    out = subprocess.run([os.environ["KLCTL_BIN"], *args, f"--target=127.0.0.1:{port}",
                          "--deadline=30s"], capture_output=True, text=True, timeout=60)
    if check and out.returncode != 0:
        raise AssertionError(f"klctl {args[0]} failed: {out.stderr}")
    return out


def parse(output):
    return dict(line.split(": ", 1) for line in output.splitlines() if ": " in line)


def drive_step(stack, step, rng):
    """Sends one step's requests; returns the step's expected indexer_loss."""
    layer_means = []
    for layer in range(LAYERS):
        unscaled = []
        for mb in range(MICROBATCHES):
            weights = rng.random((1, 6, 12)).astype(np.float32)
            scores = (3 * rng.standard_normal((1, 6, 12))).astype(np.float32)
            w = os.path.join(stack["tmp"], "w.npy")
            s = os.path.join(stack["tmp"], "s.npy")
            np.save(w, weights)
            np.save(s, scores)
            out = klctl(stack["grpc"], "loss", f"--attention_weights={w}",
                        f"--indexer_scores={s}", "--causal", f"--scaling_factor={C}",
                        "--diagnostics", "--recall_k=4",
                        f"--run={RUN}", f"--step={step}", f"--layer={layer}",
                        f"--microbatch={mb}").stdout
            unscaled.append(float(parse(out)["unscaled_loss"]))
        # MEAN reduction: every request has N = B*T rows, so the row-weighted
        # mean over microbatches is their plain mean.
        layer_means.append(sum(unscaled) / len(unscaled))
    return C * sum(layer_means) / len(layer_means)


def test_loss_series_metrics_and_event_files(stack):
    rng = np.random.default_rng(7)
    prom = stack["prometheus"]
    label = RUN.replace("\\", "\\\\").replace('"', '\\"')
    expected = {}
    for step in range(1, STEPS + 1):
        expected[step] = drive_step(stack, step, rng)
        if step > 1:
            # Step `step` finished step - 1; wait until Prometheus saw it.
            done = step - 1
            wait_for(lambda: prom.value(f'klserve_indexer_last_step{{run="{label}"}}') == done,
                     30, f"step {done} in Prometheus")
            got = prom.value(f'klserve_indexer_loss{{run="{label}",layer="all"}}')
            assert got == pytest.approx(expected[done], rel=1e-9), done
    # The last step is published by FinishStep.
    finished = parse(klctl(stack["grpc"], "finish-step", f"--run={RUN}",
                           f"--step={STEPS}").stdout)
    assert float(finished["indexer_loss"]) == pytest.approx(expected[STEPS], rel=1e-12)
    # Asked again (another rank, say), the step is already published: klctl
    # says so and prints the published value with it.
    again = parse(klctl(stack["grpc"], "finish-step", f"--run={RUN}",
                        f"--step={STEPS}").stdout)
    assert again["already_finished"] == "true"
    assert again["indexer_loss"] == finished["indexer_loss"]
    assert again["requests"] == finished["requests"]
    wait_for(lambda: prom.value(f'klserve_indexer_last_step{{run="{label}"}}') == STEPS,
             30, "the last step in Prometheus")
    assert prom.value(f'klserve_indexer_loss{{run="{label}",layer="all"}}') == \
        pytest.approx(expected[STEPS], rel=1e-9)
    total = prom.value(f'klserve_indexer_loss_sum_total{{run="{label}",layer="all"}}')
    assert total == pytest.approx(sum(expected.values()), rel=1e-9)
    assert prom.value(f'klserve_indexer_steps_total{{run="{label}",layer="all"}}') == STEPS

    # Every expression of the dashboard and the alert rules is valid; the
    # dashboard's return data. Rates need two scrapes after the requests.
    time.sleep(3)
    lines = subprocess.run(
        [sys.executable, os.path.join(REPO, "tests/metrics/promql_expressions.py")],
        capture_output=True, text=True, check=True).stdout.splitlines()
    assert lines, "no expressions found"
    for line in lines:
        item = json.loads(line)
        answer = prom.query(item["expr"])
        assert answer["status"] == "success", (item, answer)
        if item["source"].startswith("klserve.json") and not EMPTY_OK.search(item["expr"]):
            assert answer["data"]["result"], f"no data: {item}"

    # TensorBoard's own reader finds the exact scalar of every step (written
    # as float32) once the server has drained and closed the file.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    assert os.listdir(stack["tb_dir"]) == ["e2e"]
    acc = EventAccumulator(os.path.join(stack["tb_dir"], RUN))

    def all_steps_written():  # the server flushes its files every second
        acc.Reload()
        return ("indexer_loss" in acc.Tags()["scalars"]
                and len(acc.Scalars("indexer_loss")) == STEPS)

    wait_for(all_steps_written, 30, "the event file")
    events = acc.Scalars("indexer_loss")
    assert [e.step for e in events] == list(range(1, STEPS + 1))
    for e in events:
        assert e.value == float(np.float32(expected[e.step])), e
    layer_tags = {t for t in acc.Tags()["scalars"] if t.startswith("indexer_loss/layer_")}
    assert layer_tags == {f"indexer_loss/layer_{l}" for l in range(LAYERS)}
