// libFuzzer target for the .experts pack reader. Only strata::Error is an accepted outcome for bad
// input; any other exception, crash or sanitizer report is a bug. Each input is opened twice: as
// is, and with its header and table checksums recomputed, so mutations reach the field checks
// behind the checksums. Everything the Pack returns is touched, records included, so an offset
// that points outside the input shows up under AddressSanitizer.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "experts/pack.h"
#include "experts/pack_format.h"
#include "util/error.h"

namespace {

using namespace strata::experts;

void open_and_walk(const uint8_t* data, size_t size) {
  try {
    const auto pack = Pack::from_memory(data, size, "fuzz.experts");
    volatile uint64_t sink = pack->source_id() + pack->data_bytes() + pack->max_record_bytes();
    for (int l = 0; l < pack->n_layers(); ++l) {
      const Layout& layout = pack->layout(l);
      for (int p = 0; p < 3; ++p) sink = sink + layout.part(p).bytes() + layout.part(p).offset;
      for (int e = 0; e < pack->n_experts(); ++e) {
        const Record& r = pack->record(l, e);
        if (r.offset + r.length > size || r.length != layout.record_bytes) __builtin_trap();
        sink = sink + pack->checksum_ok(l, e, data + r.offset);
        const uint8_t* rec = data + r.offset;
        sink = sink + rec[layout.down.offset + layout.down.bytes() - 1];
      }
    }
  } catch (const strata::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::experts::format;
  open_and_walk(data, size);
  if (size < kHeaderBytes) return 0;
  std::vector<uint8_t> sealed(data, data + size);
  const uint32_t layers = load<uint32_t>(sealed.data() + kAtLayers);
  const uint32_t experts = load<uint32_t>(sealed.data() + kAtExperts);
  if (layers <= kMaxLayers && experts <= kMaxExperts) {
    const Geometry g = geometry(layers, experts);
    if (g.index_end <= size)
      store<uint64_t>(
          sealed.data() + kAtTablesChecksum,
          checksum(sealed.data() + g.layers_offset, size_t(g.index_end - g.layers_offset)));
  }
  store<uint64_t>(sealed.data() + kHeaderChecksumAt, checksum(sealed.data(), kHeaderChecksumAt));
  open_and_walk(sealed.data(), sealed.size());
  return 0;
}
