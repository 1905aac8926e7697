// Writes a fixed set of scalars for read_events_test.py, which reads them
// back with TensorBoard's own reader. Usage:
//   tensorboard_write_sample LOG_DIR [RUN]
// RUN defaults to "sample". Prints the event file's path. The values below
// are mirrored in read_events_test.py; change both together.

#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/tensorboard/tensorboard_writer.h"

namespace {

// 2023-11-14T22:13:20.25Z; point i is stamped i seconds later.
const absl::Time kBaseTime = absl::FromUnixMillis(1700000000250);

struct Point {
  const char* tag;
  int64_t step;
  double value;
};

std::vector<Point> Points() {
  std::vector<Point> points;
  for (int s = 0; s < 10; ++s) points.push_back({"loss/kl", s, 1.0 / (s + 1)});
  for (int s = 0; s < 100; s += 10) {
    points.push_back({"loss/recall", s, s * 0.01});
  }
  const double inf = std::numeric_limits<double>::infinity();
  for (const Point& p : std::vector<Point>{
           {"edge", 0, 0.0},
           {"edge", 1, -0.0},
           {"edge", 2, 1e-45},                  // a float32 denormal
           {"edge", 3, 3.4028234663852886e38},  // FLT_MAX
           {"edge", 4, 1e300},                  // past float range: +inf
           {"edge", 5, -inf},
           {"edge", 6, std::numeric_limits<double>::quiet_NaN()},
           {"edge", int64_t{1} << 40, 0.1},
       }) {
    points.push_back(p);
  }
  return points;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s LOG_DIR [RUN]\n", argv[0]);
    return 2;
  }
  auto writer = klserve::server::TensorBoardWriter::Open(
      argv[1], argc == 3 ? argv[2] : "sample");
  if (!writer.ok()) {
    std::fprintf(stderr, "%s\n", writer.status().ToString().c_str());
    return 1;
  }
  const std::vector<Point> points = Points();
  for (size_t i = 0; i < points.size(); ++i) {
    const absl::Status s = (*writer)->AddScalar(
        points[i].tag, points[i].step, points[i].value,
        kBaseTime + absl::Seconds(static_cast<int64_t>(i)));
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  if (const absl::Status s = (*writer)->Close(); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("%s\n", (*writer)->path().c_str());
  return 0;
}
