#include "tests/tensorboard/event_file_reader.h"

#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace klserve::event_reader {
namespace {

uint32_t BitwiseMaskedCrc32c(absl::string_view s) {
  uint32_t c = 0xffffffffu;
  for (char ch : s) {
    c ^= static_cast<uint8_t>(ch);
    for (int bit = 0; bit < 8; ++bit) c = (c >> 1) ^ ((c & 1u) * 0x82F63B78u);
  }
  c = ~c;
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

uint64_t LoadLe(absl::string_view s, size_t offset, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= uint64_t{static_cast<uint8_t>(s[offset + i])} << (8 * i);
  }
  return v;
}

// Walks protobuf fields one at a time.
class FieldReader {
 public:
  explicit FieldReader(absl::string_view bytes) : rest_(bytes) {}

  bool done() const { return rest_.empty(); }

  absl::Status Next(uint32_t* field, uint32_t* wire_type) {
    uint64_t key;
    if (!ReadVarint(&key)) return Malformed("field key");
    *field = static_cast<uint32_t>(key >> 3);
    *wire_type = static_cast<uint32_t>(key & 7);
    if (*field == 0) return Malformed("field number 0");
    return absl::OkStatus();
  }

  absl::Status Varint(uint64_t* v) {
    return ReadVarint(v) ? absl::OkStatus() : Malformed("varint");
  }

  absl::Status Fixed(int bytes, uint64_t* v) {
    if (rest_.size() < static_cast<size_t>(bytes)) return Malformed("fixed");
    *v = LoadLe(rest_, 0, bytes);
    rest_.remove_prefix(bytes);
    return absl::OkStatus();
  }

  absl::Status LengthDelimited(absl::string_view* out) {
    uint64_t n;
    if (!ReadVarint(&n) || n > rest_.size()) return Malformed("length");
    *out = rest_.substr(0, n);
    rest_.remove_prefix(n);
    return absl::OkStatus();
  }

  absl::Status Skip(uint32_t wire_type) {
    uint64_t ignored;
    absl::string_view ignored_bytes;
    switch (wire_type) {
      case 0:
        return Varint(&ignored);
      case 1:
        return Fixed(8, &ignored);
      case 2:
        return LengthDelimited(&ignored_bytes);
      case 5:
        return Fixed(4, &ignored);
      default:
        return Malformed("wire type");
    }
  }

 private:
  bool ReadVarint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64 && !rest_.empty(); shift += 7) {
      const auto b = static_cast<uint8_t>(rest_[0]);
      rest_.remove_prefix(1);
      *v |= uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }

  static absl::Status Malformed(absl::string_view what) {
    return absl::DataLossError(absl::StrCat("malformed protobuf: ", what));
  }

  absl::string_view rest_;
};

absl::Status ExpectWireType(uint32_t field, uint32_t got, uint32_t want) {
  if (got == want) return absl::OkStatus();
  return absl::DataLossError(
      absl::StrCat("field ", field, ": wire type ", got, ", expected ", want));
}

absl::StatusOr<ReadValue> ParseValue(absl::string_view bytes) {
  ReadValue value;
  FieldReader r(bytes);
  while (!r.done()) {
    uint32_t field = 0, type = 0;
    if (absl::Status s = r.Next(&field, &type); !s.ok()) return s;
    absl::Status s;
    if (field == 1) {  // tag
      absl::string_view tag;
      s = ExpectWireType(field, type, 2);
      if (s.ok()) s = r.LengthDelimited(&tag);
      value.tag = std::string(tag);
    } else if (field == 2) {  // simple_value
      uint64_t bits = 0;
      s = ExpectWireType(field, type, 5);
      if (s.ok()) s = r.Fixed(4, &bits);
      const auto bits32 = static_cast<uint32_t>(bits);
      float f;
      std::memcpy(&f, &bits32, sizeof(f));
      value.simple_value = f;
    } else {
      s = r.Skip(type);
    }
    if (!s.ok()) return s;
  }
  return value;
}

absl::StatusOr<std::vector<ReadValue>> ParseSummary(absl::string_view bytes) {
  std::vector<ReadValue> values;
  FieldReader r(bytes);
  while (!r.done()) {
    uint32_t field = 0, type = 0;
    if (absl::Status s = r.Next(&field, &type); !s.ok()) return s;
    if (field != 1) {
      if (absl::Status s = r.Skip(type); !s.ok()) return s;
      continue;
    }
    absl::string_view value_bytes;
    if (absl::Status s = ExpectWireType(field, type, 2); !s.ok()) return s;
    if (absl::Status s = r.LengthDelimited(&value_bytes); !s.ok()) return s;
    absl::StatusOr<ReadValue> value = ParseValue(value_bytes);
    if (!value.ok()) return value.status();
    values.push_back(*std::move(value));
  }
  return values;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ReadRecords(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  const std::string file((std::istreambuf_iterator<char>(in)),
                         std::istreambuf_iterator<char>());
  std::vector<std::string> records;
  size_t pos = 0;
  while (pos < file.size()) {
    const std::string where =
        absl::StrCat(path, " record ", records.size(), " at byte ", pos);
    if (file.size() - pos < 12) {
      return absl::DataLossError(absl::StrCat(where, ": torn header"));
    }
    const absl::string_view view(file);
    const uint64_t length = LoadLe(view, pos, 8);
    if (LoadLe(view, pos + 8, 4) != BitwiseMaskedCrc32c(view.substr(pos, 8))) {
      return absl::DataLossError(absl::StrCat(where, ": length CRC"));
    }
    pos += 12;
    if (file.size() - pos < 4 || file.size() - pos - 4 < length) {
      return absl::DataLossError(absl::StrCat(where, ": torn data"));
    }
    const absl::string_view data = view.substr(pos, length);
    if (LoadLe(view, pos + length, 4) != BitwiseMaskedCrc32c(data)) {
      return absl::DataLossError(absl::StrCat(where, ": data CRC"));
    }
    records.emplace_back(data);
    pos += length + 4;
  }
  return records;
}

absl::StatusOr<ReadEvent> ParseEvent(const std::string& bytes) {
  ReadEvent event;
  FieldReader r(bytes);
  while (!r.done()) {
    uint32_t field = 0, type = 0;
    if (absl::Status s = r.Next(&field, &type); !s.ok()) return s;
    absl::Status s;
    if (field == 1) {  // wall_time, double
      uint64_t bits = 0;
      s = ExpectWireType(field, type, 1);
      if (s.ok()) s = r.Fixed(8, &bits);
      double d;
      std::memcpy(&d, &bits, sizeof(d));
      event.wall_time = d;
    } else if (field == 2) {  // step, int64
      uint64_t v = 0;
      s = ExpectWireType(field, type, 0);
      if (s.ok()) s = r.Varint(&v);
      event.step = static_cast<int64_t>(v);
    } else if (field == 3) {  // file_version
      absl::string_view version;
      s = ExpectWireType(field, type, 2);
      if (s.ok()) s = r.LengthDelimited(&version);
      event.file_version = std::string(version);
    } else if (field == 5) {  // summary
      absl::string_view summary;
      s = ExpectWireType(field, type, 2);
      if (s.ok()) s = r.LengthDelimited(&summary);
      if (s.ok()) {
        absl::StatusOr<std::vector<ReadValue>> values = ParseSummary(summary);
        if (!values.ok()) return values.status();
        event.summary = *std::move(values);
      }
    } else {
      s = r.Skip(type);
    }
    if (!s.ok()) return s;
  }
  return event;
}

absl::StatusOr<std::vector<ReadEvent>> ReadEventFile(const std::string& path) {
  absl::StatusOr<std::vector<std::string>> records = ReadRecords(path);
  if (!records.ok()) return records.status();
  std::vector<ReadEvent> events;
  for (const std::string& record : *records) {
    absl::StatusOr<ReadEvent> event = ParseEvent(record);
    if (!event.ok()) return event.status();
    events.push_back(*std::move(event));
  }
  return events;
}

}  // namespace klserve::event_reader
