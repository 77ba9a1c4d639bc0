// strata pack: write a model's `.experts` pack from its GGUF, or verify one (docs/PACK.md).
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "experts/pack.h"
#include "gguf/gguf.h"
#include "util/error.h"
#include "util/progress.h"

namespace strata::cli {

namespace {

struct PackOptions {
  std::string input;
  std::string output;
  bool verify = false;
  bool progress = true;
};

bool is_gguf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint32_t magic = 0;
  in.read(reinterpret_cast<char*>(&magic), sizeof magic);
  return in && magic == gguf::kMagic;
}

double gbps(uint64_t bytes, double seconds) { return seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0; }

void run_write(const PackOptions& o) {
  const auto model = gguf::Reader::open(o.input);
  const std::string out = o.output.empty() ? o.input + ".experts" : o.output;
  const experts::ExpertShape shape = experts::expert_shape(*model);
  uint64_t total = 0;
  for (const auto& l : shape.layers) total += l.record_bytes * uint64_t(shape.n_experts);
  std::optional<ProgressBar> bar;
  if (o.progress) bar.emplace("pack " + out, total);
  const auto report = experts::write_pack(*model, out, [&](uint64_t n) {
    if (bar) bar->advance(n);
  });
  if (bar) bar->finish();
  std::fprintf(stderr, "%s: %zu layers x %d experts, %s in %.1f s (%.2f GB/s), source id %016llx\n",
               out.c_str(), shape.layers.size(), shape.n_experts, format_bytes(report.bytes).c_str(),
               report.seconds, gbps(report.bytes, report.seconds), (unsigned long long)report.source_id);
}

void run_verify(const PackOptions& o) {
  std::unique_ptr<gguf::Reader> model;
  std::string pack_path = o.input;
  if (is_gguf(o.input)) {
    model = gguf::Reader::open(o.input);
    pack_path = experts::pack_path_for(*model, o.output);
  }
  const auto pack = experts::Pack::open(pack_path);
  // Byte-for-byte comparison needs the model's own stacks; a trunk-only GGUF names its pack's
  // source id instead.
  const gguf::Reader* compare = model && experts::has_expert_stacks(*model) ? model.get() : nullptr;
  if (model && !compare) {
    const gguf::Value* id = model->find(experts::kSourceIdKey);
    if (!id || !id->is_integer() || id->as_u64() != pack->source_id())
      fail(pack_path, " is not the pack ", model->path(), " was written with (", experts::kSourceIdKey,
           " differs)");
  }
  std::optional<ProgressBar> bar;
  if (o.progress) bar.emplace("verify " + pack_path, pack->data_bytes());
  const auto report = experts::verify_pack(*pack, compare, [&](uint64_t n) {
    if (bar) bar->advance(n);
  });
  if (bar) bar->finish();
  std::fprintf(stderr, "%s: all %llu records OK%s (%s in %.1f s, %.2f GB/s)\n", pack_path.c_str(),
               (unsigned long long)report.records, compare ? ", equal to the GGUF's expert slices" : "",
               format_bytes(report.bytes).c_str(), report.seconds, gbps(report.bytes, report.seconds));
}

}  // namespace

void add_pack_command(CLI::App& app) {
  auto o = std::make_shared<PackOptions>();
  CLI::App* cmd = app.add_subcommand(
      "pack", "Write a model's .experts pack (one 4 KiB-aligned record per expert), or --verify one");
  cmd->add_option("input", o->input, "MODEL.gguf (or, with --verify, MODEL.gguf.experts)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", o->output,
                  "The pack to write (default MODEL.gguf.experts); with --verify, the pack to check "
                  "against MODEL.gguf");
  cmd->add_flag("--verify", o->verify,
                "Re-read every record and check its checksum; given the GGUF, also that every "
                "record equals the GGUF's expert slices");
  cmd->add_flag("!--no-progress", o->progress, "No progress bar");
  cmd->callback([o] {
    if (o->verify) {
      run_verify(*o);
    } else {
      run_write(*o);
    }
  });
}

}  // namespace strata::cli
