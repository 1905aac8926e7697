#!/usr/bin/env bash
# Runs a klserve image and checks it as a deployment would use it: the
# server comes up, answers health over gRPC, the image's own HEALTHCHECK
# passes, one loss matches its known value, /metrics is served, the
# projections form is computed, and
# `stop` drains it to exit 0.
#
#   deploy/docker/check-image.sh IMAGE KLCTL PODMAN...
#
# KLCTL is a klctl binary on this host; PODMAN... the command that runs
# podman (e.g. "sudo env CONTAINERS_CONF=... podman"). The container
# publishes its ports on free loopback ports only.
set -euo pipefail
image="$1" klctl="$2"
shift 2
podman=("$@")

log() { echo "check-image.sh: $*" >&2; }
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

name="klserve-check-$$"
work="$(mktemp -d -t klserve-check.XXXXXX)"
cleanup() {
  "${podman[@]}" rm -f "$name" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

grpc_port="$(free_port)"
metrics_port="$(free_port)"
"${podman[@]}" run -d --name "$name" \
  -p "127.0.0.1:$grpc_port:50051" -p "127.0.0.1:$metrics_port:9464" \
  "$image" --backend=cpu >/dev/null
target="127.0.0.1:$grpc_port"

# 1. Health over gRPC, within a minute.
for _ in $(seq 120); do
  if "$klctl" health --target="$target" --deadline=2s --max_attempts=1 \
      >/dev/null 2>&1; then
    break
  fi
  sleep 0.5
done
"$klctl" health --target="$target" --deadline=5s
"$klctl" info --target="$target"

# 2. The image's HEALTHCHECK, run by podman inside the container (it is
#    dropped silently unless the image was built with --format docker).
"${podman[@]}" healthcheck run "$name"
log "HEALTHCHECK passes"

# 3. One loss against its known value. One row over two keys: target
#    p = (1/2, 1/2), scores (0, ln 3) so q = (1/4, 3/4);
#    KL = (ln 2 + ln(2/3)) / 2 = ln(4/3) / 2.
python3 - "$work" <<'PY'
import math, struct, sys
def save(path, values):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, %d), }" % len(values)
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)))
        f.write(header.encode() + struct.pack("<%df" % len(values), *values))
save(sys.argv[1] + "/target.npy", [0.5, 0.5])
save(sys.argv[1] + "/scores.npy", [0.0, math.log(3.0)])
PY
loss="$("$klctl" loss --target="$target" --attention_weights="$work/target.npy" \
  --indexer_scores="$work/scores.npy" | sed -n 's/^loss: //p')"
python3 -c "
import math, sys
got, want = float('$loss'), math.log(4 / 3) / 2
# float32 scores (ln 3 rounded) and a float32 softmax: 1e-6 is ample.
sys.exit(0 if abs(got - want) < 1e-6 else 'loss %r, want %r' % (got, want))"
log "loss $loss (want ln(4/3)/2 = 0.1438410...)"

# 4. /metrics, with the request just made.
metrics="$(python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:$metrics_port/metrics', timeout=5).read().decode())")"
grep -q '^klserve_build_info{' <<<"$metrics"
grep -q '^klserve_requests_total{code="OK",method="ComputeLoss"} 1' <<<"$metrics"
log "/metrics served"

# 5. The projections form, whose BLAS the server loads when it starts
#    (kernels/cpu/blas.h): the image must carry the library.
"$klctl" bench --target="$target" --form=projections --count=1 \
  --shape=1,64,64 --heads=4 --duration=20s >/dev/null
log "projections form served"

# 6. stop sends SIGTERM: the server drains and exits 0.
"${podman[@]}" stop -t 45 "$name" >/dev/null
code="$("${podman[@]}" inspect --format '{{.State.ExitCode}}' "$name")"
"${podman[@]}" logs "$name" 2>&1 | tail -n 3 >&2
[[ "$code" == 0 ]] || { log "exit code $code after stop"; exit 1; }
log "stop drained it: exit 0"
