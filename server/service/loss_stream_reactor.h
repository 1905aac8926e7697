#ifndef KLSERVE_SERVER_SERVICE_LOSS_STREAM_REACTOR_H_
#define KLSERVE_SERVER_SERVICE_LOSS_STREAM_REACTOR_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "kernels/loss_computation.h"
#include "kernels/problem.h"
#include "kernels/projections_computation.h"
#include "kernels/projections_problem.h"
#include "klserve/v1/klserve.grpc.pb.h"
#include "server/service/service_context.h"
#include "server/service/stream_reactor_base.h"

namespace klserve::server {

// One ComputeLossStream call: a StreamHeader, then RowBlocks in order, each
// answered by its GradBlock, then the result. The rows' order, the counting
// pass and the loss belong to the LossComputation this reactor drives; the
// reactor holds the transport: reads, writes, admission, cancellation.
//
// A header with `query` starts the projections form instead: the header's
// key side is held for the stream's life (--max_stream_key_bytes), the
// blocks carry query rows, and a ProjectionsComputation, the one the unary
// call runs on all rows at once, computes them on the projections backend.
// Its GradBlocks cover the rows each block completed (whole tiles), and the
// result carries d_index_key.
//
// Three things overlap: gRPC reads the next block while the executor computes
// the current one and gRPC writes the previous gradient. Blocks of one stream
// are computed one at a time, in order, so the loss folds in row order and
// matches ComputeLoss bit for bit. At most kMaxBlocksInFlight blocks (read,
// computing or waiting to be written) are held; past that, reading pauses,
// so memory stays bounded whatever the problem's size, in both passes of a
// problem that counts first (RowBlock.counting). Cancellation and the
// deadline stop the stream between blocks.
//
// Reactions run on gRPC threads and computations on the executor; state is
// guarded by mu_. The reactor deletes itself once gRPC is done with it
// (OnDone) and no computation of it is running.
class LossStreamReactor final
    : public StreamReactorBase<v1::ComputeLossStreamRequest> {
 public:
  // Takes a stream slot (or finishes the call at once when refused) and
  // starts reading.
  static LossStreamReactor* Start(const ServiceContext& context,
                                  grpc::CallbackServerContext* call);

 private:
  using Request = v1::ComputeLossStreamRequest;
  using Response = v1::ComputeLossStreamResponse;
  static constexpr int kMaxBlocksInFlight = 3;

  LossStreamReactor(const ServiceContext& context,
                    grpc::CallbackServerContext* call)
      : StreamReactorBase(context, call, "ComputeLossStream") {}

  absl::Status OnMessage() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return problem_ || projections_problem_ ? TakeBlock() : TakeHeader();
  }
  void OnCallDone() override;
  absl::Status TakeHeader() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The header of the projections form (after its tags are checked).
  absl::Status TakeProjectionsHeader() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status TakeBlock() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A RowBlock and what LossComputation::Admit booked it as.
  struct Block {
    std::unique_ptr<Request> request;
    AdmittedBlock admitted;
  };
  // Computes one block on the executor and queues its GradBlock.
  void ComputeBlock(Block block);
  // Computes a block of the logits form into `response`.
  absl::Status ComputeLogitsBlock(const Block& block, Response& response);
  // Computes a block of the projections form into `response`: the rows it
  // completes. The first block creates the computation (checking the key
  // side's values) and counts N where it must.
  absl::Status ComputeProjectionsBlock(const Block& block, Response& response);

  void OnWritten() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next step, whichever is possible: compute, write, read, finish.
  void Advance() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Once every block is in, computed and written: the result, last.
  void SendResult() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The result of the projections form into `last`, d_index_key included.
  absl::StatusOr<IndexerKlResult> FinishProjections(Response& last)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when the reactor may now be deleted.
  bool Finished() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return done_ && !computing_;
  }

  // Set once by TakeHeader; read without the lock by the one computation in
  // flight afterwards. One of problem_ (the logits forms) and
  // projections_problem_ is set; the latter views the key side in header_.
  v1::StreamHeader header_;
  std::optional<IndexerKlProblem> problem_;
  std::optional<ProjectionsProblem> projections_problem_;
  // Admitted under mu_, computed by the computation in flight (the two touch
  // different state), finished under mu_ once nothing is in flight.
  std::optional<LossComputation> computation_;
  // Created and used by the computation in flight, finished under mu_ once
  // nothing is in flight.
  std::optional<ProjectionsComputation> projections_;
  // When the projections block in flight must have finished computing
  // (--max_compute_duration after it started; Unix nanoseconds), for the
  // computation's stop check, which the compute threads ask.
  std::atomic<int64_t> block_deadline_ns_ = 0;
  // The projections form: the row the next block must begin at (the order
  // is checked as blocks arrive, before they wait to be computed).
  int64_t next_block_row_ ABSL_GUARDED_BY(mu_) = 0;

  std::deque<Block> blocks_ ABSL_GUARDED_BY(mu_);
  bool result_sent_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_LOSS_STREAM_REACTOR_H_
