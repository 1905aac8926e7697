#ifndef KLSERVE_TESTS_INTEGRATION_RAW_HTTP2_H_
#define KLSERVE_TESTS_INTEGRATION_RAW_HTTP2_H_

// A bare HTTP/2 client on a TCP socket, for what gRPC's own client never
// sends: calls that stop after their headers, messages cut short, streams
// opened and reset at once, more streams than the server allows. It speaks
// just enough HTTP/2 for that: the preface, SETTINGS and PING answers,
// HEADERS (HPACK literals, no compression), DATA and RST_STREAM. It reads
// frames but not what the server's headers say (that needs an HPACK
// decoder): tests learn how a call ended from the frame that ended it, and
// check status codes with gRPC's own client.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace klserve::integration {

class RawHttp2 {
 public:
  // How a stream ended, as far as the frames tell.
  struct StreamEnd {
    bool ended = false;
    bool reset = false;        // by RST_STREAM (else END_STREAM)
    uint32_t reset_code = 0;   // its HTTP/2 error code
    bool got_headers = false;  // any HEADERS frame from the server
  };

  // Connects to 127.0.0.1:`port` and sends the preface and SETTINGS.
  static absl::StatusOr<std::unique_ptr<RawHttp2>> Connect(int port);
  ~RawHttp2();
  RawHttp2(const RawHttp2&) = delete;
  RawHttp2& operator=(const RawHttp2&) = delete;

  // Opens a gRPC call to `path` (e.g. "/klserve.v1.IndexerKl/ComputeLoss")
  // with `metadata` added; returns its stream id.
  absl::StatusOr<uint32_t> OpenCall(
      absl::string_view path,
      const std::vector<std::pair<std::string, std::string>>& metadata = {});
  // DATA on `stream`: a gRPC message prefix saying `declared_bytes`, then
  // `bytes` (fewer than declared leaves the message unfinished).
  absl::Status SendMessage(uint32_t stream, absl::string_view bytes,
                           uint32_t declared_bytes, bool end_stream);
  absl::Status Reset(uint32_t stream);

  // Reads frames for up to `timeout` (answering SETTINGS and PING), or
  // until `stream` has ended when it is not 0.
  absl::Status Pump(absl::Duration timeout, uint32_t stream = 0);

  StreamEnd end(uint32_t stream) const;
  // Streams ended by the server so far.
  int ended_streams() const;
  bool got_goaway() const { return goaway_; }
  // SETTINGS_MAX_CONCURRENT_STREAMS as the server announced it; 0 if not.
  uint32_t max_concurrent_streams() const { return max_concurrent_streams_; }
  bool closed() const { return closed_; }

 private:
  explicit RawHttp2(int fd) : fd_(fd) {}
  absl::Status Write(absl::string_view bytes);
  absl::Status WriteFrame(uint8_t type, uint8_t flags, uint32_t stream,
                          absl::string_view payload);
  // Reads one frame if one arrives before `deadline`; false on timeout.
  absl::StatusOr<bool> ReadFrame(absl::Time deadline);

  int fd_;
  uint32_t next_stream_ = 1;
  std::string in_;  // bytes read, not yet a whole frame
  std::map<uint32_t, StreamEnd> streams_;
  bool goaway_ = false;
  uint32_t max_concurrent_streams_ = 0;
  bool closed_ = false;
};

}  // namespace klserve::integration

#endif  // KLSERVE_TESTS_INTEGRATION_RAW_HTTP2_H_
