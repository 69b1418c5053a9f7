#include <catch2/catch.hpp>

#include "bnfold/ir/model.h"
#include "bnfold/rewrite/pre_activation_statistics.h"
#include "test_support.h"

using namespace bnfold;
using bnfold::test::parseModel;

namespace {

const char* kOneConv = R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2,4,4] x) => (float[1,2,4,4] y)
<float[2,2,1,1] w = {1, 0, 0, 1}>
{
  y = Conv (x, w)
}
)";

ChannelStatistics twoChannels() { return {{1.0, 2.0}, {0.5, -0.5}, "bn"}; }

}  // namespace

TEST_CASE("statistics are kept and rescaled while recording, and not at all otherwise", "[rewrite][statistics]") {
  auto model = parseModel(kOneConv);
  const Node& conv = *model->graph().findLocal("y")->producer();

  PreActivationStatistics recording;
  CHECK(recording.recording());
  recording.record(conv, twoChannels());
  recording.divideChannels(conv, {2.0, 4.0});
  const ChannelStatistics* kept = recording.find(conv);
  REQUIRE(kept);
  CHECK(kept->gamma == std::vector<double>{0.5, 0.5});
  CHECK(kept->beta == std::vector<double>{0.25, -0.125});
  recording.nodeWillChange(conv);  // a change outside a rewrite drops the entry
  CHECK_FALSE(recording.find(conv));

  PreActivationStatistics idle(/*recording=*/false);
  CHECK_FALSE(idle.recording());
  idle.record(conv, twoChannels());
  idle.divideChannels(conv, {2.0, 4.0});
  CHECK_FALSE(idle.find(conv));
}
