#include "client/npy.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace klserve {
namespace {

using ::testing::HasSubstr;

v1::Tensor MakeTensor(const std::string& dtype, std::vector<int64_t> shape,
                      int64_t element_bytes) {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  v1::Tensor tensor;
  tensor.set_dtype(dtype);
  tensor.mutable_shape()->Assign(shape.begin(), shape.end());
  std::string data(count * element_bytes, '\0');
  for (size_t i = 0; i < data.size(); ++i) {
    data[i] = static_cast<char>(i * 37 + 11);
  }
  tensor.set_data(data);
  return tensor;
}

// A header as NumPy writes it, for any version, without 64-byte padding
// (readers must not require it).
std::string RawHeader(int major, const std::string& dict) {
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(major));
  out.push_back(0);
  const uint32_t length = dict.size() + 1;
  const int length_bytes = major == 1 ? 2 : 4;
  for (int i = 0; i < length_bytes; ++i) {
    out.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  }
  return out + dict + "\n";
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/klserve_npy_test_",
                      getpid(), "_", name);
}

void ExpectSameTensor(const v1::Tensor& actual, const v1::Tensor& expected) {
  EXPECT_EQ(actual.dtype(), expected.dtype());
  EXPECT_THAT(actual.shape(), ::testing::ElementsAreArray(expected.shape()));
  EXPECT_EQ(actual.data(), expected.data());
}

TEST(NpyHeader, MatchesNumpyByteForByte) {
  // np.save of np.zeros((2, 3), np.float32) writes exactly this header.
  const std::string dict =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  std::string expected = std::string("\x93NUMPY\x01\x00", 8);
  expected.push_back(static_cast<char>(118));  // 128 - 10
  expected.push_back(0);
  expected += dict;
  expected.append(128 - expected.size() - 1, ' ');
  expected += "\n";
  absl::StatusOr<std::string> header = EncodeNpyHeader("FP32", {2, 3});
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(*header, expected);
}

TEST(NpyHeader, PadsDataStartToMultipleOf64) {
  const std::vector<std::vector<int64_t>> shapes = {
      {}, {5}, {2, 3}, {1, 128, 4096, 4096}, {123456789, 987654321, 3}};
  for (const std::string dtype :
       {"FP32", "BF16", "FP16", "INT32", "BOOL", "FP64"}) {
    for (const auto& shape : shapes) {
      absl::StatusOr<std::string> header = EncodeNpyHeader(dtype, shape);
      ASSERT_TRUE(header.ok()) << header.status();
      EXPECT_EQ(header->size() % 64, 0u) << *header;
      EXPECT_EQ(header->back(), '\n');
      absl::StatusOr<NpyHeader> parsed = ParseNpyHeader(*header);
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      EXPECT_EQ(parsed->dtype, dtype);
      EXPECT_EQ(parsed->shape, shape);
      EXPECT_EQ(parsed->data_offset, static_cast<int64_t>(header->size()));
    }
  }
}

TEST(NpyHeader, FormatsOneAndZeroDimShapesAsPython) {
  absl::StatusOr<std::string> one = EncodeNpyHeader("INT32", {7});
  ASSERT_TRUE(one.ok());
  EXPECT_THAT(*one, HasSubstr("'shape': (7,), }"));
  absl::StatusOr<std::string> zero = EncodeNpyHeader("FP64", {});
  ASSERT_TRUE(zero.ok());
  EXPECT_THAT(*zero, HasSubstr("'descr': '<f8'"));
  EXPECT_THAT(*zero, HasSubstr("'shape': (), }"));
}

TEST(NpyHeader, WritesBf16AsUint16AndBoolAsB1) {
  absl::StatusOr<std::string> bf16 = EncodeNpyHeader("BF16", {2});
  ASSERT_TRUE(bf16.ok());
  EXPECT_THAT(*bf16, HasSubstr("'descr': '<u2'"));
  absl::StatusOr<std::string> boolean = EncodeNpyHeader("BOOL", {2});
  ASSERT_TRUE(boolean.ok());
  EXPECT_THAT(*boolean, HasSubstr("'descr': '|b1'"));
}

TEST(NpyHeader, RejectsDtypeWithoutDescr) {
  EXPECT_EQ(EncodeNpyHeader("INT8", {2}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Npy, RoundTripsEveryDtypeInMemory) {
  const struct {
    const char* dtype;
    int64_t bytes;
  } cases[] = {{"FP32", 4},  {"BF16", 2}, {"FP16", 2},
               {"INT32", 4}, {"BOOL", 1}, {"FP64", 8}};
  for (const auto& c : cases) {
    const v1::Tensor tensor = MakeTensor(c.dtype, {3, 1, 5}, c.bytes);
    absl::StatusOr<std::string> image = SerializeNpy(tensor);
    ASSERT_TRUE(image.ok()) << image.status();
    absl::StatusOr<v1::Tensor> back = ParseNpy(*image);
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSameTensor(*back, tensor);
  }
}

TEST(Npy, RoundTripsThroughFile) {
  const v1::Tensor tensor = MakeTensor("FP32", {4, 33, 7}, 4);
  const std::string path = TempPath("round_trip.npy");
  ASSERT_TRUE(WriteNpy(path, tensor).ok());
  absl::StatusOr<v1::Tensor> back = ReadNpy(path);
  std::remove(path.c_str());
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameTensor(*back, tensor);
}

TEST(Npy, RoundTripsZeroDimTensor) {
  const v1::Tensor tensor = MakeTensor("FP64", {}, 8);
  absl::StatusOr<std::string> image = SerializeNpy(tensor);
  ASSERT_TRUE(image.ok());
  absl::StatusOr<v1::Tensor> back = ParseNpy(*image);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameTensor(*back, tensor);
}

TEST(Npy, ReadsVersions2And3) {
  for (int major : {2, 3}) {
    const std::string image =
        RawHeader(major,
                  "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }") +
        std::string("\x01\x00\x00\x00\xff\xff\xff\xff", 8);
    absl::StatusOr<v1::Tensor> tensor = ParseNpy(image);
    ASSERT_TRUE(tensor.ok()) << tensor.status();
    EXPECT_EQ(tensor->dtype(), "INT32");
    EXPECT_THAT(tensor->shape(), ::testing::ElementsAre(2));
    EXPECT_EQ(tensor->data().size(), 8u);
  }
}

TEST(Npy, ReadsUint8AsBoolAndToleratesKeyOrderAndSpacing) {
  const std::string image =
      RawHeader(1, "{ \"shape\":(3 , ) ,'fortran_order':False,'descr':'|u1'}") +
      std::string("\x00\x01\x02", 3);
  absl::StatusOr<v1::Tensor> tensor = ParseNpy(image);
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_EQ(tensor->dtype(), "BOOL");
  EXPECT_THAT(tensor->shape(), ::testing::ElementsAre(3));
}

TEST(Npy, WriteRejectsDataSizeMismatch) {
  v1::Tensor tensor = MakeTensor("FP32", {2, 2}, 4);
  tensor.mutable_data()->pop_back();
  absl::Status status = WriteNpy(TempPath("bad.npy"), tensor);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("data must be 16"));
}

TEST(Npy, ReadMissingFileIsNotFound) {
  EXPECT_EQ(ReadNpy(TempPath("does_not_exist.npy")).status().code(),
            absl::StatusCode::kNotFound);
}

struct MalformedCase {
  const char* name;
  std::string image;
  const char* message;
};

TEST(Npy, RejectsMalformedFiles) {
  const std::string good_dict =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  const std::string data(8, '\0');
  std::string bad_version = RawHeader(1, good_dict) + data;
  bad_version[6] = 4;
  std::string no_newline = RawHeader(1, good_dict) + data;
  no_newline[9 + 1 + good_dict.size()] = ' ';
  const std::vector<MalformedCase> cases = {
      {"empty", "", "bad magic"},
      {"bad magic", "\x93NUMPZ\x01\x00\x10\x00" + good_dict, "bad magic"},
      {"bad version", bad_version, "version 4.0"},
      {"truncated header", RawHeader(1, good_dict).substr(0, 30),
       "truncated header"},
      {"no newline", no_newline, "newline"},
      {"fortran order",
       RawHeader(1,
                 "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }") +
           data,
       "Fortran"},
      {"big endian",
       RawHeader(1,
                 "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }") +
           data,
       "unsupported descr '>f4'"},
      {"int64",
       RawHeader(1,
                 "{'descr': '<i8', 'fortran_order': False, 'shape': (1,), }") +
           data,
       "unsupported descr '<i8'"},
      {"structured",
       RawHeader(1,
                 "{'descr': [('a', '<f4')], 'fortran_order': False, "
                 "'shape': (2,), }") +
           data,
       "quoted string"},
      {"missing shape",
       RawHeader(1, "{'descr': '<f4', 'fortran_order': False, }") + data,
       "needs descr"},
      {"unknown key",
       RawHeader(1,
                 "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), "
                 "'x': 1}") +
           data,
       "unexpected key 'x'"},
      {"negative dim",
       RawHeader(1,
                 "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), "
                 "}") +
           data,
       "integers >= 0"},
      {"not a dict", RawHeader(1, "hello") + data, "expected '{'"},
      {"text after dict", RawHeader(1, good_dict + " x") + data,
       "text after the dict"},
      {"short data", RawHeader(1, good_dict) + data.substr(1),
       "data must be 8 bytes"},
      {"long data", RawHeader(1, good_dict) + data + "x",
       "data must be 8 bytes"},
      {"empty descr",
       RawHeader(1, "{'descr': '', 'fortran_order': False, 'shape': (2,), }") +
           data,
       "unsupported descr ''"},
      {"NUL in descr",
       RawHeader(1, std::string("{'descr': '<f4") + '\0' +
                        "x', 'fortran_order': False, 'shape': (2,), }") +
           data,
       "unsupported descr '<f4\\x00x'"},
      {"negative size",
       RawHeader(1,
                 "{'descr': '<f-4', 'fortran_order': "
                 "False, 'shape': (2,), }") +
           data,
       "unsupported descr '<f-4'; want"},
      {"size past int64",
       RawHeader(1,
                 "{'descr': '<f99999999999999999999', 'fortran_order': "
                 "False, 'shape': (2,), }") +
           data,
       "unsupported descr '<f99999999999999999999'; want"},
      {"size whose bits overflow",
       RawHeader(1,
                 "{'descr': '<f2305843009213693952', 'fortran_order': "
                 "False, 'shape': (2,), }") +
           data,
       "unsupported descr '<f2305843009213693952'; want"},
      {"key not ASCII",
       RawHeader(1,
                 "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), "
                 "'\xff\xfe': 1}") +
           data,
       "unexpected key '\\xff\\xfe'"},
      {"overflowing shape",
       RawHeader(1,
                 "{'descr': '<f4', 'fortran_order': False, "
                 "'shape': (4294967296, 4294967296), }"),
       "overflows"},
  };
  for (const MalformedCase& c : cases) {
    absl::StatusOr<v1::Tensor> tensor = ParseNpy(c.image);
    EXPECT_EQ(tensor.status().code(), absl::StatusCode::kInvalidArgument)
        << c.name;
    EXPECT_THAT(std::string(tensor.status().message()), HasSubstr(c.message))
        << c.name;
  }
}

// A directory opens, and had read as a file shorter than its header said.
TEST(Npy, ReadNpyOfADirectorySaysSo) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = dir != nullptr ? dir : "/tmp";
  absl::StatusOr<v1::Tensor> read = ReadNpy(path);
  EXPECT_FALSE(read.ok());
  EXPECT_THAT(std::string(read.status().message()),
              HasSubstr(path + ": cannot read: Is a directory"));
}

TEST(Npy, ReadNpyRejectsTruncatedFile) {
  const v1::Tensor tensor = MakeTensor("FP32", {8}, 4);
  absl::StatusOr<std::string> image = SerializeNpy(tensor);
  ASSERT_TRUE(image.ok());
  const std::string path = TempPath("truncated.npy");
  std::FILE* file = std::fopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr);
  std::fwrite(image->data(), 1, image->size() - 3, file);
  std::fclose(file);
  absl::StatusOr<v1::Tensor> back = ReadNpy(path);
  std::remove(path.c_str());
  EXPECT_EQ(back.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(back.status().message()), HasSubstr(path));
}

}  // namespace
}  // namespace klserve
