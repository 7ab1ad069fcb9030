// The k3moe command's subcommands, one file each (cmd_<name>.cpp).
#pragma once

#include <CLI/CLI.hpp>

namespace k3moe::cli {

void register_make_checkpoint(CLI::App& app);
void register_inspect(CLI::App& app);
void register_reference(CLI::App& app);
void register_run(CLI::App& app);
#if K3MOE_WITH_CUDA
void register_validate(CLI::App& app);
void register_bench(CLI::App& app);
#endif

}  // namespace k3moe::cli
