#ifndef KLSERVE_SERVER_METRICS_LOSS_TAGS_H_
#define KLSERVE_SERVER_METRICS_LOSS_TAGS_H_

#include <cstdint>
#include <optional>
#include <string>

namespace klserve::server {

// Where a request's loss belongs in a training job: its run, step, layer and
// microbatch (the API's Tags, which the service reads into this; reporting
// knows no protobuf). Field names follow the API's, so that error messages
// name them as the caller wrote them ("tags.step").
struct LossTags {
  std::string run;  // empty: the request is not aggregated
  std::optional<int64_t> step;
  std::optional<int32_t> layer;
  std::optional<int32_t> microbatch;  // absent: counted as microbatch 0
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_METRICS_LOSS_TAGS_H_
