#include "client/call_status.h"

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "proto/call_metadata.h"

namespace klserve {

namespace {

// The absl::Status payload marking a refusal at the limit of calls in flight.
constexpr absl::string_view kOverloadedPayload = "klserve.dev/overloaded";

}  // namespace

absl::Status StatusFromCall(const grpc::Status& status,
                            const grpc::ClientContext& context) {
  if (status.ok()) return absl::OkStatus();
  if (status.error_code() == grpc::StatusCode::CANCELLED &&
      status.error_message() == "CANCELLED") {
    return absl::UnavailableError(
        "the server shut down before handling the call (gRPC: CANCELLED)");
  }
  // gRPC and absl number their codes alike, so the cast keeps the code.
  absl::Status result(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
  if (result.code() == absl::StatusCode::kResourceExhausted &&
      context.GetServerTrailingMetadata().count(kOverloadedMetadataKey) > 0) {
    result.SetPayload(kOverloadedPayload, absl::Cord());
  }
  return result;
}

bool IsOverloaded(const absl::Status& status) {
  return status.code() == absl::StatusCode::kResourceExhausted &&
         status.GetPayload(kOverloadedPayload).has_value();
}

absl::Status ExplainMessageLimit(const absl::Status& status,
                                 int64_t max_message_bytes) {
  if (status.code() != absl::StatusCode::kResourceExhausted) return status;
  const absl::string_view message = status.message();
  // "[CLIENT: ]Sent|Received message larger than max (N vs. LIMIT)"
  size_t at = message.find("message larger than max (");
  if (at == absl::string_view::npos) return status;
  const size_t vs = message.find(" vs. ", at);
  const size_t end = message.find(')', at);
  int64_t limit = 0;
  if (vs == absl::string_view::npos || end == absl::string_view::npos ||
      end < vs ||
      !absl::SimpleAtoi(message.substr(vs + 5, end - vs - 5), &limit)) {
    return status;
  }
  const bool sent = absl::StrContains(message.substr(0, at), "Sent");
  return absl::ResourceExhaustedError(absl::StrCat(
      message, " (",
      sent || limit == max_message_bytes ? "this client's max_message_bytes"
                                         : "the server's --max_message_bytes",
      " is ", limit,
      " bytes: klctl --stream=always, or a --stream_threshold below it, "
      "sends the tensors in blocks of --block_bytes, which must be well "
      "below it too, as a projections-form block's answer also carries the "
      "rows of a tile the block before left open "
      "(ClientOptions::stream_threshold_bytes, block_bytes))"));
}

absl::Status ExplainUnavailable(const absl::Status& status, bool tls,
                                bool client_certificate) {
  if (status.code() != absl::StatusCode::kUnavailable) return status;
  const absl::string_view message = status.message();
  // An answer that is not HTTP/2 at all ("HTTP/1.1 400 ..."): a web server
  // answers there, or a TLS proxy that took the plaintext for HTTP/1.
  if (absl::StrContains(message, "Failed parsing HTTP/2")) {
    return absl::UnavailableError(absl::StrCat(
        message,
        " (something other than a gRPC server answers at this address: an "
        "HTTP/1 server, such as klserve's /metrics port (9464 by default; "
        "its gRPC port is 50051 by default)",
        tls ? ")"
            : ", or a TLS proxy: then give the client its CA (klctl "
              "--tls_ca, ClientOptions::tls_ca_file, Python tls_ca_file=))"));
  }
  // gRPC's word when a server shuts down with the call still on it: klserve
  // does so when its drain (--drain_timeout) runs out.
  if (message == "Cancelling all calls") {
    return absl::UnavailableError(absl::StrCat(
        message,
        " (the server stopped while this call was in flight: its drain after "
        "SIGTERM, --drain_timeout, ended first; send the call again, to the "
        "replica that replaces it)"));
  }
  // gRPC's word for a call whose connection closed under it: the call had
  // started, so the address and TLS were right.
  if (absl::StrContains(message, "Stream removed")) {
    return absl::UnavailableError(absl::StrCat(
        message,
        " (the connection closed while this call was in flight: the server "
        "was killed or restarted, or the network between cut it; send the "
        "call again)"));
  }
  const bool transport = absl::StrContains(message, "Socket closed") ||
                         absl::StrContains(message, "handshake") ||
                         absl::StrContains(message, "Connection reset") ||
                         absl::StrContains(message, "failed to connect");
  if (!transport) return status;
  // Refused (TCP) or no such file (a Unix socket): nothing listens there, so
  // TLS is not the question.
  if (absl::StrContains(message, "Connection refused") ||
      absl::StrContains(message, "No such file or directory")) {
    return absl::UnavailableError(
        absl::StrCat(message,
                     " (nothing listens at this address: is the server up, "
                     "and is the target right?)"));
  }
  const char* hint =
      !tls ? "if the server speaks TLS, give the client the CA that signed "
             "its certificate (klctl --tls_ca, ClientOptions::tls_ca_file, "
             "Python tls_ca_file=)"
      : !client_certificate
          ? "if the server requires client certificates (mutual TLS), give "
            "the client one with its key (klctl --tls_cert and --tls_key, "
            "ClientOptions::tls_cert_file and tls_key_file)"
          : "check that the server speaks TLS, that its certificate names "
            "the target's host (or set tls_server_name), and that it trusts "
            "the CA of the client certificate";
  return absl::UnavailableError(
      absl::StrCat(message, " (is the server up at this address? ", hint, ")"));
}

}  // namespace klserve
