#!/usr/bin/env bash
# The toy indexer demo in one command: builds klserve alone (scripts/klserve.sh
# build klserve), starts it with TensorBoard event files and Prometheus metrics,
# starts a Prometheus that scrapes it every 250 ms, trains
# examples/train_toy_indexer.py against it, and then shows the falling loss
# as Prometheus recorded it and as TensorBoard reads it. Everything listens
# on free loopback ports and is stopped at the end; the event files stay.
#
#   examples/run_demo.sh [ARGS...]     ARGS go to train_toy_indexer.py
#
# Environment:
#   KLSERVE_BIN     a built server to use; skips the build
#   PYTHON          a Python with klserve (pip install ./client/python), jax,
#                   optax and tensorboard; default: the tests' BUILD_DIR/venv
#                   when it has them, else BUILD_DIR/venv-demo, made on first
#                   use
#   BUILD_DIR       default ROOT/build
#   TB_DIR          TensorBoard directory; default BUILD_DIR/demo-tensorboard
#   PROMETHEUS      the prometheus binary; default: prometheus on PATH (the
#                   Debian package scripts/klserve.sh installs); without one
#                   the demo skips the Prometheus part and says so
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
TB_DIR="${TB_DIR:-$BUILD_DIR/demo-tensorboard}"
PROMETHEUS="${PROMETHEUS:-$(command -v prometheus || true)}"

log() { echo "run_demo.sh: $*" >&2; }

# 1. The server.
if [[ -z "${KLSERVE_BIN:-}" ]]; then
  BUILD_DIR="$BUILD_DIR" "$ROOT/scripts/klserve.sh" build klserve
  KLSERVE_BIN="$BUILD_DIR/server/klserve"
fi

# 2. The Python side.
has_modules() { "$1" -c "import klserve, jax, optax, tensorboard" 2>/dev/null; }
if [[ -z "${PYTHON:-}" ]] && has_modules "$BUILD_DIR/venv/bin/python"; then
  PYTHON="$BUILD_DIR/venv/bin/python"
fi
if [[ -z "${PYTHON:-}" ]]; then
  venv="$BUILD_DIR/venv-demo"
  PYTHON="$venv/bin/python"
  if ! has_modules "$PYTHON"; then
    log "making $venv with the klserve client, jax, optax and tensorboard"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check \
      "$ROOT/client/python" jax optax tensorboard
  fi
fi
TENSORBOARD="$(dirname "$PYTHON")/tensorboard"

work="$(mktemp -d -t klserve-demo.XXXXXX)"
pids=()
stop_all() {
  local pid
  for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      wait "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$work"
}
trap stop_all EXIT

# 3. The server, on free loopback ports (it names them on stderr).
mkdir -p "$TB_DIR"
"$KLSERVE_BIN" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  --tensorboard_dir="$TB_DIR" 2>"$work/server.log" &
pids+=($!)
port="" metrics_port=""
for _ in $(seq 300); do
  port="$(sed -n 's/.*serving on port \([0-9]*\).*/\1/p' "$work/server.log")"
  metrics_port="$(sed -n 's/.*metrics on port \([0-9]*\).*/\1/p' \
    "$work/server.log")"
  [[ -n "$port" ]] && break
  if ! kill -0 "${pids[0]}" 2>/dev/null; then
    cat "$work/server.log" >&2
    log "the server exited before serving"
    exit 1
  fi
  sleep 0.1
done
[[ -n "$port" ]] || { cat "$work/server.log" >&2; log "no port after 30 s"; exit 1; }
log "klserve on 127.0.0.1:$port, metrics on" \
  "http://127.0.0.1:$metrics_port/metrics, TensorBoard files in $TB_DIR"

# 4. Prometheus, scraping the server four times a second.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
prom_port=""
if [[ -n "$PROMETHEUS" ]]; then
  prom_port="$(free_port)"
  cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 250ms
scrape_configs:
  - job_name: klserve
    static_configs:
      - targets: ["127.0.0.1:$metrics_port"]
EOF
  "$PROMETHEUS" --config.file="$work/prometheus.yml" \
    --storage.tsdb.path="$work/tsdb" \
    --web.listen-address="127.0.0.1:$prom_port" >"$work/prometheus.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    if python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$prom_port/-/ready', timeout=1)" 2>/dev/null; then
      break
    fi
    sleep 0.2
  done
  log "Prometheus on http://127.0.0.1:$prom_port, scraping every 250 ms"
else
  log "no prometheus binary (apt-get install prometheus, or set PROMETHEUS):" \
    "skipping the Prometheus part"
fi

# 5. Train.
run="toy_indexer-$(date +%Y%m%d-%H%M%S)"
"$PYTHON" "$ROOT/examples/train_toy_indexer.py" --target="127.0.0.1:$port" \
  --run="$run" "$@"

# 6. The curve, as Prometheus and TensorBoard have it.
if [[ -n "$prom_port" ]]; then
  sleep 1  # a scrape after the last step was published
  python3 - "$prom_port" "$run" <<'EOF'
import json, sys, time, urllib.parse, urllib.request
port, run = sys.argv[1], sys.argv[2]
query = 'klserve_indexer_loss{run="%s",layer="all"}' % run
now = time.time()
url = "http://127.0.0.1:%s/api/v1/query_range?%s" % (port, urllib.parse.urlencode(
    {"query": query, "start": now - 600, "end": now, "step": "0.25"}))
series = json.load(urllib.request.urlopen(url, timeout=10))["data"]["result"]
if not series:
    sys.exit("run_demo.sh: Prometheus has no %s" % query)
values = [float(v) for _, v in series[0]["values"]]
# Points at 0.25 s steps repeat the last scrape; keep the changes.
curve = [v for i, v in enumerate(values) if i == 0 or v != values[i - 1]]
print("Prometheus, %s: %d distinct values over the run, first %.6f, last "
      "%.6f" % (query, len(curve), curve[0], curve[-1]))
print("  " + " ".join("%.4f" % v for v in curve[:: max(1, len(curve) // 12)]))
EOF
fi
"$PYTHON" - "$TB_DIR/$run" <<'EOF'
import sys
from tensorboard.backend.event_processing import event_accumulator
acc = event_accumulator.EventAccumulator(
    sys.argv[1], size_guidance={event_accumulator.SCALARS: 0})
acc.Reload()
tags = acc.Tags()["scalars"]
tag = next(t for t in tags if t.endswith("indexer_loss"))
points = acc.Scalars(tag)
print("TensorBoard, %s: %d steps, first %.6f, last %.6f" % (
    tag, len(points), points[0].value, points[-1].value))
EOF
log "done; the curve in TensorBoard: $TENSORBOARD --logdir $TB_DIR" \
  "(then http://localhost:6006)"
