// strata pack: write a model's `.experts` pack from its GGUF, or verify one (docs/PACK.md).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "experts/expert_reader.h"
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
  double bench_seconds = 0;
  int threads = 8;
  int depth = 16;
  std::string io = "auto";
  bool buffered = false;
};

bool is_gguf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint32_t magic = 0;
  in.read(reinterpret_cast<char*>(&magic), sizeof magic);
  return in && magic == gguf::kMagic;
}

double gbps(uint64_t bytes, double seconds) {
  return seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0;
}

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
               out.c_str(), shape.layers.size(), shape.n_experts,
               format_bytes(report.bytes).c_str(), report.seconds,
               gbps(report.bytes, report.seconds), (unsigned long long)report.source_id);
}

// The pack a --verify / --bench-reads input names: the pack itself, or a GGUF's pack.
std::string input_pack(const PackOptions& o, std::unique_ptr<gguf::Reader>& model) {
  if (!is_gguf(o.input)) return o.input;
  model = gguf::Reader::open(o.input);
  return experts::pack_path_for(*model, o.output);
}

void run_verify(const PackOptions& o) {
  std::unique_ptr<gguf::Reader> model;
  const std::string pack_path = input_pack(o, model);
  const auto pack = experts::Pack::open(pack_path);
  // Byte-for-byte comparison needs the model's own stacks; a trunk-only GGUF names its pack's
  // source id instead.
  const gguf::Reader* compare = model && experts::has_expert_stacks(*model) ? model.get() : nullptr;
  if (model && !compare) {
    const gguf::Value* id = model->find(experts::kSourceIdKey);
    if (!id || !id->is_integer() || id->as_u64() != pack->source_id())
      fail(pack_path, " is not the pack ", model->path(), " was written with (",
           experts::kSourceIdKey, " differs)");
  }
  std::optional<ProgressBar> bar;
  if (o.progress) bar.emplace("verify " + pack_path, pack->data_bytes());
  const auto report = experts::verify_pack(*pack, compare, [&](uint64_t n) {
    if (bar) bar->advance(n);
  });
  if (bar) bar->finish();
  std::fprintf(
      stderr, "%s: all %llu records OK%s (%s in %.1f s, %.2f GB/s)\n", pack_path.c_str(),
      (unsigned long long)report.records, compare ? ", equal to the GGUF's expert slices" : "",
      format_bytes(report.bytes).c_str(), report.seconds, gbps(report.bytes, report.seconds));
}

// Random records through the ExpertReader with `depth` requests in flight, for `seconds`: the
// random-read rate the expert cache can expect from this disk. One JSON line on stdout.
void run_bench_reads(const PackOptions& o) {
  std::unique_ptr<gguf::Reader> model;
  const auto pack = experts::Pack::open(input_pack(o, model));
  experts::ReaderOptions ro;
  ro.threads = o.threads;
  ro.urgent_threads = std::min(2, o.threads - 1);
  ro.direct = !o.buffered;
  if (o.io == "pread")
    ro.backend = experts::IoBackend::Pread;
  else if (o.io == "io_uring")
    ro.backend = experts::IoBackend::Uring;
  else if (o.io != "auto")
    fail("--io ", o.io, ": expected auto, io_uring or pread");
  if (o.depth < 1 || o.depth > 1024) fail("--depth ", o.depth, " out of range (1..1024)");
  experts::ExpertReader reader(*pack, ro);
  const size_t slot = size_t(pack->max_record_bytes());
  experts::AlignedBuffer buffers(slot * size_t(o.depth));
  std::vector<experts::Ticket> tickets(size_t(o.depth));
  uint64_t x = 0x9E3779B97F4A7C15ull;
  const auto submit = [&](size_t i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const int layer = int(x % uint64_t(pack->n_layers()));
    const int expert = int((x >> 20) % uint64_t(pack->n_experts()));
    tickets[i] =
        reader.submit(layer, expert, buffers.data() + i * slot,
                      i % 4 == 0 ? experts::Priority::Urgent : experts::Priority::ReadAhead);
  };
  const auto t0 = std::chrono::steady_clock::now();
  const auto end = t0 + std::chrono::duration<double>(o.bench_seconds);
  for (size_t i = 0; i < tickets.size(); ++i) submit(i);
  for (size_t i = 0; std::chrono::steady_clock::now() < end; i = (i + 1) % tickets.size()) {
    reader.wait(tickets[i]);
    submit(i);
  }
  for (const auto& t : tickets) reader.wait(t);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto s = reader.stats();
  std::printf(
      "{\"pack\": \"%s\", \"io\": \"%s\", \"direct\": %s, \"threads\": %d, \"depth\": %d, "
      "\"record_bytes\": %llu, \"requests\": %llu, \"seconds\": %.3f, \"gb_per_s\": %.3f, "
      "\"records_per_s\": %.1f, \"retries\": %llu}\n",
      pack->path().c_str(), reader.backend_name().c_str(), reader.direct() ? "true" : "false",
      o.threads, o.depth, (unsigned long long)pack->max_record_bytes(),
      (unsigned long long)s.requests, wall, gbps(s.bytes, wall), double(s.requests) / wall,
      (unsigned long long)s.retries);
}

}  // namespace

void add_pack_command(CLI::App& app) {
  auto o = std::make_shared<PackOptions>();
  CLI::App* cmd = app.add_subcommand(
      "pack",
      "Write a model's .experts pack (one 4 KiB-aligned record per expert), or --verify one");
  cmd->add_option("input", o->input, "MODEL.gguf (or, with --verify, MODEL.gguf.experts)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option(
      "-o,--output", o->output,
      "The pack to write (default MODEL.gguf.experts); with --verify, the pack to check "
      "against MODEL.gguf");
  cmd->add_flag("--verify", o->verify,
                "Re-read every record and check its checksum; given the GGUF, also that every "
                "record equals the GGUF's expert slices");
  cmd->add_flag("!--no-progress", o->progress, "No progress bar");
  auto* bench = cmd->add_option("--bench-reads", o->bench_seconds,
                                "Read random records through the expert reader for this many "
                                "seconds and print the rate as JSON (measures the disk)");
  cmd->add_option("--threads", o->threads, "--bench-reads: reader threads")
      ->capture_default_str()
      ->needs(bench);
  cmd->add_option("--depth", o->depth, "--bench-reads: requests in flight")
      ->capture_default_str()
      ->needs(bench);
  cmd->add_option("--io", o->io, "--bench-reads: auto, io_uring or pread")
      ->capture_default_str()
      ->needs(bench);
  cmd->add_flag("--buffered", o->buffered, "--bench-reads: through the page cache, not O_DIRECT")
      ->needs(bench);
  cmd->callback([o] {
    if (o->bench_seconds > 0) {
      run_bench_reads(*o);
    } else if (o->verify) {
      run_verify(*o);
    } else {
      run_write(*o);
    }
  });
}

}  // namespace strata::cli
