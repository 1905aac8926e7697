// The bounded reader of credential files (auth/credential_file.h): what a
// flag may point at by mistake or by malice is refused at once, without
// reading it whole or waiting on it.

#include "auth/credential_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"

namespace klserve {
namespace {

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "klserve_credential_" + name;
}

std::string WriteTemp(const std::string& name, const std::string& content) {
  const std::string path = TempPath(name);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
  return path;
}

// INVALID_ARGUMENT naming the field and the file, with `words` in it.
void ExpectRefused(const std::string& path, const std::string& words,
                   size_t max_bytes = kMaxCredentialFileBytes) {
  const absl::StatusOr<std::string> read =
      ReadCredentialFile("--tls_cert", path, max_bytes);
  ASSERT_FALSE(read.ok()) << "read " << read->size() << " bytes";
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(read.status().message(),
                               "--tls_cert: cannot read \"" + path + "\""))
      << read.status();
  EXPECT_TRUE(absl::StrContains(read.status().message(), words))
      << read.status();
}

TEST(ReadCredentialFileTest, ReadsARegularFileAndASymlinkToOne) {
  const std::string path = WriteTemp("pem", "-----BEGIN\x01\n");
  absl::StatusOr<std::string> read = ReadCredentialFile("--tls_cert", path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "-----BEGIN\x01\n");
  // Kubernetes mounts a secret's files as symlinks.
  const std::string link = TempPath("link");
  unlink(link.c_str());
  ASSERT_EQ(symlink(path.c_str(), link.c_str()), 0);
  read = ReadCredentialFile("--tls_cert", link);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "-----BEGIN\x01\n");
}

TEST(ReadCredentialFileTest, TheBoundIsInclusive) {
  const std::string path = WriteTemp("bound", std::string(100, 'a'));
  const absl::StatusOr<std::string> read =
      ReadCredentialFile("--tls_cert", path, 100);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->size(), 100u);
  ExpectRefused(path, "larger than 99 bytes", 99);
}

TEST(ReadCredentialFileTest, RefusesMissingEmptyAndDirectories) {
  ExpectRefused(TempPath("no/such/file"), "No such file");
  ExpectRefused(WriteTemp("empty", ""), "empty");
  ExpectRefused(::testing::TempDir(), "not a regular file");
}

// /dev/zero never ends: read whole, it filled the memory until the server
// was killed.
TEST(ReadCredentialFileTest, RefusesAnEndlessDeviceWithoutReadingIt) {
  ExpectRefused("/dev/zero", "not a regular file");
}

// Regular files to stat, but the kernel's: a token read from one is
// anyone's to read.
TEST(ReadCredentialFileTest, RefusesProcfsAndSysfsFiles) {
  ExpectRefused("/proc/sys/kernel/hostname", "procfs or sysfs");
  if (access("/sys/kernel/mm/transparent_hugepage/enabled", R_OK) == 0) {
    ExpectRefused("/sys/kernel/mm/transparent_hugepage/enabled",
                  "procfs or sysfs");
  }
}

// A FIFO with no writer used to block the server's start forever, SIGTERM
// included.
TEST(ReadCredentialFileTest, RefusesAFifoWithoutWaitingForAWriter) {
  const std::string path = TempPath("fifo");
  unlink(path.c_str());
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  ExpectRefused(path, "not a regular file");
  unlink(path.c_str());
}

// A file that is not PEM (an .npy, a token, a DER certificate) was taken,
// and every TLS handshake then failed with "empty address list".
TEST(ReadPemFileTest, TakesTheBlocksOfTheirKindOnly) {
  const std::string certificate =
      "subject=CN = klserve\n-----BEGIN CERTIFICATE-----\nMIIB\n"
      "-----END CERTIFICATE-----\n";
  const std::string chain = certificate + certificate;
  const std::string x509 =
      "-----BEGIN X509 CERTIFICATE-----\nMIIB\n-----END X509 "
      "CERTIFICATE-----\n";
  for (const std::string& pem : {certificate, chain, x509}) {
    const absl::StatusOr<std::string> read = ReadPemFile(
        "--tls_cert", WriteTemp("cert.pem", pem), PemContent::kCertificates);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(*read, pem);
  }
  for (const std::string label :
       {"PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"}) {
    const std::string pem =
        "-----BEGIN " + label + "-----\nMIIE\n-----END " + label + "-----\n";
    const absl::StatusOr<std::string> read = ReadPemFile(
        "--tls_key", WriteTemp("key.pem", pem), PemContent::kPrivateKey);
    EXPECT_TRUE(read.ok()) << label << ": " << read.status();
  }
  const struct {
    std::string content;
    PemContent wanted;
    std::string words;
  } refused[] = {
      {"\x93NUMPY\x01\x00", PemContent::kCertificates,
       "holds no PEM certificate (a -----BEGIN CERTIFICATE----- block)"},
      {"\x30\x82\x01\x0a", PemContent::kCertificates, "no PEM certificate"},
      {"-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n",
       PemContent::kCertificates, "no PEM certificate"},
      {certificate, PemContent::kPrivateKey,
       "holds no PEM private key (a -----BEGIN ... PRIVATE KEY----- block)"},
      {"-----BEGIN ", PemContent::kPrivateKey, "no PEM private key"},
      // gRPC takes no passphrase.
      {"-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIE\n"
       "-----END ENCRYPTED PRIVATE KEY-----\n",
       PemContent::kPrivateKey,
       "holds an encrypted private key, and gRPC takes no passphrase"},
      {"-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\n"
       "DEK-Info: AES-128-CBC,00\n\nMIIE\n-----END RSA PRIVATE KEY-----\n",
       PemContent::kPrivateKey, "holds an encrypted private key"},
  };
  for (const auto& c : refused) {
    const std::string path = WriteTemp("not.pem", c.content);
    const absl::StatusOr<std::string> read =
        ReadPemFile("--tls_x", path, c.wanted);
    ASSERT_FALSE(read.ok()) << c.words;
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(
        absl::StartsWith(read.status().message(), "--tls_x: \"" + path + "\" "))
        << read.status();
    EXPECT_TRUE(absl::StrContains(read.status().message(), c.words))
        << read.status();
  }
  // What ReadCredentialFile refuses comes first.
  const absl::StatusOr<std::string> missing = ReadPemFile(
      "--tls_x", TempPath("no/such/file"), PemContent::kCertificates);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "No such file"))
      << missing.status();
}

}  // namespace
}  // namespace klserve
