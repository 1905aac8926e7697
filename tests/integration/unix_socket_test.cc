// klserve on Unix-domain sockets (--listen=unix:/path, alone or beside a TCP
// address): the same answers as over TCP, the socket file's mode, stale and
// live sockets at start, bad paths, removal at exit, the token rule, and
// klctl over a socket.

#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "tests/integration/harness.h"

namespace klserve::integration {
namespace {

class UnixSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/klserve-socket-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    socket_ = dir_ + "/klserve.sock";
  }
  void TearDown() override {
    servers_.clear();  // SIGKILLs what is left
    std::system(("rm -rf " + dir_).c_str());
  }

  // Starts a server listening on `listen`; fails the test if it does not.
  ServerProcess& Start(const ListenOn& listen,
                       const std::vector<std::string>& flags = {},
                       const ClientOptions& probe = ClientOptions()) {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::Start(flags, absl::Seconds(20), probe, listen);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) std::abort();
    servers_.push_back(*std::move(server));
    return *servers_.back();
  }

  // A server that must refuse to start; its error.
  absl::Status StartFails(const ListenOn& listen,
                          const std::vector<std::string>& flags = {}) {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::Start(flags, absl::Seconds(10), ClientOptions(), listen);
    EXPECT_FALSE(server.ok()) << "klserve started";
    return server.ok() ? absl::OkStatus() : server.status();
  }

  std::string target() const { return "unix:" + socket_; }

  std::string dir_;
  std::string socket_;
  std::vector<std::unique_ptr<ServerProcess>> servers_;
};

ProblemSpec SocketSpec() {
  ProblemSpec spec;
  spec.name = "socket";
  spec.B = 2;
  spec.T = 8;
  spec.S = 16;
  spec.seed = 11;
  return spec;
}

TEST_F(UnixSocketTest, SocketAndTcpGiveTheLibraryAnswer) {
  ServerProcess& server = Start({.loopback = true, .sockets = {socket_}});
  const v1::ComputeLossRequest request = MakeRequest(SocketSpec());
  absl::StatusOr<v1::ComputeLossResponse> expected = LibraryCompute(request);
  ASSERT_TRUE(expected.ok()) << expected.status();
  for (const std::string& target : {server.target(), this->target()}) {
    std::unique_ptr<Client> client = MakeClient(target);
    ASSERT_NE(client, nullptr);
    absl::StatusOr<v1::ComputeLossResponse> unary =
        client->ComputeLossUnary(request);
    ASSERT_TRUE(unary.ok()) << target << ": " << Describe(unary.status());
    EXPECT_TRUE(SameResponse(*expected, *unary)) << target << " unary";
    absl::StatusOr<v1::ComputeLossResponse> streamed =
        client->ComputeLossStreaming(request, /*block_rows=*/3);
    ASSERT_TRUE(streamed.ok()) << target << ": " << Describe(streamed.status());
    EXPECT_TRUE(SameResponse(*expected, *streamed)) << target << " streamed";
  }
  EXPECT_TRUE(
      absl::StrContains(server.Log(), "and " + target() + " (plaintext)"))
      << server.Log();
}

TEST_F(UnixSocketTest, SocketAloneServes) {
  ServerProcess& server = Start({.loopback = false, .sockets = {socket_}});
  EXPECT_EQ(server.target(), target());
  std::unique_ptr<Client> client = MakeClient(target());
  ASSERT_NE(client, nullptr);
  absl::StatusOr<v1::GetServerInfoResponse> info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << Describe(info.status());
  EXPECT_EQ(info->backend(), "cpu");
}

mode_t ModeOf(const std::string& path) {
  struct stat info;
  if (lstat(path.c_str(), &info) != 0) return 07777;
  EXPECT_TRUE(S_ISSOCK(info.st_mode)) << path;
  return info.st_mode & 0777;
}

TEST_F(UnixSocketTest, SocketModeIsOwnerOnlyUnlessAsked) {
  Start({.loopback = false, .sockets = {socket_}});
  EXPECT_EQ(ModeOf(socket_), 0600u);
  const std::string group = dir_ + "/group.sock";
  Start({.loopback = false, .sockets = {group}}, {"--unix_socket_mode=0660"});
  EXPECT_EQ(ModeOf(group), 0660u);
}

TEST_F(UnixSocketTest, BadSocketModeIsAStartupError) {
  for (const char* mode : {"0800", "1777", "rw", ""}) {
    const absl::Status status =
        StartFails({.loopback = false, .sockets = {socket_}},
                   {std::string("--unix_socket_mode=") + mode});
    EXPECT_TRUE(absl::StrContains(status.message(), "--unix_socket_mode"))
        << mode << ": " << status;
  }
}

// A server that died leaves its socket file behind; the next one takes the
// path over.
TEST_F(UnixSocketTest, StaleSocketIsReplaced) {
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strcpy(address.sun_path, socket_.c_str());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0)
      << std::strerror(errno);
  close(fd);  // the file stays, nobody listens
  Start({.loopback = false, .sockets = {socket_}});
  std::unique_ptr<Client> client = MakeClient(target());
  ASSERT_NE(client, nullptr);
  absl::StatusOr<bool> serving = client->Health();
  ASSERT_TRUE(serving.ok()) << Describe(serving.status());
  EXPECT_TRUE(*serving);
}

// gRPC would replace a live server's socket with its own: klserve refuses
// to start instead, and the first server keeps its clients.
TEST_F(UnixSocketTest, SecondServerOnTheSameSocketRefusesToStart) {
  Start({.loopback = false, .sockets = {socket_}});
  const absl::Status second =
      StartFails({.loopback = true, .sockets = {socket_}});
  EXPECT_TRUE(absl::StrContains(second.message(),
                                "another server is serving on this socket"))
      << second;
  std::unique_ptr<Client> client = MakeClient(target());
  ASSERT_NE(client, nullptr);
  absl::StatusOr<bool> serving = client->Health();
  ASSERT_TRUE(serving.ok()) << Describe(serving.status());
  EXPECT_TRUE(*serving);
}

TEST_F(UnixSocketTest, PathHoldingAFileIsRefusedAndKept) {
  { std::ofstream(socket_) << "precious"; }
  const absl::Status status =
      StartFails({.loopback = false, .sockets = {socket_}});
  EXPECT_TRUE(absl::StrContains(status.message(), "is not a socket")) << status;
  std::ifstream kept(socket_);
  std::string text;
  kept >> text;
  EXPECT_EQ(text, "precious");
}

// unix:/run/klserve/klserve.sock works on a fresh host: the directories
// above the socket are made when missing. A file where a directory should
// be is a startup error.
TEST_F(UnixSocketTest, MissingDirectoriesAboveTheSocketAreMade) {
  const std::string deep = dir_ + "/run/klserve/klserve.sock";
  ServerProcess& server = Start({.loopback = false, .sockets = {deep}});
  EXPECT_EQ(server.target(), "unix:" + deep);
  std::unique_ptr<Client> client = MakeClient("unix:" + deep);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<v1::GetServerInfoResponse> info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << Describe(info.status());
  struct stat made;
  ASSERT_EQ(stat((dir_ + "/run/klserve").c_str(), &made), 0);
  EXPECT_TRUE(S_ISDIR(made.st_mode));

  { std::ofstream(dir_ + "/file") << "not a directory"; }
  const absl::Status status =
      StartFails({.loopback = false, .sockets = {dir_ + "/file/klserve.sock"}});
  EXPECT_TRUE(absl::StrContains(status.message(), "Not a directory")) << status;

  // A directory this user may not write in (/run without root): the error
  // says where a socket can go instead. Root writes anywhere.
  if (geteuid() != 0) {
    ASSERT_EQ(mkdir((dir_ + "/locked").c_str(), 0500), 0);
    const absl::Status locked = StartFails(
        {.loopback = false, .sockets = {dir_ + "/locked/run/klserve.sock"}});
    EXPECT_TRUE(absl::StrContains(
        locked.message(),
        "Permission denied; choose a directory this user may write, such as "
        "unix:/tmp/klserve/klserve.sock"))
        << locked;
  }
}

TEST_F(UnixSocketTest, BadListenAddressesAreStartupErrors) {
  const struct {
    const char* listen;
    const char* message;
  } cases[] = {
      {"unix:relative.sock", "a socket path must be absolute"},
      {"127.0.0.1:0,,unix:/tmp/x.sock", "must be non-empty"},
      {"unix:/tmp/twice.sock,unix:///tmp//./twice.sock", "given once"},
      {"unix-abstract:klserve", "HOST:PORT or unix:/absolute/path"},
      {"dns:///localhost:50051", "HOST:PORT or unix:/absolute/path"},
      // A forgotten port, which gRPC would have taken as 443.
      {"0.0.0.0", "--listen: an address is HOST:PORT, its port included"},
      {"127.0.0.1:65536", "--listen: PORT is a number in [0, 65535]"},
      {"127.0.0.1:http", "--listen: PORT is a number"},
      {"::1:50051", "an IPv6 address in brackets"},
      {":50051", "--listen: HOST is a name"},
  };
  for (const auto& c : cases) {
    const CommandResult run =
        RunCommand({KLSERVE_BIN, std::string("--listen=") + c.listen,
                    "--metrics_listen="});
    EXPECT_EQ(run.exit_code, 1) << c.listen;
    EXPECT_TRUE(absl::StrContains(run.err, c.message))
        << c.listen << ": " << run.err;
  }
  // The same rule for /metrics, where civetweb would have read a bare
  // number as a port on every interface.
  for (const char* metrics : {"9464", "0.0.0.0", "127.0.0.1:99999"}) {
    const CommandResult run =
        RunCommand({KLSERVE_BIN, "--listen=127.0.0.1:0",
                    std::string("--metrics_listen=") + metrics});
    EXPECT_EQ(run.exit_code, 1) << metrics;
    EXPECT_TRUE(absl::StrContains(run.err, "--metrics_listen: "))
        << metrics << ": " << run.err;
  }
  const std::string long_path = "unix:/tmp/" + std::string(120, 'x');
  const CommandResult run =
      RunCommand({KLSERVE_BIN, "--listen=" + long_path, "--metrics_listen="});
  EXPECT_TRUE(absl::StrContains(run.err, "at most 99 bytes")) << run.err;
}

TEST_F(UnixSocketTest, SigtermRemovesTheSocket) {
  ServerProcess& server = Start({.loopback = true, .sockets = {socket_}});
  server.Signal(SIGTERM);
  const std::optional<int> status = server.WaitForExit(absl::Seconds(10));
  ASSERT_TRUE(status.has_value()) << "still running 10 s after SIGTERM";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << server.Log();
  struct stat info;
  EXPECT_NE(lstat(socket_.c_str(), &info), 0) << "the socket is still there";
}

// A server that stops must not delete the socket of a later server on the
// same path (gRPC deletes the name it bound; klserve binds at a side name).
TEST_F(UnixSocketTest, StoppingAnOldServerLeavesTheNewOnesSocket) {
  ServerProcess& old_server = Start({.loopback = true, .sockets = {socket_}});
  ASSERT_EQ(unlink(socket_.c_str()), 0);  // someone removed its file
  Start({.loopback = false, .sockets = {socket_}});
  old_server.Signal(SIGTERM);
  ASSERT_TRUE(old_server.WaitForExit(absl::Seconds(10)).has_value());
  EXPECT_EQ(ModeOf(socket_), 0600u);
  std::unique_ptr<Client> client = MakeClient(target());
  ASSERT_NE(client, nullptr);
  absl::StatusOr<bool> serving = client->Health();
  ASSERT_TRUE(serving.ok()) << Describe(serving.status());
  EXPECT_TRUE(*serving);
}

TEST_F(UnixSocketTest, TokenIsRequiredOverTheSocketToo) {
  const std::string token_file = dir_ + "/token";
  { std::ofstream(token_file) << "socket-secret\n"; }
  Start({.loopback = false, .sockets = {socket_}},
        {"--auth_token_file=" + token_file});
  std::unique_ptr<Client> anonymous = MakeClient(target(), 1, absl::Seconds(3));
  ASSERT_NE(anonymous, nullptr);
  EXPECT_EQ(anonymous->GetServerInfo().status().code(),
            absl::StatusCode::kUnauthenticated);
  ClientOptions security;
  security.auth_token = "socket-secret";
  std::unique_ptr<Client> client =
      MakeClient(target(), 1, kCallDeadline, security);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<v1::GetServerInfoResponse> info = client->GetServerInfo();
  EXPECT_TRUE(info.ok()) << Describe(info.status());
}

TEST_F(UnixSocketTest, KlctlTalksOverTheSocket) {
  Start({.loopback = false, .sockets = {socket_}});
  const CommandResult info =
      RunCommand({KLCTL_BIN, "info", "--target=" + target()});
  EXPECT_EQ(info.exit_code, 0) << info.err;
  EXPECT_TRUE(absl::StrContains(info.out, "cpu")) << info.out;
}

}  // namespace
}  // namespace klserve::integration
