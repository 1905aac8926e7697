#include "tests/integration/raw_http2.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace klserve::integration {
namespace {

// Frame types and flags (RFC 9113, section 6).
constexpr uint8_t kData = 0x0, kHeaders = 0x1, kRstStream = 0x3,
                  kSettings = 0x4, kPing = 0x6, kGoaway = 0x7;
constexpr uint8_t kEndStream = 0x1, kAck = 0x1, kEndHeaders = 0x4;
// The most payload a frame may carry before SETTINGS say otherwise.
constexpr size_t kMaxFrame = 16384;

void PutUint32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) {
    out.push_back(static_cast<char>((v >> shift) & 0xff));
  }
}

uint32_t GetUint32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return (uint32_t{u[0]} << 24) | (uint32_t{u[1]} << 16) |
         (uint32_t{u[2]} << 8) | u[3];
}

// The payload length of the frame `bytes` start with (its first 3 bytes).
size_t FrameLength(const std::string& bytes) {
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  return (size_t{u[0]} << 16) | (size_t{u[1]} << 8) | u[2];
}

// An HPACK integer with a 7-bit prefix (RFC 7541, 5.1), no Huffman flag.
void PutHpackLength(std::string& out, size_t n) {
  if (n < 127) {
    out.push_back(static_cast<char>(n));
    return;
  }
  out.push_back(static_cast<char>(127));
  n -= 127;
  while (n >= 128) {
    out.push_back(static_cast<char>((n & 0x7f) | 0x80));
    n >>= 7;
  }
  out.push_back(static_cast<char>(n));
}

// "Literal header field without indexing, new name" (RFC 7541, 6.2.2).
void PutHeader(std::string& out, absl::string_view name,
               absl::string_view value) {
  out.push_back(0);
  PutHpackLength(out, name.size());
  out.append(name.data(), name.size());
  PutHpackLength(out, value.size());
  out.append(value.data(), value.size());
}

}  // namespace

absl::StatusOr<std::unique_ptr<RawHttp2>> RawHttp2::Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError(strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const std::string error = strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect: ", error));
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::unique_ptr<RawHttp2> h2(new RawHttp2(fd));
  if (absl::Status s = h2->Write("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"); !s.ok()) {
    return s;
  }
  if (absl::Status s = h2->WriteFrame(kSettings, 0, 0, ""); !s.ok()) return s;
  return h2;
}

RawHttp2::~RawHttp2() { close(fd_); }

absl::Status RawHttp2::Write(absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      closed_ = true;
      return absl::UnavailableError(absl::StrCat("send: ", strerror(errno)));
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status RawHttp2::WriteFrame(uint8_t type, uint8_t flags, uint32_t stream,
                                  absl::string_view payload) {
  std::string frame;
  const auto length = static_cast<uint32_t>(payload.size());
  frame.push_back(static_cast<char>((length >> 16) & 0xff));
  frame.push_back(static_cast<char>((length >> 8) & 0xff));
  frame.push_back(static_cast<char>(length & 0xff));
  frame.push_back(static_cast<char>(type));
  frame.push_back(static_cast<char>(flags));
  PutUint32(frame, stream & 0x7fffffff);
  frame.append(payload.data(), payload.size());
  return Write(frame);
}

absl::StatusOr<uint32_t> RawHttp2::OpenCall(
    absl::string_view path,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::string block;
  PutHeader(block, ":method", "POST");
  PutHeader(block, ":scheme", "http");
  PutHeader(block, ":path", path);
  PutHeader(block, ":authority", "127.0.0.1");
  PutHeader(block, "content-type", "application/grpc");
  PutHeader(block, "te", "trailers");
  for (const auto& [name, value] : metadata) PutHeader(block, name, value);
  const uint32_t stream = next_stream_;
  next_stream_ += 2;
  if (absl::Status s = WriteFrame(kHeaders, kEndHeaders, stream, block);
      !s.ok()) {
    return s;
  }
  streams_[stream];
  return stream;
}

absl::Status RawHttp2::SendMessage(uint32_t stream, absl::string_view bytes,
                                   uint32_t declared_bytes, bool end_stream) {
  std::string data(1, '\0');  // not compressed
  PutUint32(data, declared_bytes);
  data.append(bytes.data(), bytes.size());
  absl::string_view rest = data;
  do {
    const absl::string_view chunk = rest.substr(0, kMaxFrame);
    rest.remove_prefix(chunk.size());
    const uint8_t flags = rest.empty() && end_stream ? kEndStream : 0;
    if (absl::Status s = WriteFrame(kData, flags, stream, chunk); !s.ok()) {
      return s;
    }
  } while (!rest.empty());
  return absl::OkStatus();
}

absl::Status RawHttp2::Reset(uint32_t stream) {
  std::string code;
  PutUint32(code, 0x8);  // CANCEL
  return WriteFrame(kRstStream, 0, stream, code);
}

absl::StatusOr<bool> RawHttp2::ReadFrame(absl::Time deadline) {
  while (in_.size() < 9 || in_.size() < 9 + FrameLength(in_)) {
    if (closed_) return false;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd p{fd_, POLLIN, 0};
    const int ready =
        poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", strerror(errno)));
    }
    if (ready <= 0) continue;
    char buffer[65536];
    const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
    if (n <= 0) {
      closed_ = true;
      return false;
    }
    in_.append(buffer, static_cast<size_t>(n));
  }
  const size_t length = FrameLength(in_);
  const auto type = static_cast<uint8_t>(in_[3]);
  const auto flags = static_cast<uint8_t>(in_[4]);
  const uint32_t stream = GetUint32(in_.data() + 5) & 0x7fffffff;
  const std::string payload = in_.substr(9, length);
  in_.erase(0, 9 + length);
  switch (type) {
    case kSettings:
      // Six bytes per setting: a 16-bit id, a 32-bit value.
      for (size_t i = 0; !(flags & kAck) && i + 6 <= payload.size(); i += 6) {
        const auto id = static_cast<uint16_t>(
            (static_cast<unsigned char>(payload[i]) << 8) |
            static_cast<unsigned char>(payload[i + 1]));
        if (id == 0x3) max_concurrent_streams_ = GetUint32(&payload[i + 2]);
      }
      if (!(flags & kAck)) {
        if (absl::Status s = WriteFrame(kSettings, kAck, 0, ""); !s.ok()) {
          return s;
        }
      }
      break;
    case kPing:
      if (!(flags & kAck)) {
        if (absl::Status s = WriteFrame(kPing, kAck, 0, payload); !s.ok()) {
          return s;
        }
      }
      break;
    case kGoaway:
      goaway_ = true;
      break;
    case kHeaders:
    case kData: {
      StreamEnd& end = streams_[stream];
      if (type == kHeaders) end.got_headers = true;
      if (flags & kEndStream) end.ended = true;
      break;
    }
    case kRstStream: {
      StreamEnd& end = streams_[stream];
      end.ended = end.reset = true;
      end.reset_code = payload.size() >= 4 ? GetUint32(payload.data()) : 0;
      break;
    }
    default:
      break;
  }
  return true;
}

absl::Status RawHttp2::Pump(absl::Duration timeout, uint32_t stream) {
  const absl::Time deadline = absl::Now() + timeout;
  while (stream == 0 || !end(stream).ended) {
    absl::StatusOr<bool> read = ReadFrame(deadline);
    if (!read.ok()) return read.status();
    if (!*read) break;
  }
  return absl::OkStatus();
}

RawHttp2::StreamEnd RawHttp2::end(uint32_t stream) const {
  const auto it = streams_.find(stream);
  return it == streams_.end() ? StreamEnd() : it->second;
}

int RawHttp2::ended_streams() const {
  int n = 0;
  for (const auto& [id, end] : streams_) n += end.ended ? 1 : 0;
  return n;
}

}  // namespace klserve::integration
