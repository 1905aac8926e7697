#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "gtest/gtest.h"

// Client::Create refuses each bad option before any connection, naming the
// option as the caller asked: the library's names by default, a program's
// own (klctl's flags) when it passes them.

namespace klserve {
namespace {

// A caller's names, none of them a library name, so that a message that
// kept one of the library's shows.
ClientOptionNames FlagNames() {
  return {.target = "-T",
          .deadline = "-D",
          .max_message_bytes = "-M",
          .max_attempts = "-A",
          .initial_backoff = "-I",
          .max_backoff = "-X",
          .stream_threshold_bytes = "-S",
          .block_bytes = "-B",
          .tls_ca_file = "-C",
          .tls_cert_file = "-E",
          .tls_key_file = "-K",
          .tls_server_name = "-N"};
}

struct BadOptions {
  const char* what;
  void (*spoil)(ClientOptions&);
  // The message each set of names must give, whole.
  std::string library_message;
  std::string flag_message;
};

// A file of `text` in the test's temporary folder.
std::string FileOf(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::vector<BadOptions> Cases() {
  return {
      {"empty target", [](ClientOptions& o) { o.target = ""; },
       "ClientOptions.target: must not be empty", "-T: must not be empty"},
      {"URL target", [](ClientOptions& o) { o.target = "https://h:1"; },
       "ClientOptions.target: \"https://h:1\" is a URL; gRPC takes host:port, "
       "dns:///host:port or unix:/path (TLS is set by "
       "ClientOptions.tls_ca_file, not an https:// scheme)",
       "-T: \"https://h:1\" is a URL; gRPC takes host:port, dns:///host:port "
       "or unix:/path (TLS is set by -C, not an https:// scheme)"},
      {"zero deadline",
       [](ClientOptions& o) { o.deadline = absl::ZeroDuration(); },
       "ClientOptions.deadline: must be finite and > 0, got 0",
       "-D: must be finite and > 0, got 0"},
      {"message limit past 2 GiB",
       [](ClientOptions& o) { o.max_message_bytes = int64_t{1} << 31; },
       "ClientOptions.max_message_bytes: must be in [1, 2147483647], got "
       "2147483648",
       "-M: must be in [1, 2147483647], got 2147483648"},
      {"no attempt", [](ClientOptions& o) { o.max_attempts = 0; },
       "ClientOptions.max_attempts: must be >= 1, got 0",
       "-A: must be >= 1, got 0"},
      {"backoffs reversed",
       [](ClientOptions& o) {
         o.initial_backoff = absl::Seconds(3);
         o.max_backoff = absl::Seconds(2);
       },
       "ClientOptions.initial_backoff, ClientOptions.max_backoff: need 0 < "
       "ClientOptions.initial_backoff <= ClientOptions.max_backoff",
       "-I, -X: need 0 < -I <= -X"},
      {"negative stream threshold",
       [](ClientOptions& o) { o.stream_threshold_bytes = -1; },
       "ClientOptions.stream_threshold_bytes: must be >= 0, got -1",
       "-S: must be >= 0, got -1"},
      {"empty blocks", [](ClientOptions& o) { o.block_bytes = 0; },
       "ClientOptions.block_bytes: must be >= 1, got 0",
       "-B: must be >= 1, got 0"},
      {"TLS name without roots",
       [](ClientOptions& o) { o.tls_server_name = "klserve"; },
       "ClientOptions.tls_cert_file, ClientOptions.tls_key_file, "
       "ClientOptions.tls_server_name: need ClientOptions.tls_ca_file",
       "-E, -K, -N: need -C"},
      {"certificate without key",
       [](ClientOptions& o) {
         o.tls_ca_file = "/nonexistent/ca.pem";
         o.tls_cert_file = "/nonexistent/cert.pem";
       },
       "ClientOptions.tls_cert_file, ClientOptions.tls_key_file: set both or "
       "neither",
       "-E, -K: set both or neither"},
  };
}

TEST(ClientOptionsTest, EachBadOptionIsRefusedByTheNameTheCallerGave) {
  for (const BadOptions& c : Cases()) {
    for (const bool flags : {false, true}) {
      ClientOptions options;
      c.spoil(options);
      const absl::StatusOr<std::unique_ptr<Client>> client =
          flags ? Client::Create(options, FlagNames())
                : Client::Create(options);
      ASSERT_FALSE(client.ok()) << c.what;
      EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument)
          << c.what;
      EXPECT_EQ(client.status().message(),
                flags ? c.flag_message : c.library_message)
          << c.what;
    }
  }
}

// The credential files are named as the caller named them too, each in its
// own refusal: the roots, the certificate, its key. The client reads only
// the blocks' labels before gRPC takes them, so a block with a certificate's
// label passes, and is enough to reach the next file.
TEST(ClientOptionsTest, UnreadableCredentialFilesAreNamedByTheCallersNames) {
  const std::string certificate =
      FileOf("certificate.pem",
             "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n");
  const std::string text = FileOf("not_pem.txt", "not a certificate\n");
  const std::string missing = ::testing::TempDir() + "/no_such_file.pem";
  struct Case {
    std::string ca, cert, key;
    std::string library_name, flag_name;
  };
  for (const Case& c : {
           Case{missing, "", "", "ClientOptions.tls_ca_file", "-C"},
           Case{text, "", "", "ClientOptions.tls_ca_file", "-C"},
           Case{certificate, text, text, "ClientOptions.tls_cert_file", "-E"},
           Case{certificate, certificate, text, "ClientOptions.tls_key_file",
                "-K"},
       }) {
    for (const bool flags : {false, true}) {
      ClientOptions options;
      options.tls_ca_file = c.ca;
      options.tls_cert_file = c.cert;
      options.tls_key_file = c.key;
      const absl::StatusOr<std::unique_ptr<Client>> client =
          flags ? Client::Create(options, FlagNames())
                : Client::Create(options);
      ASSERT_FALSE(client.ok());
      EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
      const std::string name = flags ? c.flag_name : c.library_name;
      EXPECT_EQ(client.status().message().substr(0, name.size() + 2),
                name + ": ")
          << client.status();
    }
  }
}

TEST(ClientOptionsTest, DefaultOptionsAreTaken) {
  EXPECT_TRUE(Client::Create(ClientOptions()).ok());
  EXPECT_TRUE(Client::Create(ClientOptions(), FlagNames()).ok());
}

}  // namespace
}  // namespace klserve
