#ifndef KLSERVE_SERVER_SERVICE_LOSS_TAGS_FROM_H_
#define KLSERVE_SERVER_SERVICE_LOSS_TAGS_FROM_H_

#include "klserve/v1/klserve.pb.h"
#include "server/metrics/loss_tags.h"

namespace klserve::server {

// A request's tags as the reporting takes them (unset optional fields stay
// unset).
LossTags LossTagsFrom(const v1::Tags& tags);

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_LOSS_TAGS_FROM_H_
