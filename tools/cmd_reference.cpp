// placeholder: to be written
#include "commands.h"
namespace k3moe::cli {
void register_reference(CLI::App& app) { app.add_subcommand("reference", "(not written yet)"); }
}  // namespace k3moe::cli
