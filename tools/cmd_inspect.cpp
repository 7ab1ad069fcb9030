// placeholder: to be written
#include "commands.h"
namespace k3moe::cli {
void register_inspect(CLI::App& app) { app.add_subcommand("inspect", "(not written yet)"); }
}  // namespace k3moe::cli
