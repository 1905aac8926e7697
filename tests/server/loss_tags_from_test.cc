// The API's Tags as the reporting takes them: set fields carried over,
// unset optional ones left unset (an unset step is refused downstream, an
// unset layer is the untagged layer, so 0 would be wrong for both).

#include "server/service/loss_tags_from.h"

#include <gtest/gtest.h>

namespace klserve::server {
namespace {

TEST(LossTagsFromTest, CarriesSetFields) {
  v1::Tags tags;
  tags.set_run("exp/seed_1");
  tags.set_step(int64_t{1} << 40);
  tags.set_layer(60);
  tags.set_microbatch(7);
  const LossTags out = LossTagsFrom(tags);
  EXPECT_EQ(out.run, "exp/seed_1");
  EXPECT_EQ(out.step, std::optional<int64_t>(int64_t{1} << 40));
  EXPECT_EQ(out.layer, std::optional<int32_t>(60));
  EXPECT_EQ(out.microbatch, 7);
}

TEST(LossTagsFromTest, UnsetFieldsStayUnset) {
  v1::Tags tags;
  tags.set_run("r");
  LossTags out = LossTagsFrom(tags);
  EXPECT_EQ(out.run, "r");
  EXPECT_FALSE(out.step.has_value());
  EXPECT_FALSE(out.layer.has_value());
  EXPECT_FALSE(out.microbatch.has_value());
  // Zero is a value, not an absence.
  tags.set_step(0);
  tags.set_layer(0);
  out = LossTagsFrom(tags);
  EXPECT_EQ(out.step, std::optional<int64_t>(0));
  EXPECT_EQ(out.layer, std::optional<int32_t>(0));
  EXPECT_TRUE(LossTagsFrom(v1::Tags()).run.empty());
}

}  // namespace
}  // namespace klserve::server
