#!/usr/bin/env bash
# The toy indexer demo in one command: builds klserve (scripts/klserve.sh
# build), starts it in the background with TensorBoard event files and
# Prometheus metrics, trains examples/train_toy_indexer.py against it, and
# stops the server.
#
#   examples/run_demo.sh [ARGS...]     ARGS go to train_toy_indexer.py
#
# Environment:
#   KLSERVE_BIN     a built server to use; skips the build
#   PYTHON          a Python with klserve (pip install ./client/python), jax
#                   and optax; default: the tests' BUILD_DIR/venv when it has
#                   them, else BUILD_DIR/venv-demo, made on first use
#   BUILD_DIR       default ROOT/build
#   TB_DIR          TensorBoard directory; default BUILD_DIR/demo-tensorboard
#   METRICS_LISTEN  Prometheus /metrics address; default 127.0.0.1:9464
#                   (empty: none)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
TB_DIR="${TB_DIR:-$BUILD_DIR/demo-tensorboard}"
METRICS_LISTEN="${METRICS_LISTEN-127.0.0.1:9464}"

log() { echo "run_demo.sh: $*" >&2; }

# 1. The server.
if [[ -z "${KLSERVE_BIN:-}" ]]; then
  BUILD_DIR="$BUILD_DIR" "$ROOT/scripts/klserve.sh" build
  KLSERVE_BIN="$BUILD_DIR/server/klserve"
fi

# 2. The Python side.
if [[ -z "${PYTHON:-}" ]] &&
    "$BUILD_DIR/venv/bin/python" -c "import klserve, jax, optax" 2>/dev/null; then
  PYTHON="$BUILD_DIR/venv/bin/python"
fi
if [[ -z "${PYTHON:-}" ]]; then
  venv="$BUILD_DIR/venv-demo"
  PYTHON="$venv/bin/python"
  if ! "$PYTHON" -c "import klserve, jax, optax" 2>/dev/null; then
    log "making $venv with the klserve client, jax and optax"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check \
      "$ROOT/client/python" jax optax
  fi
fi

# 3. Start the server on a free port (it names the port on stderr).
mkdir -p "$TB_DIR"
server_log="$(mktemp -t klserve-demo.XXXXXX)"
"$KLSERVE_BIN" --listen=127.0.0.1:0 --metrics_listen="$METRICS_LISTEN" \
  --tensorboard_dir="$TB_DIR" 2>"$server_log" &
server_pid=$!
stop_server() {
  if kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid"
    wait "$server_pid" || true
  fi
  rm -f "$server_log"
}
trap stop_server EXIT

port=""
for _ in $(seq 300); do
  port="$(sed -n 's/.*serving on port \([0-9]*\).*/\1/p' "$server_log")"
  [[ -n "$port" ]] && break
  if ! kill -0 "$server_pid" 2>/dev/null; then
    cat "$server_log" >&2
    log "the server exited (METRICS_LISTEN=$METRICS_LISTEN busy?)"
    exit 1
  fi
  sleep 0.1
done
[[ -n "$port" ]] || { cat "$server_log" >&2; log "no port after 30 s"; exit 1; }
log "klserve on 127.0.0.1:$port, TensorBoard files in $TB_DIR${METRICS_LISTEN:+, metrics on http://$METRICS_LISTEN/metrics}"

# 4. Train.
"$PYTHON" "$ROOT/examples/train_toy_indexer.py" --target="127.0.0.1:$port" "$@"

log "done; look at the loss with: tensorboard --logdir $TB_DIR"
