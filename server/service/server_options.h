#ifndef KLSERVE_SERVER_SERVICE_SERVER_OPTIONS_H_
#define KLSERVE_SERVER_SERVICE_SERVER_OPTIONS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "server/metrics/loss_reporter.h"

namespace klserve::server {

// Everything the server is configured with. klserve_main.cc fills it from
// flags; tests build one directly.
struct ServerOptions {
  // Addresses to serve gRPC on, comma-separated: HOST:PORT (port 0 picks a
  // free one, see KlServer::port) or unix:/absolute/path for a Unix-domain
  // socket, for a job on the same node. Loopback by default: serving other
  // hosts is a choice (docs/security.md).
  std::string listen = "127.0.0.1:50051";
  // Permission bits of each socket file; connecting needs write permission,
  // so 0600 lets only klserve's user in, 0660 its group too.
  mode_t unix_socket_mode = 0600;
  // "auto" (CUDA when usable, else CPU), "cpu" or "cuda".
  std::string backend = "auto";
  // CPU backend threads; 0 = one per CPU this process may use (UsableCpus).
  int threads = 0;
  // The CPU kernels' ISA variant: "auto" (the best this CPU runs), "avx512",
  // "avx2" or "baseline" (kernels/cpu/isa.h); all give the same bits.
  std::string isa = "auto";
  // Largest message received or sent. A problem larger than this goes
  // through ComputeLossStream. gRPC caps messages below 2 GiB.
  int64_t max_message_bytes = int64_t{256} << 20;
  // Unary ComputeLoss requests computing or queued at once; more get
  // RESOURCE_EXHAUSTED. Also the number of compute threads.
  int max_concurrent_requests = 8;
  // ComputeLossStream and Echo calls open at once; more get
  // RESOURCE_EXHAUSTED. Counted apart from the unary requests: a stream
  // spends most of its life waiting on its client, and must not hold a
  // compute slot while it does. Each holds at most 3 messages (and a
  // projections-form stream the rows of one tile, within a message's bytes).
  int max_open_streams = 16;
  // Threads of gRPC's synchronous server, whose only service here is server
  // reflection: each reflection stream open holds one, for its life, and a
  // poller waits for the next (a grpc::ResourceQuota's thread limit). Past
  // it new reflection calls get RESOURCE_EXHAUSTED; the other services run
  // on gRPC's callback threads and are not counted.
  int max_reflection_threads = 8;
  // A stream whose client sends nothing the server waits for, or takes no
  // answer the server is sending, for this long is ended
  // (DEADLINE_EXCEEDED), and its slot freed.
  absl::Duration stream_idle_timeout = absl::Seconds(30);
  // The longest a stream may stay open, whatever it does.
  absl::Duration max_stream_duration = absl::Minutes(30);
  // The longest a unary projections-form computation may run: its work grows
  // with T * S from a message that grows with T + S. It also stops as soon
  // as its client cancels the call or the call's deadline passes. Counted
  // from the call's arrival, so time queued for a compute thread counts.
  absl::Duration max_compute_duration = absl::Minutes(10);
  // HTTP/2 streams (calls) one connection may have open at once
  // (SETTINGS_MAX_CONCURRENT_STREAMS); more are refused by gRPC.
  int max_streams_per_connection = 32;
  // Memory gRPC may hold for all connections together: buffers of messages
  // being received or sent and per-call state (a grpc::ResourceQuota). Near
  // it, gRPC shrinks its read windows and then refuses new calls.
  int64_t transport_memory_bytes = int64_t{4} << 30;
  // A connection is asked to reconnect (HTTP/2 GOAWAY) after this long
  // (+-10%), and closed max_stream_duration later with whatever is still
  // open on it: the bound on how long a call gRPC is still receiving (a
  // unary request sent in part) can be held.
  absl::Duration max_connection_age = absl::Minutes(10);
  // Serves the Echo RPC (a transport benchmark for klctl bench); off, Echo
  // gets UNIMPLEMENTED. A tiny Echo request asks for a reply of up to
  // max_message_bytes, so it stays off where callers are not trusted.
  bool enable_echo = false;
  // Largest single tensor a request may carry or ask for (a stream's blocks
  // count one at a time).
  int64_t max_tensor_bytes = int64_t{1} << 30;
  // What one ComputeLossStream of the projections form may hold for its key
  // side, for the stream's whole life: key and index_key (sent whole in the
  // StreamHeader) and the float64 sum of d_index_key (8 * B * S * D_I
  // bytes); and what a unary call may hold for its sum while it computes.
  // Past it the call is RESOURCE_EXHAUSTED naming key. Every open stream
  // and every unary call may hold this much at once.
  int64_t max_stream_key_bytes = int64_t{1} << 30;
  // What one compute thread may hold to compute a logits-form row on the CPU
  // (RowScratch::BytesFor) or a tile of a projections-form request
  // (ProjectionsProblem::thread_scratch: it grows with S, or K, and the head
  // sizes, not with the request's bytes); past it the request is
  // RESOURCE_EXHAUSTED before it computes. The compute threads together
  // hold at most --threads times this.
  int64_t max_thread_scratch_bytes = int64_t{1} << 30;
  // Shared-memory regions (docs/shared-memory.md): RegisterRegion serves
  // callers on this host (a Unix socket or loopback) only when on. Off by
  // default: a region names any object in /dev/shm that the server's user
  // may open read-write, and the server writes outputs into it.
  bool shared_memory = false;
  // Regions registered at once, and their byte sizes summed (each maps that
  // much of a client's object into the server's address space; the memory
  // is the client's). Past either, RegisterRegion is RESOURCE_EXHAUSTED.
  int max_regions = 64;
  int64_t max_region_bytes = int64_t{16} << 30;
  // A region no call has named (and nobody re-registered) for this long is
  // unregistered, and unmapped: the bound on what a client that went away
  // leaves mapped.
  absl::Duration region_lease = absl::Minutes(10);
  // Once no call has been open for this long (up to twice as long), the
  // allocator's free memory goes back to the OS. Between calls the server
  // keeps what the last ones freed, message buffers of up to
  // --max_message_bytes each, so that a job calling every step does not
  // fault its pages in again; idle, it holds what it held at start again.
  // Zero keeps the freed memory for good; otherwise at least 100ms.
  absl::Duration release_memory_after_idle = absl::Seconds(5);
  // How long SIGTERM waits for requests in flight before cancelling them.
  absl::Duration drain_timeout = absl::Seconds(30);
  // Prometheus /metrics address (9464: clear of Prometheus's 9090 and the
  // Pushgateway's 9091); empty serves none.
  std::string metrics_listen = "127.0.0.1:9464";
  // Where each run's TensorBoard event file goes; empty writes none.
  std::string tensorboard_dir;
  // The per-run loss series and event files. Their defaults, and what each
  // bounds, live with the code they configure (LossReporterOptions,
  // StepAggregatorOptions, TensorBoardPublisherOptions).
  // Runs whose per-step series are kept; the run idle longest goes first.
  int max_runs = StepAggregatorOptions{}.max_runs;
  // tags.layer must be in [0, max_layers_per_run).
  int max_layers_per_run = LossReporterOptions{}.max_layers_per_run;
  // tags.microbatch must be in [0, max_microbatches_per_step).
  int max_microbatches_per_step =
      LossReporterOptions{}.max_microbatches_per_step;
  // Runs given a TensorBoard directory over the process's lifetime.
  int max_tensorboard_runs = TensorBoardPublisherOptions{}.max_runs;
  // Disk space the event files may take, all runs together.
  int64_t max_tensorboard_bytes = TensorBoardPublisherOptions{}.max_bytes;
  // Steps waiting for the event files' thread.
  int max_tensorboard_queued_steps = TensorBoardPublisherOptions{}.max_queued;
  // A step with no request for this long is finished and published.
  absl::Duration step_idle_timeout = StepAggregatorOptions{}.idle_timeout;

  // Transport security (docs/security.md). With both tls_cert_file and
  // tls_key_file set, the gRPC port speaks TLS only (plaintext clients are
  // refused); with neither, plaintext only. Setting one without the other
  // is an error. PEM files, read once at start.
  std::string tls_cert_file;  // server certificate chain
  std::string tls_key_file;   // its private key
  // PEM CA bundle: when set (TLS only), clients must present a certificate
  // signed by one of these CAs (mutual TLS); without one the handshake fails.
  std::string tls_client_ca_file;
  // A file holding a bearer token (trailing newlines stripped; empty is an
  // error). When set, every IndexerKl RPC must carry the metadata
  // "authorization: Bearer <token>" or gets UNAUTHENTICATED, checked on
  // the call's headers before its message is read; grpc.health.v1.Health
  // stays open (Kubernetes probes) unless health_needs_token, and server
  // reflection needs the token too. Read once at start.
  std::string auth_token_file;
  // With auth_token_file: health needs the token too. An unauthenticated
  // peer then holds nothing past a call's headers; without it, gRPC 1.51
  // takes a health call's message in whole, up to transport_memory_bytes
  // (docs/security.md). For probes that can send the token (klctl health
  // --auth_token_file); Kubernetes' native gRPC probes cannot.
  bool health_needs_token = false;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_SERVER_OPTIONS_H_
