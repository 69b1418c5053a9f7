// README.md's "Using the library" snippet as a program: app IN OUT folds IN into OUT and prints the number of
// rewrites and the findings `bnfold check` would report, so the install test can check that the installed library
// really ran.
#include <bnfold/io/model_io.h>
#include <bnfold/check/findings.h>
#include <bnfold/check/fold.h>

#include <iostream>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: app IN.onnx OUT.onnx\n";
    return 2;
  }
  auto model = bnfold::loadModel(argv[1]);
  bnfold::Report report;
  bnfold::DriverOptions options;
  options.rules = bnfold::parseRuleSelection("default");
  report.setReorderedGraphs(model->reorderedGraphs());
  bnfold::runRules(*model, options, report);
  bnfold::saveModel(*model, argv[2]);
  std::cout << "rewrites: " << report.rewriteCount() << "\n";
  for (const auto& finding : bnfold::findingsOf(*model, report, bnfold::parseFailOn(bnfold::kDefaultFailOn)))
    std::cout << bnfold::severityName(finding.severity) << " " << finding.category << ": " << finding.message << "\n";
  return 0;
}
