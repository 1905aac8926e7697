// libFuzzer target: arbitrary bytes as a klserve.v1.ComputeLossRequest,
// through the server's request -> kernel-input translation and problem
// validation, and, for small valid problems, the CPU loss itself (of the
// logits forms or of the projections form, as the request's form says). Nothing
// may crash, read out of bounds or hit undefined behaviour, whatever the
// request.
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
#include "kernels/projections_loss.h"
#include "kernels/projections_output_buffers.h"
#include "kernels/projections_problem.h"
#include "klserve/v1/klserve.pb.h"
#include "proto/request_tensors.h"
#include "server/codec/tensor_codec.h"

namespace {

// Problems with more per-row elements than this are validated only: the loss
// is linear in the size and the fuzzer should stay fast.
constexpr int64_t kMaxElements = int64_t{1} << 16;

bool Mul(int64_t a, int64_t b, int64_t& out) {
  return !__builtin_mul_overflow(a, b, &out);
}

// The projections form, as the server computes it
// (server/service/loss_service.cc), for problems whose work,
// B * T * S * (H * D + H_I * D_I) multiply-adds, and whose selection,
// B * T * K, are at most kMaxElements.
void FuzzProjections(klserve::Backend& backend,
                     const klserve::v1::ComputeLossRequest& request) {
  using namespace klserve;
  const auto options = server::ProjectionsOptionsFrom(request.options());
  if (!options.ok()) return;
  server::CallRegions no_regions(nullptr);  // the fuzzer maps none
  const auto inputs = server::ProjectionsInputsFrom(request, no_regions);
  if (!inputs.ok()) return;
  const auto problem = ProjectionsProblem::Create(*inputs, *options);
  if (!problem.ok()) return;
  const ProjectionsProblem& p = *problem;
  // B * T * S * (H * D + H_I * D_I), overflow-checked.
  int64_t pairs = 0, per_pair = 0, main = 0, indexer = 0;
  if (!Mul(p.B, p.T, pairs) || !Mul(pairs, p.S, pairs) ||
      !Mul(p.H, p.D, main) || !Mul(p.H_I, p.D_I, indexer) ||
      __builtin_add_overflow(main, indexer, &per_pair) ||
      !Mul(pairs, per_pair, pairs) || pairs > kMaxElements) {
    return;
  }
  int64_t slots = 0;
  if (!Mul(p.B * p.T, p.K, slots) || slots > kMaxElements) return;
  ProjectionsOutputBuffers buffers;
  const auto rows = WholeProjectionsRows(p, *inputs);
  if (!rows.ok()) return;
  (void)ComputeProjectionsLoss(backend, p, *rows, buffers.For(p));
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
  if (FormOf(request) == RequestForm::kProjections) {
    FuzzProjections(*backend, request);
    return 0;
  }

  const auto options = server::OptionsFrom(request.options());
  if (!options.ok()) return 0;
  server::CallRegions no_regions(nullptr);
  const auto inputs = server::InputsFrom(request, no_regions);
  if (!inputs.ok()) return 0;
  const auto problem = IndexerKlProblem::Create(*inputs, *options);
  if (!problem.ok()) return 0;
  const auto rows = WholeRowData(*problem, *inputs);
  if (!rows.ok()) return 0;

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

  // Outputs sized as the server sizes them (server/service/loss_service.cc).
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
  (void)ComputeIndexerKl(*backend, p, *rows, outputs);
  return 0;
}
