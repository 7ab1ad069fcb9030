// placeholder: to be written
#include "commands.h"
namespace k3moe::cli {
void register_make_checkpoint(CLI::App& app) { app.add_subcommand("make-checkpoint", "(not written yet)"); }
}  // namespace k3moe::cli
