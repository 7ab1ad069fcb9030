// k3moe: the command-line front end. Each subcommand lives in its own cmd_<name>.cpp.
#include <cstdio>
#include <exception>
#include <new>

#include <CLI/CLI.hpp>

#include "cli_common.h"
#include "commands.h"
#include "k3moe/error.h"

int main(int argc, char** argv) {
  CLI::App app{"k3moe: Kimi-K3 routed experts (MXFP4) on Hopper GPUs"};
  app.require_subcommand(1);
  k3moe::cli::register_run(app);
  k3moe::cli::register_make_checkpoint(app);
  k3moe::cli::register_inspect(app);
  k3moe::cli::register_reference(app);
#if K3MOE_WITH_CUDA
  k3moe::cli::register_validate(app);
  k3moe::cli::register_bench(app);
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const k3moe::cli::ExitCode& e) {
    return e.code;
  } catch (const k3moe::Error& e) {
    std::fprintf(stderr, "k3moe: error: %s\n", k3moe::cli::printable(e.what()).c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "k3moe: error: out of host memory: the sizes asked for (--tokens, the dimensions) need "
                         "more than this machine could allocate (std::bad_alloc)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3moe: error: %s\n", k3moe::cli::printable(e.what()).c_str());
    return 1;
  }
  return 0;
}
