// Transport security and the bearer token against the real server: TLS and
// mutual TLS with certificates made here by `openssl` (a test CA, a server
// certificate for 127.0.0.1 and localhost, a client certificate, and an
// unrelated CA), and --auth_token_file through the Client, raw stubs and
// klctl. See docs/security.md.

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/integration/harness.h"

#ifndef KLCTL_BIN
#error "KLCTL_BIN must be defined by the build"
#endif

namespace klserve::integration {
namespace {

constexpr char kToken[] = "s3cret-Token_0123456789";

void WriteFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
}

// Runs openssl; fails the test with its output when it fails.
::testing::AssertionResult OpenSsl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/usr/bin/openssl"};
  argv.insert(argv.end(), args.begin(), args.end());
  const CommandResult result = RunCommand(argv);
  if (result.exit_code == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "openssl " << args[0] << " failed (" << result.exit_code
         << "): " << result.err;
}

class SecurityTest : public ::testing::Test {
 protected:
  // The certificates, made once for the suite.
  static void SetUpTestSuite() {
    std::string dir = ::testing::TempDir() + "klserve_security_XXXXXX";
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    dir_ = new std::string(dir + "/");
    const std::string d = *dir_;
    const std::vector<std::string> ec_key = {
        "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"};
    // Two self-signed CAs.
    for (const std::string ca : {"ca", "other_ca"}) {
      std::vector<std::string> args = {"req", "-x509"};
      args.insert(args.end(), ec_key.begin(), ec_key.end());
      args.insert(args.end(),
                  {"-keyout", d + ca + ".key", "-out", d + ca + ".pem", "-days",
                   "2", "-subj", "/CN=klserve test " + ca, "-addext",
                   "basicConstraints=critical,CA:TRUE", "-addext",
                   "keyUsage=critical,keyCertSign,cRLSign"});
      ASSERT_TRUE(OpenSsl(args));
    }
    // A server and a client certificate, both signed by "ca".
    WriteFile(d + "server.ext",
              "basicConstraints=CA:FALSE\n"
              "keyUsage=critical,digitalSignature,keyEncipherment\n"
              "extendedKeyUsage=serverAuth\n"
              "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
    WriteFile(d + "client.ext",
              "basicConstraints=CA:FALSE\n"
              "keyUsage=critical,digitalSignature,keyEncipherment\n"
              "extendedKeyUsage=clientAuth\n");
    for (const std::string leaf : {"server", "client"}) {
      std::vector<std::string> args = {"req"};
      args.insert(args.end(), ec_key.begin(), ec_key.end());
      args.insert(args.end(),
                  {"-keyout", d + leaf + ".key", "-out", d + leaf + ".csr",
                   "-subj", "/CN=klserve test " + leaf});
      ASSERT_TRUE(OpenSsl(args));
      ASSERT_TRUE(OpenSsl({"x509", "-req", "-in", d + leaf + ".csr", "-CA",
                           d + "ca.pem", "-CAkey", d + "ca.key",
                           "-CAcreateserial", "-out", d + leaf + ".pem",
                           "-days", "2", "-extfile", d + leaf + ".ext"}));
    }
    WriteFile(d + "token", std::string(kToken) + "\n");
    WriteFile(d + "wrong_token", "not-the-token\n");
    WriteFile(d + "empty_token", "");
  }

  static void TearDownTestSuite() {
    if (dir_ != nullptr) {
      RunCommand({"/bin/rm", "-rf", *dir_});
      delete dir_;
      dir_ = nullptr;
    }
  }

  static std::string Path(const std::string& name) { return *dir_ + name; }

  static std::vector<std::string> TlsFlags() {
    return {"--tls_cert=" + Path("server.pem"),
            "--tls_key=" + Path("server.key")};
  }
  static std::vector<std::string> MtlsFlags() {
    std::vector<std::string> flags = TlsFlags();
    flags.push_back("--tls_client_ca=" + Path("ca.pem"));
    return flags;
  }
  // Client security options: TLS trusting `ca`, with the client
  // certificate when `client_cert`, and `token`.
  static ClientOptions Security(const std::string& ca, bool client_cert,
                                const std::string& token = "") {
    ClientOptions options;
    if (!ca.empty()) options.tls_ca_file = Path(ca);
    if (client_cert) {
      options.tls_cert_file = Path("client.pem");
      options.tls_key_file = Path("client.key");
    }
    options.auth_token = token;
    return options;
  }

  void Start(const std::vector<std::string>& flags,
             const ClientOptions& probe) {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::Start(flags, absl::Seconds(20), probe);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  void TearDown() override {
    if (server_ != nullptr) {
      EXPECT_TRUE(server_->Running()) << "klserve died; its log:\n"
                                      << server_->Log();
    }
  }

  // A short call that must fail: GetServerInfo with one attempt and a
  // 3 s deadline.
  absl::Status InfoWith(const ClientOptions& security) {
    std::unique_ptr<Client> client =
        MakeClient(server_->target(), 1, absl::Seconds(3), security);
    if (client == nullptr) return absl::InternalError("no client");
    return client->GetServerInfo().status();
  }

  // A problem's loss through `security`, unary and streamed, must be the
  // library's bit for bit.
  void ExpectExactLoss(const ClientOptions& security) {
    std::unique_ptr<Client> client =
        MakeClient(server_->target(), 1, kCallDeadline, security);
    ASSERT_NE(client, nullptr);
    ProblemSpec spec;
    spec.name = "secure";
    spec.B = 2;
    spec.T = 8;
    spec.S = 16;
    spec.seed = 7;
    const v1::ComputeLossRequest request = MakeRequest(spec);
    absl::StatusOr<v1::ComputeLossResponse> expected = LibraryCompute(request);
    ASSERT_TRUE(expected.ok()) << expected.status();
    absl::StatusOr<v1::ComputeLossResponse> unary =
        client->ComputeLossUnary(request);
    ASSERT_TRUE(unary.ok()) << Describe(unary.status());
    EXPECT_TRUE(SameResponse(*expected, *unary)) << "unary";
    absl::StatusOr<v1::ComputeLossResponse> streamed =
        client->ComputeLossStreaming(request, /*block_rows=*/3);
    ASSERT_TRUE(streamed.ok()) << Describe(streamed.status());
    EXPECT_TRUE(SameResponse(*expected, *streamed)) << "streamed";
  }

  static std::string* dir_;
  std::unique_ptr<ServerProcess> server_;
};

std::string* SecurityTest::dir_ = nullptr;

TEST_F(SecurityTest, TlsServerRefusesPlaintextClient) {
  ASSERT_NO_FATAL_FAILURE(Start(TlsFlags(), Security("ca.pem", false)));
  const absl::Status status = InfoWith(ClientOptions());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << Describe(status);
  // The bare "Socket closed" says what to do about it.
  EXPECT_TRUE(absl::StrContains(status.message(), "if the server speaks TLS"))
      << Describe(status);
  EXPECT_TRUE(absl::StrContains(server_->Log(), "TLS")) << server_->Log();
}

TEST_F(SecurityTest, TlsClientTrustingAnotherCaIsRefused) {
  ASSERT_NO_FATAL_FAILURE(Start(TlsFlags(), Security("ca.pem", false)));
  const absl::Status status = InfoWith(Security("other_ca.pem", false));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << Describe(status);
}

TEST_F(SecurityTest, TlsClientGetsTheLibraryLoss) {
  ASSERT_NO_FATAL_FAILURE(Start(TlsFlags(), Security("ca.pem", false)));
  ExpectExactLoss(Security("ca.pem", false));
}

TEST_F(SecurityTest, TlsServerNameOverride) {
  ASSERT_NO_FATAL_FAILURE(Start(TlsFlags(), Security("ca.pem", false)));
  ClientOptions security = Security("ca.pem", false);
  security.tls_server_name = "localhost";
  EXPECT_TRUE(InfoWith(security).ok());
  // A name the certificate does not carry fails verification.
  security.tls_server_name = "elsewhere.example";
  EXPECT_FALSE(InfoWith(security).ok());
}

TEST_F(SecurityTest, MutualTlsRefusesClientWithoutCertificate) {
  ASSERT_NO_FATAL_FAILURE(Start(MtlsFlags(), Security("ca.pem", true)));
  EXPECT_TRUE(absl::StrContains(server_->Log(), "mutual TLS"))
      << server_->Log();
  const absl::Status no_cert = InfoWith(Security("ca.pem", false));
  EXPECT_EQ(no_cert.code(), absl::StatusCode::kUnavailable)
      << Describe(no_cert);
  EXPECT_TRUE(absl::StrContains(no_cert.message(), "--tls_cert"))
      << Describe(no_cert);
  const absl::Status plaintext = InfoWith(ClientOptions());
  EXPECT_EQ(plaintext.code(), absl::StatusCode::kUnavailable)
      << Describe(plaintext);
}

TEST_F(SecurityTest, MutualTlsClientGetsTheLibraryLoss) {
  ASSERT_NO_FATAL_FAILURE(Start(MtlsFlags(), Security("ca.pem", true)));
  ExpectExactLoss(Security("ca.pem", true));
}

TEST_F(SecurityTest, TokenRequiredForEveryIndexerKlRpc) {
  // The probe sends no token: health is exempt.
  ASSERT_NO_FATAL_FAILURE(
      Start({"--auth_token_file=" + Path("token"), "--enable_echo"},
            ClientOptions()));

  const absl::Status missing = InfoWith(ClientOptions());
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnauthenticated)
      << Describe(missing);
  EXPECT_TRUE(absl::StrContains(missing.message(), "authorization"))
      << missing.message();

  const absl::Status wrong = InfoWith(Security("", false, "not-the-token"));
  EXPECT_EQ(wrong.code(), absl::StatusCode::kUnauthenticated)
      << Describe(wrong);
  EXPECT_TRUE(absl::StrContains(wrong.message(), "wrong token"))
      << wrong.message();
  // A token that is the right one's prefix, or longer, is wrong too.
  EXPECT_EQ(InfoWith(Security("", false, "s3cret")).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(InfoWith(Security("", false, std::string(kToken) + "x")).code(),
            absl::StatusCode::kUnauthenticated);

  // Every method, streams included, without the token.
  std::unique_ptr<Client> anonymous = MakeClient(server_->target());
  ASSERT_NE(anonymous, nullptr);
  ProblemSpec spec;
  spec.name = "token";
  const v1::ComputeLossRequest request = MakeRequest(spec);
  EXPECT_EQ(anonymous->ComputeLossUnary(request).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(anonymous->ComputeLossStreaming(request).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(anonymous->FinishStep("run", 1).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(anonymous->EchoStream(2, 16, 16).status().code(),
            absl::StatusCode::kUnauthenticated);
  // Health answers without a token (Kubernetes probes).
  absl::StatusOr<bool> health = anonymous->Health();
  ASSERT_TRUE(health.ok()) << Describe(health.status());
  EXPECT_TRUE(*health);

  // The right token works.
  ExpectExactLoss(Security("", false, kToken));
  std::unique_ptr<Client> authorized = MakeClient(
      server_->target(), 1, kCallDeadline, Security("", false, kToken));
  ASSERT_NE(authorized, nullptr);
  EXPECT_TRUE(authorized->EchoStream(2, 16, 16).ok());
}

TEST_F(SecurityTest, HealthViaRawStubNeedsNoToken) {
  ASSERT_NO_FATAL_FAILURE(
      Start({"--auth_token_file=" + Path("token")}, ClientOptions()));
  auto channel = grpc::CreateChannel(server_->target(),
                                     grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  ASSERT_TRUE(status.ok()) << Describe(status);
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

// --health_needs_token: health is one more method that needs the token, for
// probes that can send it (klctl health --auth_token_file).
TEST_F(SecurityTest, HealthNeedsTheTokenWhenAsked) {
  ASSERT_NO_FATAL_FAILURE(
      Start({"--auth_token_file=" + Path("token"), "--health_needs_token"},
            Security("", false, kToken)));
  std::unique_ptr<Client> anonymous = MakeClient(server_->target());
  ASSERT_NE(anonymous, nullptr);
  const absl::StatusOr<bool> refused = anonymous->Health();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated)
      << Describe(refused.status());
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "authorization"))
      << refused.status();
  std::unique_ptr<Client> authorized = MakeClient(
      server_->target(), 1, kCallDeadline, Security("", false, kToken));
  ASSERT_NE(authorized, nullptr);
  const absl::StatusOr<bool> serving = authorized->Health();
  ASSERT_TRUE(serving.ok()) << Describe(serving.status());
  EXPECT_TRUE(*serving);

  const std::string target = "--target=" + server_->target();
  const CommandResult none =
      RunCommand({KLCTL_BIN, "health", target, "--max_attempts=1"});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(none.err, "UNAUTHENTICATED")) << none.err;
  const CommandResult probe = RunCommand(
      {KLCTL_BIN, "health", target, "--auth_token_file=" + Path("token")});
  EXPECT_EQ(probe.exit_code, 0) << probe.err;
  EXPECT_TRUE(absl::StrContains(probe.out, "SERVING")) << probe.out;
}

TEST_F(SecurityTest, HealthNeedsTokenWithoutATokenIsAStartupError) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start({"--health_needs_token"}, absl::Seconds(10));
  ASSERT_FALSE(server.ok());
  EXPECT_TRUE(
      absl::StrContains(server.status().message(),
                        "--health_needs_token: needs --auth_token_file"))
      << server.status();
}

TEST_F(SecurityTest, EmptyTokenFileIsAStartupError) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(
      {"--auth_token_file=" + Path("empty_token")}, absl::Seconds(10));
  ASSERT_FALSE(server.ok());
  EXPECT_TRUE(absl::StrContains(server.status().message(), "empty"))
      << server.status();
}

TEST_F(SecurityTest, CertWithoutKeyIsAStartupError) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(
      {"--tls_cert=" + Path("server.pem")}, absl::Seconds(10));
  ASSERT_FALSE(server.ok());
  EXPECT_TRUE(absl::StrContains(server.status().message(), "--tls_key"))
      << server.status();
}

TEST_F(SecurityTest, KlctlWithTokenFile) {
  ASSERT_NO_FATAL_FAILURE(
      Start({"--auth_token_file=" + Path("token")}, ClientOptions()));
  const std::string target = "--target=" + server_->target();
  const CommandResult ok = RunCommand(
      {KLCTL_BIN, "info", target, "--auth_token_file=" + Path("token")});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_TRUE(absl::StrContains(ok.out, "version:")) << ok.out;

  const CommandResult none =
      RunCommand({KLCTL_BIN, "info", target, "--max_attempts=1"});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(none.err, "UNAUTHENTICATED")) << none.err;

  const CommandResult wrong =
      RunCommand({KLCTL_BIN, "info", target, "--max_attempts=1",
                  "--auth_token_file=" + Path("wrong_token")});
  EXPECT_EQ(wrong.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(wrong.err, "UNAUTHENTICATED")) << wrong.err;
}

TEST_F(SecurityTest, KlctlOverMutualTlsWithToken) {
  ASSERT_NO_FATAL_FAILURE(Start(
      [] {
        std::vector<std::string> flags = MtlsFlags();
        flags.push_back("--auth_token_file=" + Path("token"));
        return flags;
      }(),
      Security("ca.pem", true)));
  const std::vector<std::string> tls = {
      "--target=" + server_->target(), "--tls_ca=" + Path("ca.pem"),
      "--tls_cert=" + Path("client.pem"), "--tls_key=" + Path("client.key"),
      "--tls_server_name=localhost"};
  std::vector<std::string> argv = {KLCTL_BIN, "info"};
  argv.insert(argv.end(), tls.begin(), tls.end());
  argv.push_back("--auth_token_file=" + Path("token"));
  const CommandResult ok = RunCommand(argv);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;

  argv = {KLCTL_BIN, "health"};
  argv.insert(argv.end(), tls.begin(), tls.end());
  const CommandResult health = RunCommand(argv);
  EXPECT_EQ(health.exit_code, 0) << health.err;
  EXPECT_TRUE(absl::StrContains(health.out, "SERVING")) << health.out;
}

}  // namespace
}  // namespace klserve::integration
