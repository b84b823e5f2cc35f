#include "agent/error_file.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace muster {
namespace {

absl::Time Epoch(double seconds) { return absl::UnixEpoch() + absl::Seconds(seconds); }

// What PyTorch 1.13's ErrorHandler.record_exception wrote (script path shortened) for
// `raise RuntimeError("boom\nsecond line")` in an @record main (Python 3.11).
constexpr char kTorch113[] =
    R"({"message": {"message": "RuntimeError: boom\nsecond line", "extraInfo": {"py_callstack": )"
    R"("Traceback (most recent call last):\n  File \"/usr/lib/python3/dist-packages/torch/)"
    R"(distributed/elastic/multiprocessing/errors/__init__.py\", line 346, in wrapper\n    )"
    R"(return f(*args, **kwargs)\n           ^^^^^^^^^^^^^^^^^^\n  File \"/tmp/t.py\", line 4, )"
    R"(in main\n    raise RuntimeError(\"boom\\nsecond line\")\nRuntimeError: boom\nsecond line\n", )"
    R"("timestamp": "1796229363"}}})";

TEST(ParseErrorJsonTest, ReadsPyTorch113Format) {
  absl::StatusOr<WorkerError> error = ParseErrorJson(kTorch113);
  ASSERT_TRUE(error.ok()) << error.status();
  EXPECT_EQ(error->message, "RuntimeError: boom\nsecond line");
  EXPECT_EQ(
      error->traceback,
      "Traceback (most recent call last):\n"
      "  File \"/usr/lib/python3/dist-packages/torch/distributed/elastic/multiprocessing/errors/"
      "__init__.py\", line 346, in wrapper\n"
      "    return f(*args, **kwargs)\n"
      "           ^^^^^^^^^^^^^^^^^^\n"
      "  File \"/tmp/t.py\", line 4, in main\n"
      "    raise RuntimeError(\"boom\\nsecond line\")\n"
      "RuntimeError: boom\nsecond line\n");
  EXPECT_EQ(error->timestamp, Epoch(1796229363));
}

TEST(ParseErrorJsonTest, ReadsAFileCopiedByATorchrunAgent) {
  // dump_error_file adds "errorCode" to the child's message; some writers add "errorTraits".
  absl::StatusOr<WorkerError> error = ParseErrorJson(
      R"({"message": {"message": "ValueError: bad", "errorCode": -11,
          "errorTraits": {"category": "user_error", "retryability": "False"},
          "extraInfo": {"py_callstack": "tb", "timestamp": "1700000001"}}})");
  ASSERT_TRUE(error.ok()) << error.status();
  EXPECT_EQ(error->message, "ValueError: bad");
  EXPECT_EQ(error->traceback, "tb");
  EXPECT_EQ(error->timestamp, Epoch(1700000001));
}

TEST(ParseErrorJsonTest, ReadsOldStringFormat) {
  absl::StatusOr<WorkerError> error =
      ParseErrorJson(R"({"message": "worker gave up", "timestamp": 1600000000})");
  ASSERT_TRUE(error.ok()) << error.status();
  EXPECT_EQ(error->message, "worker gave up");
  EXPECT_EQ(error->traceback, "");
  EXPECT_EQ(error->timestamp, Epoch(1600000000));
}

TEST(ParseErrorJsonTest, OldStringFormatWithoutTimestamp) {
  absl::StatusOr<WorkerError> error = ParseErrorJson(R"({"message": "no time"})");
  ASSERT_TRUE(error.ok()) << error.status();
  EXPECT_EQ(error->message, "no time");
  EXPECT_FALSE(error->timestamp.has_value());
}

TEST(ParseErrorJsonTest, TimestampAsNumberOrFractionalString) {
  absl::StatusOr<WorkerError> number =
      ParseErrorJson(R"({"message": {"message": "m", "extraInfo": {"timestamp": 1700000000}}})");
  ASSERT_TRUE(number.ok()) << number.status();
  EXPECT_EQ(number->timestamp, Epoch(1700000000));

  absl::StatusOr<WorkerError> fractional = ParseErrorJson(
      R"({"message": {"message": "m", "extraInfo": {"timestamp": "1700000000.25"}}})");
  ASSERT_TRUE(fractional.ok()) << fractional.status();
  EXPECT_EQ(fractional->timestamp, Epoch(1700000000.25));
}

TEST(ParseErrorJsonTest, UnusableTimestampIsAbsent) {
  for (const char* json : {
           R"({"message": {"extraInfo": {"timestamp": "yesterday"}}})",
           R"({"message": {"extraInfo": {"timestamp": "0"}}})",
           R"({"message": {"extraInfo": {"timestamp": -5}}})",
           R"({"message": {"extraInfo": {"timestamp": null}}})",
           R"({"message": {"extraInfo": {"timestamp": ["1700000000"]}}})",
       }) {
    absl::StatusOr<WorkerError> error = ParseErrorJson(json);
    ASSERT_TRUE(error.ok()) << json << ": " << error.status();
    EXPECT_FALSE(error->timestamp.has_value()) << json;
  }
}

TEST(ParseErrorJsonTest, ToleratesMissingFields) {
  for (const char* json : {
           "{}",
           R"({"message": {}})",
           R"({"message": {"extraInfo": {}}})",
           R"({"message": null})",
           R"({"message": 42, "other": [1, 2]})",
           R"({"message": {"message": null, "extraInfo": "not an object"}})",
       }) {
    absl::StatusOr<WorkerError> error = ParseErrorJson(json);
    ASSERT_TRUE(error.ok()) << json << ": " << error.status();
    EXPECT_EQ(error->message, "") << json;
    EXPECT_EQ(error->traceback, "") << json;
    EXPECT_FALSE(error->timestamp.has_value()) << json;
  }
}

TEST(ParseErrorJsonTest, TracebackWithoutMessage) {
  absl::StatusOr<WorkerError> error =
      ParseErrorJson(R"({"message": {"extraInfo": {"py_callstack": "tb only"}}})");
  ASSERT_TRUE(error.ok()) << error.status();
  EXPECT_EQ(error->message, "");
  EXPECT_EQ(error->traceback, "tb only");
}

TEST(ParseErrorJsonTest, MalformedJsonIsInvalidArgument) {
  for (const char* json : {
           "",
           "not json",
           R"({"message": {"message": "cut short)",
           R"({"message" "x"})",
           "[1, 2]",
           R"("just a string")",
       }) {
    absl::StatusOr<WorkerError> error = ParseErrorJson(json);
    EXPECT_EQ(error.status().code(), absl::StatusCode::kInvalidArgument) << json;
  }
}

class ReadErrorFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& contents) {
    const std::string path = temp_.Path(name);
    EXPECT_TRUE(support::WriteFile(path, contents));
    return path;
  }

  support::TempDir temp_{"error_file_test"};
  const std::string dir_ = temp_.path();
};

TEST_F(ReadErrorFileTest, ReadsAFile) {
  absl::StatusOr<WorkerError> error = ReadErrorFile(Write("error.json", kTorch113));
  ASSERT_TRUE(error.ok()) << error.status();
  EXPECT_EQ(error->message, "RuntimeError: boom\nsecond line");
  EXPECT_EQ(error->timestamp, Epoch(1796229363));
}

TEST_F(ReadErrorFileTest, MissingFileIsNotFound) {
  EXPECT_EQ(ReadErrorFile(dir_ + "/error.json").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ReadErrorFileTest, EmptyOrTruncatedFileIsInvalidArgumentNamingThePath) {
  const std::string empty = Write("empty.json", "");
  absl::Status status = ReadErrorFile(empty).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find(empty), std::string::npos) << status;

  const std::string cut = Write("cut.json", std::string(kTorch113).substr(0, 40));
  EXPECT_EQ(ReadErrorFile(cut).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace muster
