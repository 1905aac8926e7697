// libFuzzer target: arbitrary bytes as a klserve.v1.ComputeLossRequest,
// through the server's request -> kernel-input translation and problem
// validation, and, for small valid problems, the CPU loss itself. Nothing may
// crash, read out of bounds or hit undefined behaviour, whatever the request.
//
// Built only with clang and -DKLSERVE_FUZZ=ON (fuzz/CMakeLists.txt); run by
// `scripts/klserve.sh sanitize` on fuzz/corpus.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "google/protobuf/stubs/logging.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/dtype.h"
#include "kernels/loss.h"
#include "kernels/problem.h"
#include "klserve/v1/klserve.pb.h"
#include "server/tensor_codec.h"

namespace {

// Problems with more per-row elements than this are validated only: the loss
// is linear in the size and the fuzzer should stay fast.
constexpr int64_t kMaxElements = int64_t{1} << 16;

bool Mul(int64_t a, int64_t b, int64_t& out) {
  return !__builtin_mul_overflow(a, b, &out);
}

}  // namespace

// Most inputs are not valid protobuf, and protobuf logs each rejected one to
// stderr (over 100,000 lines a minute in CI): silence it.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace klserve;
  static CpuBackend* const backend = new CpuBackend(1);

  v1::ComputeLossRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;

  const auto options = server::OptionsFrom(request.options());
  if (!options.ok()) return 0;
  const auto inputs = server::InputsFrom(request);
  if (!inputs.ok()) return 0;
  const auto problem = IndexerKlProblem::Create(*inputs, *options);
  if (!problem.ok()) return 0;

  // B * T * max(S, K) * max(H, 1), overflow-checked.
  const IndexerKlProblem& p = *problem;
  int64_t elements = 0;
  const int64_t width = p.S > p.row_length ? p.S : p.row_length;
  const int64_t heads = p.H > 1 ? p.H : 1;
  if (p.B < 0 || p.T < 0 || width < 0 || !Mul(p.B, p.T, elements) ||
      !Mul(elements, width, elements) || !Mul(elements, heads, elements) ||
      elements > kMaxElements) {
    return 0;
  }

  // Outputs sized as the server sizes them (server/loss_service.cc).
  std::vector<std::byte> grad;
  std::vector<double> row_kl;
  LossOutputs outputs;
  if (options->want_grad) {
    grad.resize(static_cast<size_t>(p.B * p.T * p.row_length) *
                DTypeSize(options->grad_dtype));
    outputs.grad = grad.data();
    outputs.grad_byte_size = static_cast<int64_t>(grad.size());
  }
  if (options->want_row_kl) {
    row_kl.resize(static_cast<size_t>(p.num_rows()));
    outputs.row_kl = row_kl.data();
    outputs.row_kl_size = p.num_rows();
  }
  (void)ComputeIndexerKl(*backend, p, outputs);
  return 0;
}
