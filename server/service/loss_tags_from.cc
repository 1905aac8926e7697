#include "server/service/loss_tags_from.h"

namespace klserve::server {

LossTags LossTagsFrom(const v1::Tags& tags) {
  LossTags out;
  out.run = tags.run();
  if (tags.has_step()) out.step = tags.step();
  if (tags.has_layer()) out.layer = tags.layer();
  if (tags.has_microbatch()) out.microbatch = tags.microbatch();
  return out;
}

}  // namespace klserve::server
