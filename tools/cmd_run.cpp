// placeholder: to be written
#include "commands.h"
namespace k3moe::cli {
void register_run(CLI::App& app) { app.add_subcommand("run", "(not written yet)"); }
}  // namespace k3moe::cli
