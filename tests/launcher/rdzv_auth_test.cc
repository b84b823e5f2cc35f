#include "launcher/rdzv_auth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace muster {
namespace {

using ::testing::HasSubstr;

AuthFacts Facts(RdzvAuth asked, bool token_file, bool in_slurm, bool socket) {
  AuthFacts facts;
  facts.asked = asked;
  facts.token_file = token_file;
  facts.in_slurm = in_slurm;
  facts.munge_socket_present = socket;
  facts.munge_socket = "/run/munge/munge.socket.2";
  return facts;
}

TEST(ChooseRdzvAuthTest, InsideSlurmWithMungedMungeNeedsNoFlag) {
  EXPECT_EQ(*ChooseRdzvAuth(Facts(RdzvAuth::kAuto, false, true, true)), RdzvAuth::kMunge);
}

TEST(ChooseRdzvAuthTest, ATokenFileAlwaysWinsOverMunge) {
  EXPECT_EQ(*ChooseRdzvAuth(Facts(RdzvAuth::kAuto, true, true, true)), RdzvAuth::kToken);
  EXPECT_EQ(*ChooseRdzvAuth(Facts(RdzvAuth::kAuto, true, false, false)), RdzvAuth::kToken);
}

TEST(ChooseRdzvAuthTest, OutsideSlurmOrWithoutMungedItIsNoneAsBefore) {
  EXPECT_EQ(*ChooseRdzvAuth(Facts(RdzvAuth::kAuto, false, false, true)), RdzvAuth::kNone);
  EXPECT_EQ(*ChooseRdzvAuth(Facts(RdzvAuth::kAuto, false, true, false)), RdzvAuth::kNone);
}

TEST(ChooseRdzvAuthTest, AnExplicitChoiceIsTaken) {
  EXPECT_EQ(*ChooseRdzvAuth(Facts(RdzvAuth::kNone, false, true, true)), RdzvAuth::kNone);
  EXPECT_EQ(*ChooseRdzvAuth(Facts(RdzvAuth::kMunge, false, false, true)), RdzvAuth::kMunge);
  EXPECT_EQ(*ChooseRdzvAuth(Facts(RdzvAuth::kToken, true, true, true)), RdzvAuth::kToken);
}

TEST(ChooseRdzvAuthTest, ExplicitMungeWithoutMungedNamesTheSocket) {
  absl::StatusOr<RdzvAuth> auth = ChooseRdzvAuth(Facts(RdzvAuth::kMunge, false, true, false));
  EXPECT_TRUE(absl::IsInvalidArgument(auth.status()));
  EXPECT_THAT(auth.status().message(), HasSubstr("/run/munge/munge.socket.2"));
}

TEST(ChooseRdzvAuthTest, ContradictionsAreRefused) {
  EXPECT_THAT(ChooseRdzvAuth(Facts(RdzvAuth::kToken, false, true, true)).status().message(),
              HasSubstr("token_file=PATH"));
  EXPECT_THAT(ChooseRdzvAuth(Facts(RdzvAuth::kNone, true, true, true)).status().message(),
              HasSubstr("contradict"));
  EXPECT_THAT(ChooseRdzvAuth(Facts(RdzvAuth::kMunge, true, true, true)).status().message(),
              HasSubstr("contradict"));
}

}  // namespace
}  // namespace muster
