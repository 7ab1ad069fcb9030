// placeholder: to be written
#include "commands.h"
namespace k3moe::cli {
void register_bench(CLI::App& app) { app.add_subcommand("bench", "(not written yet)"); }
}  // namespace k3moe::cli
