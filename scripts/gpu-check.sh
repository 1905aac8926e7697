#!/usr/bin/env bash
# The CUDA backend on a machine with an NVIDIA GPU, in one command: builds
# the math library with CUDA, runs the GPU tests (every kernel suite's CUDA
# instances, and the CPU-versus-GPU cross-check on random inputs), then the
# GPU benchmark per input form against a device-to-device copy measured in
# the same run, and prints its table last. About 5 minutes on an H200.
#
#   scripts/gpu-check.sh             build (Debian packages through
#                                    scripts/klserve.sh deps), test, benchmark
#   scripts/gpu-check.sh --no-build  use the binaries already in $BUILD_DIR
#                                    (built elsewhere for this GPU; shared
#                                    libraries in $BUILD_DIR/lib if any)
#
# BUILD_DIR (default build-gpu) and CUDA_ARCH (default 90: H100, H200) may be
# set. The service is not built: the GPU check needs only the math library.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-gpu}"
# The kernel suites parameterised over backends (tests/kernels/
# test_backends.h): their CUDA instances are named "Backends/<suite>.<test>/cuda".
BACKEND_SUITES=(reference_agreement_test validation_test extreme_values_test
  invariants_test row_blocks_test diagnostics_test gradient_check_test)
TARGETS=("${BACKEND_SUITES[@]}" backend_cross_check_test cuda_row_fold_test
  klserve_gpu_bench)

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

if [[ "${1:-}" != "--no-build" ]]; then
  "$ROOT/scripts/klserve.sh" deps
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DKLSERVE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" \
    -DKLSERVE_BUILD_SERVICE=OFF -DKLSERVE_BUILD_BENCHMARKS=OFF
  cmake --build "$BUILD_DIR" --target "${TARGETS[@]}"
fi
if [[ -d "$BUILD_DIR/lib" ]]; then
  export LD_LIBRARY_PATH="$BUILD_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# A skipped CUDA test means the backend found no usable device: on a GPU
# machine that is a failure.
run_tests() {
  local log
  log="$(mktemp)"
  if ! "$@" --gtest_brief=1 >"$log" 2>&1; then
    cat "$log"
    echo "gpu-check: $(basename "$1") failed" >&2
    exit 1
  fi
  if grep -q "SKIPPED" "$log"; then
    grep -B2 "SKIPPED" "$log" | head -20
    echo "gpu-check: $(basename "$1") skipped CUDA tests" >&2
    exit 1
  fi
  tail -1 "$log"
}
for suite in "${BACKEND_SUITES[@]}"; do
  echo "== $suite on the CUDA backend"
  run_tests "$BUILD_DIR/tests/kernels/$suite" --gtest_filter='*/cuda'
done
echo "== CPU versus GPU on random inputs"
run_tests "$BUILD_DIR/tests/kernels/backend_cross_check_test"
echo "== the CUDA host code's fold and errors against the CPU backend"
run_tests "$BUILD_DIR/tests/kernels/cuda_row_fold_test"
echo "== benchmark"
"$BUILD_DIR/kernels/klserve_gpu_bench"
