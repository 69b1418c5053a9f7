// Report entries kept as records (bnfold/report/report_record.h): the JSON they turn into, and a report holding
// them printing and reading as it would with the same entries given as JSON.

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bnfold/report/report.h"
#include "bnfold/report/report_record.h"

using bnfold::Report;
using bnfold::ReportRecord;

namespace {

// A fold-like entry both ways: as a record, and as the JSON it stands for.
ReportRecord foldRecord(const std::string& bn, double epsilon) {
  ReportRecord record;
  record.setText("bn", bn);
  record.setText("into", "conv \"0\"\n");  // characters that JSON escapes
  record.setNumbers("gamma", {0.5, -1.25, 3e-8});
  record.setNumber("epsilon", epsilon);
  record.setInteger("features_per_channel", int64_t{1} << 40);
  record.setBool("bias_created", true);
  record.setNull("bias_before");
  const std::string weight = "w_folded";
  record.setTextOrNull("weight_after", &weight);
  record.setTextOrNull("bias_after", nullptr);
  record.setJson("path", nlohmann::json::array({{{"node", "t"}, {"op", "Transpose"}}}));
  record.setNumbers("empty", {});
  return record;
}

nlohmann::json foldJson(const std::string& bn, double epsilon) {
  return {{"bn", bn},
          {"into", "conv \"0\"\n"},
          {"gamma", {0.5, -1.25, 3e-8}},
          {"epsilon", epsilon},
          {"features_per_channel", int64_t{1} << 40},
          {"bias_created", true},
          {"bias_before", nullptr},
          {"weight_after", "w_folded"},
          {"bias_after", nullptr},
          {"path", nlohmann::json::array({{{"node", "t"}, {"op", "Transpose"}}})},
          {"empty", nlohmann::json::array()}};
}

// The same entries in the same sections: records in `withRecords`, JSON in `withJson`.
void fillBoth(Report& withRecords, Report& withJson) {
  for (Report* report : {&withRecords, &withJson}) {
    report->setInput("in.onnx");
    report->setRules({"bn-fold"});
    report->add("skipped", nlohmann::json{{"node", "left"}, {"reason", "training-mode"}});
  }
  withRecords.add("folds", foldRecord("bn0", 1e-5));
  withJson.add("folds", foldJson("bn0", 1e-5));
  // A JSON entry between two records of one section keeps its place.
  withRecords.add("folds", nlohmann::json{{"bn", "plain"}});
  withJson.add("folds", nlohmann::json{{"bn", "plain"}});
  withRecords.add("folds", foldRecord("bn1", 1e-3));
  withJson.add("folds", foldJson("bn1", 1e-3));
  withRecords.add("decomposed", foldRecord("bn2", 0.5));
  withJson.add("decomposed", foldJson("bn2", 0.5));
}

}  // namespace

TEST_CASE("a report record turns into the JSON object of its fields", "[report]") {
  const nlohmann::json json = foldRecord("bn0", 1e-5).toJson();
  CHECK(json == foldJson("bn0", 1e-5));
  // Integers stay integers, numbers stay floating point: they print differently.
  CHECK(json["features_per_channel"].is_number_integer());
  CHECK(json["epsilon"].is_number_float());
  CHECK(ReportRecord().toJson() == nlohmann::json::object());
}

TEST_CASE("setting a record's field again replaces it, as json's operator[] does", "[report]") {
  ReportRecord record;
  record.setText("bias_after", "b0");
  record.setNull("bias_before");
  record.setText("bias_after", "b0_folded");
  record.setText("bias_before", "b");
  record.setNumbers("gamma", {1.0});
  record.setNumbers("gamma", {2.0, 3.0});
  CHECK(record.size() == 3);
  CHECK(record.toJson() ==
        nlohmann::json{{"bias_after", "b0_folded"}, {"bias_before", "b"}, {"gamma", {2.0, 3.0}}});
}

TEST_CASE("a record tells fields apart by their whole names, wherever the names are stored", "[report]") {
  ReportRecord record;
  record.setText("bias", "b");  // a prefix of the next two names
  record.setText("bias_after", "b1");
  record.setText("bias_before", "b0");
  record.setText("into", "conv");  // as long as "beta"
  record.setNumber("beta", 0.5);
  // The same names from other arrays (not the literals above) name the same fields, which keep the literals as keys.
  const char biasAfter[] = {'b', 'i', 'a', 's', '_', 'a', 'f', 't', 'e', 'r', '\0'};
  char into[16] = "into";  // a shorter name than the array holds
  record.setText(biasAfter, "b2");
  record.setText(into, "gemm");
  CHECK(record.size() == 5);
  CHECK(record.toJson() == nlohmann::json{{"bias", "b"}, {"bias_after", "b2"}, {"bias_before", "b0"}, {"into", "gemm"},
                                          {"beta", 0.5}});
}

TEST_CASE("a report with records prints and reads as it does with the same entries as JSON", "[report]") {
  Report withRecords, withJson;
  fillBoth(withRecords, withJson);

  SECTION("printed without turning the records into JSON first") {
    CHECK(withRecords.sectionSize("folds") == 3);
    CHECK(withRecords.rewriteCount() == withJson.rewriteCount());
    CHECK(withRecords.dump() == withJson.dump());
    CHECK(nlohmann::json::parse(withRecords.dump()) == withJson.json());
  }
  SECTION("read section by section, then printed") {
    CHECK(withRecords.section("folds") == withJson.section("folds"));
    CHECK(withRecords.dump() == withJson.dump());  // "decomposed" is still held as a record here
    CHECK(withRecords.json() == withJson.json());
    CHECK(withRecords.dump() == withJson.dump());
  }
  SECTION("an entry completed after it was recorded") {
    withRecords.entry("folds", 2)["verify"] = {{"passed", true}};
    withJson.entry("folds", 2)["verify"] = {{"passed", true}};
    withRecords.add("folds", foldRecord("bn3", 2.0));
    withJson.add("folds", foldJson("bn3", 2.0));
    CHECK(withRecords.dump() == withJson.dump());
    CHECK(withRecords.section("folds").at(2).at("verify").at("passed") == true);
  }
}
