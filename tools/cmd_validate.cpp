// k3moe validate: the validation matrix on the GPU (src/validation), one row per case.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "k3moe/error.h"
#include "k3moe/plan.h"
#include "validation/validation.h"

namespace k3moe::cli {

void register_validate(CLI::App& app) {
  auto* cmd = app.add_subcommand("validate", "Run the validation matrix on the GPU against the float64 reference");
  struct Options {
    bool quick = false;
    std::string filter, json, commit = "unknown";
  };
  auto opt = std::make_shared<Options>();
  cmd->add_flag("--quick", opt->quick, "A representative subset (for sanitizer runs)");
  cmd->add_option("--filter", opt->filter, "Only cases whose row contains this text (e.g. mxfp8, k3-local28)");
  cmd->add_option("--json", opt->json, "Write the results as JSON to this file");
  cmd->add_option("--commit", opt->commit, "The commit being validated (recorded in the JSON)");
  cmd->callback([opt] {
    std::string why;
    K3MOE_CHECK(hopper_gpu_available(&why), "validate needs a Hopper GPU: ", why);
    std::vector<validation::Result> results;
    std::printf("%s\n", validation::header_line().c_str());
    int failures = 0;
    for (const validation::Case& c : validation::matrix(opt->quick)) {
      validation::Result probe;
      probe.spec = c;
      if (!opt->filter.empty() && validation::result_line(probe).find(opt->filter) == std::string::npos) continue;
      validation::Result r = validation::run(c);
      std::printf("%s\n", validation::result_line(r).c_str());
      std::fflush(stdout);
      failures += r.pass ? 0 : 1;
      results.push_back(std::move(r));
    }
    std::printf("%zu cases, %d failed\n", results.size(), failures);
    if (!opt->json.empty()) {
      std::ofstream(opt->json) << validation::results_json(results, opt->commit) << "\n";
      std::printf("wrote %s\n", opt->json.c_str());
    }
    if (failures > 0) throw ExitCode{1};
  });
}

}  // namespace k3moe::cli
