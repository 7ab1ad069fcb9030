// placeholder: to be written
#include "commands.h"
namespace k3moe::cli {
void register_validate(CLI::App& app) { app.add_subcommand("validate", "(not written yet)"); }
}  // namespace k3moe::cli
