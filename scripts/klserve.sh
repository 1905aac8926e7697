#!/usr/bin/env bash
# The one entry point for building, testing and running klserve.
#
#   scripts/klserve.sh deps    install the Debian packages the build needs
#   scripts/klserve.sh build   deps, then a Release build into build/
#   scripts/klserve.sh test    build, then every test (non-zero exit on failure)
#   scripts/klserve.sh run     build, then start the klserve server (CPU backend
#                              where there is no GPU); extra arguments go to it
#   scripts/klserve.sh bench   build, then the kernels' benchmark (klserve_bench)
#   scripts/klserve.sh pytest  build the server, then the Python client's tests
#                              (tests/python); extra arguments go to pytest
#   scripts/klserve.sh demo    examples/run_demo.sh: train a toy indexer against
#                              a local server; extra arguments go to the script
#
# BUILD_DIR overrides the build directory.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"

# Every Debian package the build and the tests need, in one place.
PACKAGES=(
  build-essential
  cmake
  ninja-build
  libabsl-dev
  libgtest-dev
  libgmock-dev
  libbenchmark-dev
  libgrpc++-dev
  libprotobuf-dev
  protobuf-compiler
  protobuf-compiler-grpc
  grpc-proto
  libtcmalloc-minimal4
  prometheus-cpp-dev
  prometheus
  python3-venv
  python3-pip
)
# What the pytest tests import, installed into build/venv. The Python client
# (client/python) is installed on top from this checkout on every run; it
# needs grpcio, protobuf, numpy, ml_dtypes, and setuptools and grpcio-tools to
# build (its stubs are generated from proto/ at install time). torch runs the
# PyTorch tests (PyPI's wheel brings ~6 GB); pyyaml and kubernetes-validate
# check the deploy/ manifests.
PYTHON_PACKAGES=(pytest pyyaml kubernetes-validate numpy tensorboard grpcio
                 protobuf ml_dtypes setuptools grpcio-tools jax optax torch)

log() { echo "klserve.sh: $*" >&2; }

deps() {
  if ! command -v dpkg-query >/dev/null 2>&1; then
    log "not a Debian-based system; install the equivalents of: ${PACKAGES[*]}"
    return 0
  fi
  local missing=() pkg
  for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null |
        grep -q 'install ok installed'; then
      missing+=("$pkg")
    fi
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0

  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    if ! command -v sudo >/dev/null 2>&1; then
      log "need root (or sudo) to install: ${missing[*]}"
      return 1
    fi
    sudo=(sudo)
  fi
  log "installing: ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# The tests' Python environment, made once (a stamp names what it holds).
VENV="$BUILD_DIR/venv"
python_deps() {
  local stamp="$VENV/.klserve-packages"
  if [[ ! -f "$stamp" || "$(cat "$stamp")" != "${PYTHON_PACKAGES[*]}" ]]; then
    log "making $VENV with: ${PYTHON_PACKAGES[*]}"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check \
      "${PYTHON_PACKAGES[@]}"
    echo "${PYTHON_PACKAGES[*]}" > "$stamp"
  fi
  # The client from this checkout, every time (about a second, offline):
  # its code and its generated stubs then always match the tree.
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps \
    --no-build-isolation --force-reinstall "$ROOT/client/python"
}

# build [TARGET...]: everything by default.
build() {
  deps
  # Tests and benchmark on explicitly, whatever an older cache says.
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DKLSERVE_BUILD_TESTS=ON -DKLSERVE_BUILD_BENCHMARKS=ON \
    -DKLSERVE_TEST_PYTHON="$VENV/bin/python"
  if [[ $# -gt 0 ]]; then
    cmake --build "$BUILD_DIR" --target "$@"
  else
    cmake --build "$BUILD_DIR"
  fi
}

run_tests() {
  deps
  python_deps
  build
  ctest --test-dir "$BUILD_DIR" --output-on-failure --no-tests=error \
    -j "$(nproc)"
}

run_pytest() {
  deps
  python_deps
  build klserve
  KLSERVE_BIN="$BUILD_DIR/server/klserve" "$VENV/bin/python" -m pytest -q \
    -p no:cacheprovider "$ROOT/tests/python" "$@"
}

run_server() {
  build klserve klctl
  exec "$BUILD_DIR/server/klserve" "$@"
}

run_bench() {
  build klserve_bench
  exec "$BUILD_DIR/bench/klserve_bench" "$@"
}

usage() {
  sed -n '2,15s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
  exit 2
}

[[ $# -ge 1 ]] || usage
command="$1"
shift
case "$command" in
  deps) deps ;;
  build) build ;;
  test) run_tests ;;
  run) run_server "$@" ;;
  bench) run_bench "$@" ;;
  pytest) run_pytest "$@" ;;
  demo) BUILD_DIR="$BUILD_DIR" exec "$ROOT/examples/run_demo.sh" "$@" ;;
  *) usage ;;
esac
