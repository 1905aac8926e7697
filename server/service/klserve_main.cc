// klserve: the indexer KL loss service. See README.md and
// proto/klserve/v1/klserve.proto.

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "flags/byte_count.h"
#include "flags/duration.h"
#include "kernels/cpu/blas.h"
#include "server/service/kl_server.h"
#include "server/service/listener_watchdog.h"
#include "server/service/server_options.h"
#include "server/service/version.h"

namespace {

using klserve::flags::ByteCount;
using klserve::flags::Duration;

// Every flag's default is ServerOptions'.
const klserve::server::ServerOptions& Defaults() {
  static const klserve::server::ServerOptions defaults;
  return defaults;
}

}  // namespace

// GCC says it builds with AddressSanitizer by __SANITIZE_ADDRESS__, clang
// by __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define KLSERVE_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KLSERVE_ADDRESS_SANITIZER 1
#endif
#endif
#ifndef KLSERVE_ADDRESS_SANITIZER
#define KLSERVE_ADDRESS_SANITIZER 0
#endif

ABSL_FLAG(std::string, listen, Defaults().listen,
          "comma-separated addresses to serve gRPC on: HOST:PORT (port 0 "
          "picks a free one; loopback by default, 0.0.0.0:50051 serves other "
          "hosts, see docs/security.md) or unix:/absolute/path, a Unix-domain "
          "socket for jobs on the same node");
ABSL_FLAG(std::string, unix_socket_mode,
          absl::StrFormat("%04o", Defaults().unix_socket_mode),
          "octal permission bits of each --listen=unix: socket; connecting "
          "needs write permission (0600: klserve's user only, 0660: its "
          "group too)");
ABSL_FLAG(std::string, backend, Defaults().backend,
          "auto (CUDA when usable, else CPU), cpu or cuda");
ABSL_FLAG(int, threads, Defaults().threads,
          "CPU backend threads, at most 1024; 0 = one per CPU this process "
          "may use (its affinity, and its cgroup's CPU quota in a container)");
ABSL_FLAG(std::string, isa, Defaults().isa,
          "CPU kernels' instruction set: auto (the best this CPU runs), "
          "avx512, avx2 or baseline; every one gives the same bits, and one "
          "this CPU cannot run is refused");
ABSL_FLAG(ByteCount, max_message_bytes, ByteCount{Defaults().max_message_bytes},
          "largest gRPC message either way (1KiB to below 2GiB); larger "
          "problems must stream");
ABSL_FLAG(int, max_concurrent_requests, Defaults().max_concurrent_requests,
          "unary ComputeLoss requests computing or queued at once (also the "
          "compute threads, at most 1024); more get RESOURCE_EXHAUSTED");
ABSL_FLAG(int, max_open_streams, Defaults().max_open_streams,
          "ComputeLossStream and Echo calls open at once, apart from "
          "--max_concurrent_requests; more get RESOURCE_EXHAUSTED");
ABSL_FLAG(int, max_reflection_threads, Defaults().max_reflection_threads,
          "threads gRPC's server reflection may hold: one a reflection stream "
          "open, with its poller; past it RESOURCE_EXHAUSTED");
ABSL_FLAG(Duration, stream_idle_timeout,
          Duration{Defaults().stream_idle_timeout},
          "end a stream (DEADLINE_EXCEEDED) whose client sends nothing the "
          "server waits for, or takes no answer, for this long");
ABSL_FLAG(Duration, max_stream_duration,
          Duration{Defaults().max_stream_duration},
          "the longest a stream may stay open");
ABSL_FLAG(Duration, max_compute_duration,
          Duration{Defaults().max_compute_duration},
          "the longest a unary projections-form ComputeLoss, or one block of "
          "a projections-form stream, may compute (DEADLINE_EXCEEDED after); "
          "it also stops when its client cancels or its deadline passes");
ABSL_FLAG(int, max_streams_per_connection,
          Defaults().max_streams_per_connection,
          "HTTP/2 streams (calls) one connection may have open at once");
ABSL_FLAG(ByteCount, transport_memory_bytes,
          ByteCount{Defaults().transport_memory_bytes},
          "memory gRPC may hold for all connections (a grpc::ResourceQuota)");
ABSL_FLAG(Duration, max_connection_age, Duration{Defaults().max_connection_age},
          "ask a connection to reconnect after this long; it is closed "
          "--max_stream_duration later");
ABSL_FLAG(bool, enable_echo, Defaults().enable_echo,
          "serve the Echo RPC (klctl bench --mode=echo); off, it gets "
          "UNIMPLEMENTED");
ABSL_FLAG(ByteCount, max_tensor_bytes, ByteCount{Defaults().max_tensor_bytes},
          "largest tensor a request may carry or ask for (stream blocks count "
          "one at a time)");
ABSL_FLAG(ByteCount, max_stream_key_bytes,
          ByteCount{Defaults().max_stream_key_bytes},
          "what one projections-form stream may hold for its key side: key "
          "and index_key bytes plus 8 * B * S * D_I for the d_index_key sum; "
          "a unary call is held to it for the sum alone");
ABSL_FLAG(ByteCount, max_thread_scratch_bytes,
          ByteCount{Defaults().max_thread_scratch_bytes},
          "what one compute thread may hold for a logits-form row (about 41 "
          "bytes a slot) or a tile of a projections-form request (it grows "
          "with S and the head sizes); --threads times it in all");
ABSL_FLAG(bool, shared_memory, Defaults().shared_memory,
          "serve shared-memory regions (RegisterRegion) to callers on this "
          "host (a Unix socket or loopback); docs/shared-memory.md");
ABSL_FLAG(int, max_regions, Defaults().max_regions,
          "shared-memory regions registered at once");
ABSL_FLAG(ByteCount, max_region_bytes, ByteCount{Defaults().max_region_bytes},
          "bytes of all registered shared-memory regions together");
ABSL_FLAG(Duration, region_lease, Duration{Defaults().region_lease},
          "a region no call names for this long is unregistered and unmapped");
ABSL_FLAG(Duration, release_memory_after_idle,
          Duration{Defaults().release_memory_after_idle},
          "once no call has been open for this long (up to twice), the "
          "memory the last calls freed goes back to the OS; 0 keeps it, else "
          "at least 100ms");
ABSL_FLAG(Duration, drain_timeout, Duration{Defaults().drain_timeout},
          "on SIGTERM/SIGINT, how long requests in flight may take to finish "
          "(finite; 0 cancels them at once)");
ABSL_FLAG(std::string, metrics_listen, Defaults().metrics_listen,
          "HOST:PORT serving Prometheus /metrics; empty serves none");
ABSL_FLAG(std::string, tensorboard_dir, Defaults().tensorboard_dir,
          "directory for per-run TensorBoard event files; empty writes none");
ABSL_FLAG(int, max_runs, Defaults().max_runs,
          "runs whose per-step loss series are kept (the run idle longest is "
          "dropped first)");
ABSL_FLAG(int, max_layers_per_run, Defaults().max_layers_per_run,
          "tags.layer must be in [0, N): bounds the per-layer loss series of "
          "each run; other layers are refused with INVALID_ARGUMENT");
ABSL_FLAG(int, max_microbatches_per_step, Defaults().max_microbatches_per_step,
          "tags.microbatch must be in [0, N): bounds the distinct "
          "microbatches an open step keeps; others are refused with "
          "INVALID_ARGUMENT");
ABSL_FLAG(int, max_tensorboard_runs, Defaults().max_tensorboard_runs,
          "runs given a TensorBoard directory while the server runs; later "
          "new runs get Prometheus metrics but no event file");
ABSL_FLAG(ByteCount, max_tensorboard_bytes,
          ByteCount{Defaults().max_tensorboard_bytes},
          "disk space the TensorBoard event files may take, all runs "
          "together; later steps get Prometheus metrics but no event");
ABSL_FLAG(int, max_tensorboard_queued_steps,
          Defaults().max_tensorboard_queued_steps,
          "steps waiting for the TensorBoard writing thread (a stalled disk "
          "delays only the event files); later steps get Prometheus metrics "
          "but no event");
ABSL_FLAG(Duration, step_idle_timeout, Duration{Defaults().step_idle_timeout},
          "a step with no request for this long is finished and published "
          "(inf: only FinishStep or the run's next step publishes it)");

ABSL_FLAG(std::string, tls_cert, Defaults().tls_cert_file,
          "PEM server certificate chain; with --tls_key, serve TLS only");
ABSL_FLAG(std::string, tls_key, Defaults().tls_key_file,
          "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, Defaults().tls_client_ca_file,
          "PEM CA bundle: require client certificates signed by it (mutual "
          "TLS; needs --tls_cert and --tls_key)");
ABSL_FLAG(std::string, auth_token_file, Defaults().auth_token_file,
          "file holding a bearer token every RPC must send as "
          "'authorization: Bearer <token>' (health is exempt unless "
          "--health_needs_token)");
ABSL_FLAG(bool, health_needs_token, Defaults().health_needs_token,
          "with --auth_token_file, health needs the token too (probes that "
          "send it, such as klctl health --auth_token_file; Kubernetes' "
          "native gRPC probes cannot)");

namespace {

// The soft open-file limit raised to the hard one: every connection and
// every shared-memory region holds a descriptor, and the soft limit is
// often 1024 where the hard one allows far more. Once gRPC runs out, its
// TCP listeners stop for good (ListenerWatchdog).
void RaiseOpenFileLimit() {
  rlimit limit = {};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 ||
      limit.rlim_cur >= limit.rlim_max) {
    return;
  }
  const rlim_t before = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) == 0) {
    std::fprintf(stderr, "klserve: open-file limit raised from %llu to %llu\n",
                 static_cast<unsigned long long>(before),
                 static_cast<unsigned long long>(limit.rlim_max));
  }
}

// How often the TCP listeners are looked at, and how many looks in a row
// with connections waiting and none taken make one stuck.
constexpr absl::Duration kListenerLookPeriod = absl::Seconds(1);
constexpr int kListenerPatience = 10;

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Serves the indexer KL loss over gRPC.\n  klserve [--listen=HOST:PORT] "
      "[--backend=auto|cpu|cuda] [--threads=N] [--isa=auto|avx512|avx2|"
      "baseline] ...");
  // --help names the file each flag is defined in: by its name in the
  // repository, not by the path of the checkout that built the binary.
  absl::FlagsUsageConfig usage;
  usage.normalize_filename = [](absl::string_view file) {
    const size_t at = file.rfind("server/");
    return std::string(at == absl::string_view::npos ? file : file.substr(at));
  };
  // absl's own --version says only whether NDEBUG was defined.
  usage.version_string = [] {
    return absl::StrCat("klserve ", klserve::server::kVersion, "\n");
  };
  absl::SetFlagsUsageConfig(usage);
  // absl::ParseCommandLine exits 1 after printing the help that was asked
  // for, which scripts read as a failure; its two halves, run here, let
  // --help exit 0. (absl's internal API: Debian pins absl's version.)
  absl::flags_internal::ParseCommandLineImpl(
      argc, argv, absl::flags_internal::ArgvListAction::kRemoveParsedArgs,
      absl::flags_internal::UsageFlagsAction::kIgnoreUsage,
      absl::flags_internal::OnUndefinedFlag::kAbortIfUndefined);
  if (const int usage = absl::flags_internal::HandleUsageFlags(
          std::cout, absl::ProgramUsageMessage());
      usage != -1) {
    return usage == 1 ? 0 : usage;  // 1: a help flag was handled
  }

  // Before any thread starts: loading the BLAS sets environment variables
  // (kernels/cpu/blas.h). Its status is the CPU backend's to report.
  klserve::cpu::LoadBlas().IgnoreError();
  RaiseOpenFileLimit();

  // SIGTERM and SIGINT go to one thread that drains; every other thread,
  // including gRPC's and the backend's (started below), inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  klserve::server::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  {
    const std::string mode = absl::GetFlag(FLAGS_unix_socket_mode);
    char* end = nullptr;
    const long bits = std::strtol(mode.c_str(), &end, 8);
    if (mode.empty() || *end != '\0' || bits < 0 || bits > 0777) {
      std::fprintf(stderr,
                   "klserve: --unix_socket_mode: must be octal permission "
                   "bits from 0 to 0777 (e.g. 0600), got \"%s\"\n",
                   mode.substr(0, 64).c_str());
      return 1;
    }
    options.unix_socket_mode = static_cast<mode_t>(bits);
  }
  options.backend = absl::GetFlag(FLAGS_backend);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.isa = absl::GetFlag(FLAGS_isa);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes).bytes;
  options.max_concurrent_requests =
      absl::GetFlag(FLAGS_max_concurrent_requests);
  options.max_open_streams = absl::GetFlag(FLAGS_max_open_streams);
  options.max_reflection_threads = absl::GetFlag(FLAGS_max_reflection_threads);
  options.stream_idle_timeout = absl::GetFlag(FLAGS_stream_idle_timeout).value;
  options.max_stream_duration = absl::GetFlag(FLAGS_max_stream_duration).value;
  options.max_compute_duration =
      absl::GetFlag(FLAGS_max_compute_duration).value;
  options.max_streams_per_connection =
      absl::GetFlag(FLAGS_max_streams_per_connection);
  options.transport_memory_bytes =
      absl::GetFlag(FLAGS_transport_memory_bytes).bytes;
  options.max_connection_age = absl::GetFlag(FLAGS_max_connection_age).value;
  options.enable_echo = absl::GetFlag(FLAGS_enable_echo);
  options.max_tensor_bytes = absl::GetFlag(FLAGS_max_tensor_bytes).bytes;
  options.max_stream_key_bytes =
      absl::GetFlag(FLAGS_max_stream_key_bytes).bytes;
  options.max_thread_scratch_bytes =
      absl::GetFlag(FLAGS_max_thread_scratch_bytes).bytes;
  options.shared_memory = absl::GetFlag(FLAGS_shared_memory);
  options.max_regions = absl::GetFlag(FLAGS_max_regions);
  options.max_region_bytes = absl::GetFlag(FLAGS_max_region_bytes).bytes;
  options.region_lease = absl::GetFlag(FLAGS_region_lease).value;
  options.release_memory_after_idle =
      absl::GetFlag(FLAGS_release_memory_after_idle).value;
  options.drain_timeout = absl::GetFlag(FLAGS_drain_timeout).value;
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.tensorboard_dir = absl::GetFlag(FLAGS_tensorboard_dir);
  options.max_runs = absl::GetFlag(FLAGS_max_runs);
  options.max_layers_per_run = absl::GetFlag(FLAGS_max_layers_per_run);
  options.max_microbatches_per_step =
      absl::GetFlag(FLAGS_max_microbatches_per_step);
  options.max_tensorboard_runs = absl::GetFlag(FLAGS_max_tensorboard_runs);
  options.max_tensorboard_bytes =
      absl::GetFlag(FLAGS_max_tensorboard_bytes).bytes;
  options.max_tensorboard_queued_steps =
      absl::GetFlag(FLAGS_max_tensorboard_queued_steps);
  options.step_idle_timeout = absl::GetFlag(FLAGS_step_idle_timeout).value;
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  options.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  options.health_needs_token = absl::GetFlag(FLAGS_health_needs_token);

  absl::StatusOr<std::unique_ptr<klserve::server::KlServer>> server =
      klserve::server::KlServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "klserve: %s\n", server.status().ToString().c_str());
    return 1;
  }
  // A stuck listener serves no new connection ever again: the server
  // drains as on SIGTERM, and exits 1 for its supervisor (systemd, a
  // container runtime's restart policy) to start it again.
  std::atomic<bool> listener_stuck{false};
  klserve::server::ListenerWatchdog listeners(
      (*server)->tcp_ports(), kListenerLookPeriod, kListenerPatience,
      [&listener_stuck](std::string what) {
        std::fprintf(stderr,
                     "klserve: %s; draining, then exiting with status 1\n",
                     what.c_str());
        listener_stuck = true;
        kill(getpid(), SIGTERM);
      });
  std::thread drainer([&signals, &listeners, s = server->get()] {
    int signal = 0;
    sigwait(&signals, &signal);
    std::fprintf(stderr, "klserve: signal %d, draining\n", signal);
    listeners.Stop();  // before the listeners close
    s->Drain();
  });
  (*server)->Wait();
  drainer.join();
  (*server)->RemoveSocketFiles();
  std::fprintf(stderr, "klserve: stopped\n");
  const int status = listener_stuck ? 1 : 0;
#if !KLSERVE_ADDRESS_SANITIZER
  // All the server owed is done: answers sent, steps published, event files
  // closed, socket files removed. Destroying it would run gRPC's global
  // shutdown, which joins gRPC's executor thread; after a socket once had
  // to wait to take a large answer, gRPC 1.51 polls it there up to 10 s at
  // a time, and an idle server took that long past its drain to exit (a
  // pod's grace period counts it). The ASan build goes the long way, so
  // that LeakSanitizer still checks the server's memory at exit.
  std::fflush(nullptr);
  std::_Exit(status);
#else
  return status;
#endif
}
