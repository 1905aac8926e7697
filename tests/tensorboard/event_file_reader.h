#ifndef KLSERVE_TESTS_TENSORBOARD_EVENT_FILE_READER_H_
#define KLSERVE_TESTS_TENSORBOARD_EVENT_FILE_READER_H_

// A minimal TFRecord + tensorboard.Event reader for the tests, written from
// the format descriptions and sharing no code with server/: its CRC is
// bit-at-a-time and its protobuf parser is a generic field walker.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace klserve::event_reader {

struct ReadValue {
  std::string tag;
  std::optional<float> simple_value;
};

struct ReadEvent {
  std::optional<double> wall_time;
  std::optional<int64_t> step;
  std::optional<std::string> file_version;
  std::optional<std::vector<ReadValue>> summary;
};

// The records of a TFRecord file, both CRCs checked. DATA_LOSS names the
// record and the check that failed, including a torn last record.
absl::StatusOr<std::vector<std::string>> ReadRecords(const std::string& path);

// Decodes one serialised Event; unknown fields are skipped.
absl::StatusOr<ReadEvent> ParseEvent(const std::string& bytes);

// ReadRecords then ParseEvent on each.
absl::StatusOr<std::vector<ReadEvent>> ReadEventFile(const std::string& path);

}  // namespace klserve::event_reader

#endif  // KLSERVE_TESTS_TENSORBOARD_EVENT_FILE_READER_H_
