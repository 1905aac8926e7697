#include "client/npy.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/tensor_util.h"
#include "kernels/status_macros.h"

namespace klserve {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr int64_t kMagicBytes = 6;
constexpr int64_t kAlignment = 64;  // NumPy aligns the data to 64 bytes

// The element types klserve reads and writes: the one table of descrs.
struct NpyType {
  absl::string_view descr;
  absl::string_view dtype;  // the wire name
  absl::string_view name;   // for the list of what a reader takes
};

// The first entry for a dtype is the one written. FP64 is written only
// (row_kl); no request input takes it.
constexpr NpyType kNpyTypes[] = {
    {"<f4", "FP32", "float32"},     {"<f2", "FP16", "float16"},
    {"<u2", "BF16", "bfloat16 as"}, {"<i4", "INT32", "int32"},
    {"|b1", "BOOL", "bool"},        {"|u1", "BOOL", "uint8"},
    {"<f8", "FP64", "float64"},
};

// Whether an input whose rule is `rule` is read from `type`.
bool Takes(DTypeRule rule, const NpyType& type) {
  return absl::c_any_of(DTypesOf(rule), [&](DType dtype) {
    return DTypeName(dtype) == type.dtype;
  });
}

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("npy: ", what));
}

// Total header size (magic through the dict's '\n') from the first 12 bytes.
absl::StatusOr<int64_t> HeaderSize(absl::string_view prefix) {
  if (prefix.size() < 10 ||
      prefix.substr(0, kMagicBytes) != absl::string_view(kMagic, kMagicBytes)) {
    return Malformed("not an .npy file (bad magic)");
  }
  const auto major = static_cast<uint8_t>(prefix[6]);
  const auto minor = static_cast<uint8_t>(prefix[7]);
  if (minor != 0 || major < 1 || major > 3) {
    return Malformed(absl::StrCat("unsupported format version ", major, ".",
                                  minor, ", want 1.0, 2.0 or 3.0"));
  }
  const auto byte = [&](int i) {
    return static_cast<int64_t>(static_cast<uint8_t>(prefix[i]));
  };
  if (major == 1) return 10 + (byte(8) | byte(9) << 8);
  if (prefix.size() < 12) return Malformed("truncated header");
  return 12 + (byte(8) | byte(9) << 8 | byte(10) << 16 | byte(11) << 24);
}

// A cursor over the header dict, a Python literal such as
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
class DictParser {
 public:
  explicit DictParser(absl::string_view text) : text_(text) {}

  void SkipSpace() {
    while (pos_ < text_.size() && absl::ascii_isspace(text_[pos_])) ++pos_;
  }

  // Consumes `c` (after blanks) if it is next.
  bool Accept(char c) {
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  absl::StatusOr<std::string> String() {
    SkipSpace();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
      return Malformed("header: expected a quoted string");
    }
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == absl::string_view::npos) {
      return Malformed("header: unterminated string");
    }
    std::string value(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return value;
  }

  absl::StatusOr<bool> Bool() {
    SkipSpace();
    for (const auto& [word, value] :
         {std::pair<absl::string_view, bool>{"True", true}, {"False", false}}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    }
    return Malformed("header: expected True or False");
  }

  // A tuple of non-negative integers: (), (3,), (2, 3).
  absl::StatusOr<std::vector<int64_t>> IntTuple() {
    if (!Accept('(')) return Malformed("header: shape must be a tuple");
    std::vector<int64_t> values;
    while (!Accept(')')) {
      SkipSpace();
      size_t end = pos_;
      while (end < text_.size() && absl::ascii_isdigit(text_[end])) ++end;
      int64_t value = 0;
      if (end == pos_ ||
          !absl::SimpleAtoi(text_.substr(pos_, end - pos_), &value)) {
        return Malformed("header: shape entries must be integers >= 0");
      }
      values.push_back(value);
      pos_ = end;
      if (!Accept(',')) {
        if (!Accept(')')) return Malformed("header: bad shape tuple");
        break;
      }
    }
    return values;
  }

  bool AtEnd() {
    SkipSpace();
    return pos_ == text_.size();
  }

 private:
  absl::string_view text_;
  size_t pos_ = 0;
};

std::string FormatShape(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

absl::StatusOr<absl::string_view> DescrFor(absl::string_view dtype) {
  for (const NpyType& type : kNpyTypes) {
    if (dtype == type.dtype) return type.descr;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("npy: dtype \"", dtype,
                   "\" has no .npy descr (FP32, FP16, BF16, INT32, "
                   "BOOL or FP64)"));
}

// The type of `descr` as NumPy names it ('<f8': float64), or "" when it is
// not a plain number, bool or void of 1 to 2^20 bytes.
std::string NumpyName(absl::string_view descr) {
  constexpr int64_t kMostBytes = int64_t{1} << 20;
  int64_t bytes = 0;
  if (descr.size() < 3 || !absl::StrContains("<>|=", descr[0]) ||
      !std::all_of(descr.begin() + 2, descr.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(descr.substr(2), &bytes) || bytes < 1 ||
      bytes > kMostBytes) {
    return "";
  }
  const std::string bits = absl::StrCat(bytes * 8);
  switch (descr[1]) {
    case 'b':
      return "bool";
    case 'f':
      return "float" + bits;
    case 'i':
      return "int" + bits;
    case 'u':
      return "uint" + bits;
    case 'c':
      return "complex" + bits;
    case 'V':
      return "void" + bits;
  }
  return "";
}

// The entry for `descr` among those `rule` takes (any entry without one).
// Otherwise INVALID_ARGUMENT naming the file's type and what is taken.
absl::StatusOr<const NpyType*> FindNpyType(absl::string_view descr,
                                           std::optional<DTypeRule> rule) {
  std::vector<std::string> wanted;
  bool takes_bf16 = false;
  for (const NpyType& type : kNpyTypes) {
    if (rule && !Takes(*rule, type)) continue;
    if (descr == type.descr) return &type;
    wanted.push_back(absl::StrCat(type.name, " '", type.descr, "'"));
    takes_bf16 |= type.dtype == "BF16";
  }
  const std::string name = NumpyName(descr);
  // Escaped: the file's bytes may hold a NUL or anything else.
  std::string message = absl::StrCat(
      "unsupported descr '", absl::CHexEscape(descr), "'",
      name.empty() ? "" : absl::StrCat(" (", name, ")"), "; want ",
      wanted.size() == 1
          ? wanted.back()
          : absl::StrCat(absl::StrJoin(wanted.begin(), wanted.end() - 1, ", "),
                         " or ", wanted.back()));
  // What np.save writes for an ml_dtypes.bfloat16 array.
  if (takes_bf16 && descr.size() == 3 && descr.substr(1) == "V2") {
    absl::StrAppend(
        &message,
        "; for bfloat16 (ml_dtypes), save the array with .view('<u2')");
  }
  return Malformed(message);
}

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

absl::Status ReadExactly(std::FILE* file, char* dest, int64_t bytes,
                         const std::string& path) {
  if (bytes > 0 &&
      std::fread(dest, 1, bytes, file) != static_cast<size_t>(bytes)) {
    return Malformed(absl::StrCat(path,
                                  ": file is shorter than its header "
                                  "says"));
  }
  return absl::OkStatus();
}

// ParseNpyHeader, taking the descrs `rule` takes (any of kNpyTypes without
// one).
absl::StatusOr<NpyHeader> ParseHeader(absl::string_view file_prefix,
                                      std::optional<DTypeRule> rule) {
  ASSIGN_OR_RETURN(const int64_t header_size, HeaderSize(file_prefix));
  if (static_cast<int64_t>(file_prefix.size()) < header_size) {
    return Malformed("truncated header");
  }
  const int64_t dict_begin = file_prefix[6] == 1 ? 10 : 12;
  absl::string_view dict =
      file_prefix.substr(dict_begin, header_size - dict_begin);
  if (dict.empty() || dict.back() != '\n') {
    return Malformed("header must end with a newline");
  }

  DictParser parser(dict);
  std::string descr;
  std::vector<int64_t> shape;
  bool fortran_order = false;
  bool seen[3] = {false, false, false};
  if (!parser.Accept('{')) return Malformed("header: expected '{'");
  while (!parser.Accept('}')) {
    ASSIGN_OR_RETURN(std::string key, parser.String());
    if (!parser.Accept(':')) return Malformed("header: expected ':'");
    if (key == "descr") {
      ASSIGN_OR_RETURN(descr, parser.String());
      seen[0] = true;
    } else if (key == "fortran_order") {
      ASSIGN_OR_RETURN(fortran_order, parser.Bool());
      seen[1] = true;
    } else if (key == "shape") {
      ASSIGN_OR_RETURN(shape, parser.IntTuple());
      seen[2] = true;
    } else {
      return Malformed(
          absl::StrCat("header: unexpected key '", absl::CHexEscape(key), "'"));
    }
    if (!parser.Accept(',')) {
      if (!parser.Accept('}')) return Malformed("header: expected ',' or '}'");
      break;
    }
  }
  if (!parser.AtEnd()) return Malformed("header: text after the dict");
  if (!seen[0] || !seen[1] || !seen[2]) {
    return Malformed("header: needs descr, fortran_order and shape");
  }
  if (fortran_order) {
    return Malformed(
        "Fortran-order arrays are not supported; save a "
        "C-contiguous array (np.ascontiguousarray)");
  }

  ASSIGN_OR_RETURN(const NpyType* type, FindNpyType(descr, rule));
  NpyHeader header;
  header.dtype = std::string(type->dtype);
  header.shape = std::move(shape);
  header.data_offset = header_size;
  ASSIGN_OR_RETURN(header.data_bytes,
                   ExpectedTensorBytes(header.dtype, header.shape));
  return header;
}

}  // namespace

absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view file_prefix) {
  return ParseHeader(file_prefix, std::nullopt);
}

absl::StatusOr<std::string> EncodeNpyHeader(absl::string_view dtype,
                                            const std::vector<int64_t>& shape) {
  ASSIGN_OR_RETURN(const absl::string_view descr, DescrFor(dtype));
  std::string dict = absl::StrCat(
      "{'descr': '", descr,
      "', 'fortran_order': False, 'shape': ", FormatShape(shape), ", }");
  // 10 bytes of prelude, the dict, spaces, then '\n' at a 64-byte boundary.
  int64_t prelude = 10;
  int64_t total = prelude + dict.size() + 1;
  total = (total + kAlignment - 1) / kAlignment * kAlignment;
  int64_t header_len = total - prelude;
  int major = 1;
  if (header_len > 0xffff) {
    prelude = 12;
    major = 2;
    total =
        (prelude + dict.size() + 1 + kAlignment - 1) / kAlignment * kAlignment;
    header_len = total - prelude;
  }
  std::string out(kMagic, kMagicBytes);
  out.push_back(static_cast<char>(major));
  out.push_back(0);
  for (int i = 0; i < prelude - 8; ++i) {
    out.push_back(static_cast<char>((header_len >> (8 * i)) & 0xff));
  }
  out += dict;
  out.append(total - out.size() - 1, ' ');
  out.push_back('\n');
  return out;
}

absl::StatusOr<v1::Tensor> ParseNpy(absl::string_view file_bytes) {
  ASSIGN_OR_RETURN(NpyHeader header, ParseNpyHeader(file_bytes));
  const int64_t data_bytes = file_bytes.size() - header.data_offset;
  if (data_bytes != header.data_bytes) {
    return Malformed(absl::StrCat("data must be ", header.data_bytes,
                                  " bytes for its header, got ", data_bytes));
  }
  v1::Tensor tensor;
  tensor.set_dtype(header.dtype);
  tensor.mutable_shape()->Assign(header.shape.begin(), header.shape.end());
  tensor.set_data(file_bytes.data() + header.data_offset, data_bytes);
  return tensor;
}

namespace {

// ReadNpy, taking the descrs `rule` takes (any of kNpyTypes without one).
absl::StatusOr<v1::Tensor> ReadNpyFile(const std::string& path,
                                       std::optional<DTypeRule> rule) {
  File file(std::fopen(path.c_str(), "rb"));
  if (file == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open"));
  }
  // A directory opens, and then reads as a file shorter than its header.
  struct stat st;
  if (fstat(fileno(file.get()), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::ErrnoToStatus(EISDIR, absl::StrCat(path, ": cannot read"));
  }
  if (std::fseek(file.get(), 0, SEEK_END) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot seek"));
  }
  const int64_t file_size = std::ftell(file.get());
  std::rewind(file.get());

  // The prelude first (12 bytes covers every version), then the rest of the
  // header, whose length the prelude gives.
  std::string prefix(std::min<int64_t>(file_size, 12), '\0');
  RETURN_IF_ERROR(ReadExactly(file.get(), prefix.data(), prefix.size(), path));
  absl::StatusOr<int64_t> header_size = HeaderSize(prefix);
  if (!header_size.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", header_size.status().message()));
  }
  if (*header_size > file_size) {
    return Malformed(absl::StrCat(path, ": truncated header"));
  }
  const int64_t already = prefix.size();
  prefix.resize(*header_size);
  RETURN_IF_ERROR(ReadExactly(file.get(), prefix.data() + already,
                              *header_size - already, path));
  absl::StatusOr<NpyHeader> header = ParseHeader(prefix, rule);
  if (!header.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", header.status().message()));
  }
  if (file_size - header->data_offset != header->data_bytes) {
    return Malformed(absl::StrCat(path, ": data must be ", header->data_bytes,
                                  " bytes for its header, got ",
                                  file_size - header->data_offset));
  }

  v1::Tensor tensor;
  tensor.set_dtype(header->dtype);
  tensor.mutable_shape()->Assign(header->shape.begin(), header->shape.end());
  std::string* data = tensor.mutable_data();
  data->resize(header->data_bytes);
  RETURN_IF_ERROR(
      ReadExactly(file.get(), data->data(), header->data_bytes, path));
  return tensor;
}

}  // namespace

absl::StatusOr<v1::Tensor> ReadNpy(const std::string& path) {
  return ReadNpyFile(path, std::nullopt);
}

absl::StatusOr<v1::Tensor> ReadNpy(const std::string& path, DTypeRule rule) {
  return ReadNpyFile(path, rule);
}

absl::StatusOr<std::string> SerializeNpy(const v1::Tensor& tensor) {
  RETURN_IF_ERROR(CheckTensorBytes("tensor", tensor));
  ASSIGN_OR_RETURN(std::string out,
                   EncodeNpyHeader(tensor.dtype(), {tensor.shape().begin(),
                                                    tensor.shape().end()}));
  out += tensor.data();
  return out;
}

absl::Status WriteNpy(const std::string& path, const v1::Tensor& tensor) {
  RETURN_IF_ERROR(CheckTensorBytes("tensor", tensor));
  ASSIGN_OR_RETURN(const std::string header,
                   EncodeNpyHeader(tensor.dtype(), {tensor.shape().begin(),
                                                    tensor.shape().end()}));
  File file(std::fopen(path.c_str(), "wb"));
  if (file == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot create"));
  }
  const std::string& data = tensor.data();
  if (std::fwrite(header.data(), 1, header.size(), file.get()) !=
          header.size() ||
      std::fwrite(data.data(), 1, data.size(), file.get()) != data.size() ||
      std::fflush(file.get()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": write failed"));
  }
  return absl::OkStatus();
}

}  // namespace klserve
