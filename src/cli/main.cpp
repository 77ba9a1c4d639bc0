// strata: one binary, one subcommand per job.
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "cli/expert_flags.h"
#include "util/cpu.h"
#include "util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"strata: runs Mixture-of-Experts models larger than memory"};
  app.require_subcommand(1);
  app.set_version_flag("--version", [] {
    return std::string("strata 0.1.0 (cpu: ") + strata::cpu_features().describe() + ")";
  });
  strata::cli::add_convert_command(app);
  strata::cli::add_inspect_command(app);
  strata::cli::add_logits_command(app);
  strata::cli::add_pack_command(app);
  strata::cli::add_replay_command(app);
  strata::cli::add_run_command(app);
  strata::cli::add_serve_command(app);
  strata::cli::add_synth_command(app);
  strata::cli::add_trace_command(app);
  strata::cli::add_tokenize_command(app);
  strata::cli::add_bench_command(app);
  strata::cli::add_profile_command(app);
  // What STRATA_IO_FAULTS injected (a test hook), however the command ends.
  struct ReportFaults {
    ~ReportFaults() { strata::cli::report_io_faults(); }
  } report_faults;
  try {
    strata::cpu_features();  // a bad STRATA_ISA is an error before any work starts
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "strata: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
