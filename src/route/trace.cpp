#include "route/trace.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string_view>

#include "route/binio.h"
#include "util/error.h"

namespace strata::route {

namespace {

constexpr std::string_view kMagic = "STRTRACE";
constexpr uint32_t kVersion = 1;
constexpr uint32_t kWindowTag = 0x57444E57;  // "WNDW"
constexpr uint32_t kFlagRenormalized = 1;
constexpr uint32_t kMaxModelName = 4096;
constexpr uint32_t kMaxWindowRows = 1u << 20;

size_t layer_record_bytes(const TraceHeader& h) {
  size_t n = size_t(h.top_k) * (sizeof(uint16_t) + sizeof(float));
  if (h.top_m > 0) n += size_t(h.top_m) * (sizeof(uint16_t) + sizeof(float)) + sizeof(float);
  return n;
}

// The checks shared by the writer (what the engine hands over) and the reader (what a file says).
// `where` is called only to name the place in an error.
template <typename Where>
void check_row(const TraceHeader& h, std::span<const int32_t> experts, std::span<const float> weights,
               std::span<const int32_t> cand, std::span<const float> logits, float lse, Where where) {
  for (int j = 0; j < h.top_k; ++j) {
    if (experts[j] < 0 || experts[j] >= h.n_experts)
      fail(where(), ": expert id ", experts[j], " at rank ", j, " is outside 0..", h.n_experts - 1);
    for (int i = 0; i < j; ++i)
      if (experts[i] == experts[j]) fail(where(), ": expert ", experts[j], " is routed twice");
    if (!std::isfinite(weights[j]) || weights[j] < 0.0f)
      fail(where(), ": weight ", weights[j], " at rank ", j, " is not a finite value >= 0");
  }
  if (h.top_m == 0) return;
  for (int j = 0; j < h.top_m; ++j) {
    if (cand[j] < 0 || cand[j] >= h.n_experts)
      fail(where(), ": candidate id ", cand[j], " at rank ", j, " is outside 0..", h.n_experts - 1);
    if (!std::isfinite(logits[j])) fail(where(), ": candidate logit at rank ", j, " is not finite");
    if (j > 0 && logits[j] > logits[j - 1])
      fail(where(), ": candidate logits are not sorted (rank ", j, " exceeds rank ", j - 1, ")");
  }
  std::vector<int32_t> sorted(cand.begin(), cand.end());
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    fail(where(), ": a candidate expert is listed twice");
  if (!std::isfinite(lse) || lse < logits[0])
    fail(where(), ": log-sum-exp ", lse, " is not finite or below the largest logit");
  for (int j = 0; j < h.top_k; ++j)
    if (!std::binary_search(sorted.begin(), sorted.end(), experts[j]))
      fail(where(), ": routed expert ", experts[j], " is not among the top-", h.top_m, " candidates");
}

}  // namespace

void validate_header(const TraceHeader& h, const std::string& source) {
  if (h.n_layers < 1 || h.n_layers > 4096) fail(source, ": n_layers ", h.n_layers, " is outside 1..4096");
  if (h.n_experts < 1 || h.n_experts > kMaxExperts)
    fail(source, ": n_experts ", h.n_experts, " is outside 1..", kMaxExperts);
  if (h.top_k < 1 || h.top_k > h.n_experts)
    fail(source, ": top_k ", h.top_k, " is outside 1..", h.n_experts, " (n_experts)");
  if (h.top_m != 0 && (h.top_m < h.top_k || h.top_m > std::min(kMaxTopM, h.n_experts)))
    fail(source, ": top_m ", h.top_m, " must be 0 or within top_k ", h.top_k, "..",
         std::min(kMaxTopM, h.n_experts));
  if (h.model.size() > kMaxModelName)
    fail(source, ": model identity is ", h.model.size(), " bytes (at most ", kMaxModelName, ")");
}

RouterTopM router_top_m(const float* logits, int64_t rows, int64_t n, int64_t stride, int m) {
  if (m < 1 || m > n) fail("router_top_m: m ", m, " is outside 1..", n);
  RouterTopM out;
  out.m = m;
  out.ids.resize(size_t(rows * m));
  out.logits.resize(size_t(rows * m));
  out.lse.resize(size_t(rows));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits + r * stride;
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + m, ids.end(),
                      [&](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
    const float mx = z[ids[0]];
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(z[i] - mx);
    out.lse[r] = mx + std::log(sum);
    for (int j = 0; j < m; ++j) {
      out.ids[r * m + j] = ids[j];
      out.logits[r * m + j] = z[ids[j]];
    }
  }
  return out;
}

// ---- writer ----

TraceWriter::TraceWriter(const std::string& path, TraceHeader header)
    : path_(path), header_(std::move(header)) {
  validate_header(header_, "routing trace " + path_);
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) fail("routing trace ", path_, ": cannot create: ", std::strerror(errno));
  layer_bytes_.resize(size_t(header_.n_layers));
  ByteWriter w;
  put_preamble(w, kMagic, kVersion);
  w.put(uint32_t(header_.n_layers));
  w.put(uint32_t(header_.n_experts));
  w.put(uint32_t(header_.top_k));
  w.put(uint32_t(header_.top_m));
  w.put(uint32_t(header_.renormalized ? kFlagRenormalized : 0));
  w.put_string(header_.model);
  w.put(checksum(w.bytes()));
  write_bytes(w.bytes());
}

TraceWriter::~TraceWriter() {
  if (file_) std::fclose(file_);
}

void TraceWriter::write_bytes(std::span<const uint8_t> bytes) {
  if (std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size())
    fail("routing trace ", path_, ": write failed: ", std::strerror(errno));
}

void TraceWriter::append(int layer, const backend::Routing& routing, const RouterTopM* top_m) {
  if (!file_) fail("routing trace ", path_, ": append after close");
  if (layer != next_layer_)
    fail("routing trace ", path_, ": layer ", layer, " appended where layer ", next_layer_, " is due");
  if (routing.top_k != header_.top_k)
    fail("routing trace ", path_, ": layer ", layer, " routes top-", routing.top_k, ", the trace is top-",
         header_.top_k);
  if (routing.experts.size() != routing.weights.size() || routing.experts.size() % size_t(header_.top_k))
    fail("routing trace ", path_, ": layer ", layer, ": ", routing.experts.size(), " experts and ",
         routing.weights.size(), " weights do not make whole rows of ", header_.top_k);
  const int64_t rows = int64_t(routing.experts.size()) / header_.top_k;
  if (rows < 1 || rows > int64_t(kMaxWindowRows))
    fail("routing trace ", path_, ": layer ", layer, ": a window of ", rows, " rows (1..", kMaxWindowRows, ")");
  if (layer == 0) window_rows_ = rows;
  if (rows != window_rows_)
    fail("routing trace ", path_, ": layer ", layer, " has ", rows, " rows, layer 0 of this window had ",
         window_rows_);
  const int m = header_.top_m;
  if ((m > 0) != (top_m != nullptr))
    fail("routing trace ", path_, ": layer ", layer,
         m > 0 ? ": the trace records router candidates but none were given"
               : ": router candidates given to a trace without them");
  if (top_m && (top_m->m != m || top_m->ids.size() != size_t(rows * m) ||
                top_m->logits.size() != size_t(rows * m) || top_m->lse.size() != size_t(rows)))
    fail("routing trace ", path_, ": layer ", layer, ": router candidates are not ", rows, " rows of top-", m);

  ByteWriter w;
  const int k = header_.top_k;
  for (int64_t r = 0; r < rows; ++r) {
    const std::span<const int32_t> ex(routing.experts.data() + r * k, size_t(k));
    const std::span<const float> wt(routing.weights.data() + r * k, size_t(k));
    std::span<const int32_t> cand;
    std::span<const float> lg;
    float lse = 0.0f;
    if (top_m) {
      cand = {top_m->ids.data() + r * m, size_t(m)};
      lg = {top_m->logits.data() + r * m, size_t(m)};
      lse = top_m->lse[size_t(r)];
    }
    check_row(header_, ex, wt, cand, lg, lse, [&] {
      return cat("routing trace ", path_, ": window row ", r, ", layer ", layer);
    });
    for (int32_t e : ex) w.put(uint16_t(e));
    w.put_all(wt);
    if (top_m) {
      for (int32_t e : cand) w.put(uint16_t(e));
      w.put_all(lg);
      w.put(lse);
    }
  }
  layer_bytes_[size_t(layer)] = std::move(w.bytes());
  if (++next_layer_ < header_.n_layers) return;

  // The whole window is here: interleave it row-major and write it as one chunk.
  const size_t rec = layer_record_bytes(header_);
  std::vector<uint8_t> payload;
  payload.reserve(size_t(window_rows_) * rec * size_t(header_.n_layers));
  for (int64_t r = 0; r < window_rows_; ++r)
    for (const auto& lb : layer_bytes_)
      payload.insert(payload.end(), lb.begin() + r * rec, lb.begin() + (r + 1) * rec);
  ByteWriter head;
  head.put(kWindowTag);
  head.put(uint32_t(window_rows_));
  head.put(checksum(payload));
  write_bytes(head.bytes());
  write_bytes(payload);
  if (std::fflush(file_) != 0) fail("routing trace ", path_, ": write failed: ", std::strerror(errno));
  rows_written_ += window_rows_;
  next_layer_ = 0;
}

void TraceWriter::close() {
  if (!file_) return;
  std::FILE* f = file_;
  file_ = nullptr;
  const bool ok = std::fclose(f) == 0;
  if (!ok) fail("routing trace ", path_, ": closing failed: ", std::strerror(errno));
  if (next_layer_ != 0)
    fail("routing trace ", path_, ": closed in the middle of a window (layers 0..", next_layer_ - 1,
         " of ", header_.n_layers, " appended); that window was dropped");
}

// ---- reader ----

TraceReader TraceReader::open(const std::string& path) {
  const auto bytes = read_whole_file(path, "routing trace");
  return parse(bytes, "routing trace " + path);
}

TraceReader TraceReader::parse(std::span<const uint8_t> bytes, const std::string& source) {
  ByteReader in(bytes, source);
  expect_preamble(in, kMagic, kVersion, "routing trace");
  TraceReader t;
  TraceHeader& h = t.header_;
  const auto u32_field = [&](const char* name) {
    const auto v = in.get<uint32_t>(name);
    if (v > uint32_t(kMaxExperts)) in.fail_at(name, " ", v, " is out of range");
    return int(v);
  };
  h.n_layers = u32_field("n_layers");
  h.n_experts = u32_field("n_experts");
  h.top_k = u32_field("top_k");
  h.top_m = u32_field("top_m");
  const auto flags = in.get<uint32_t>("flags");
  if (flags & ~kFlagRenormalized) in.fail_at("unknown flags ", flags);
  h.renormalized = (flags & kFlagRenormalized) != 0;
  h.model = in.get_string("model identity", kMaxModelName);
  const size_t header_end = in.offset();
  if (in.get<uint64_t>("header checksum") != checksum(bytes.first(header_end)))
    fail(source, ": header checksum mismatch (the header is corrupt)");
  validate_header(h, source);

  const size_t rec = layer_record_bytes(h);
  const size_t row_bytes = rec * size_t(h.n_layers);
  const int k = h.top_k, m = h.top_m;
  int64_t window = 0;
  while (in.remaining() > 0) {
    if (in.remaining() < 16)
      in.fail_at("truncated: ", in.remaining(), " stray bytes after window ", window - 1);
    if (in.get<uint32_t>("window tag") != kWindowTag) in.fail_at("window ", window, ": bad tag (corrupt file)");
    const auto n_rows = in.get<uint32_t>("window rows");
    const auto sum = in.get<uint64_t>("window checksum");
    if (n_rows < 1 || n_rows > kMaxWindowRows)
      in.fail_at("window ", window, " declares ", n_rows, " rows (1..", kMaxWindowRows, ")");
    const size_t want = size_t(n_rows) * row_bytes;
    if (in.remaining() < want)
      in.fail_at("truncated: window ", window, " declares ", n_rows, " rows (", want, " bytes) but only ",
                 in.remaining(), " bytes remain");
    const auto payload = in.take(want, "window rows");
    if (checksum(payload) != sum) fail(source, ": window ", window, " checksum mismatch (corrupt data)");
    ByteReader rows(payload, source);
    for (uint32_t r = 0; r < n_rows; ++r) {
      for (int l = 0; l < h.n_layers; ++l) {
        const size_t e0 = t.experts_.size(), c0 = t.cand_ids_.size();
        for (int j = 0; j < k; ++j) t.experts_.push_back(rows.get<uint16_t>("expert id"));
        for (int j = 0; j < k; ++j) t.weights_.push_back(rows.get<float>("weight"));
        float lse = 0.0f;
        if (m > 0) {
          for (int j = 0; j < m; ++j) t.cand_ids_.push_back(rows.get<uint16_t>("candidate id"));
          for (int j = 0; j < m; ++j) t.cand_logits_.push_back(rows.get<float>("candidate logit"));
          lse = rows.get<float>("log-sum-exp");
          t.lse_.push_back(lse);
        }
        check_row(h, {t.experts_.data() + e0, size_t(k)}, {t.weights_.data() + e0, size_t(k)},
                  {t.cand_ids_.data() + c0, size_t(m)}, {t.cand_logits_.data() + c0, size_t(m)}, lse,
                  [&] { return cat(source, ": window ", window, ", row ", t.rows_ + r, ", layer ", l); });
      }
    }
    t.rows_ += n_rows;
    ++window;
  }
  return t;
}

std::span<const int32_t> TraceReader::experts(int64_t row, int layer) const {
  return {experts_.data() + slot(row, layer) * size_t(header_.top_k), size_t(header_.top_k)};
}

std::span<const float> TraceReader::weights(int64_t row, int layer) const {
  return {weights_.data() + slot(row, layer) * size_t(header_.top_k), size_t(header_.top_k)};
}

std::span<const int32_t> TraceReader::candidates(int64_t row, int layer) const {
  return {cand_ids_.data() + slot(row, layer) * size_t(header_.top_m), size_t(header_.top_m)};
}

std::span<const float> TraceReader::logits(int64_t row, int layer) const {
  return {cand_logits_.data() + slot(row, layer) * size_t(header_.top_m), size_t(header_.top_m)};
}

float TraceReader::lse(int64_t row, int layer) const { return lse_[slot(row, layer)]; }

backend::Routing TraceReader::routing(int64_t first_row, int64_t n_rows, int layer) const {
  if (rows_ == 0) fail("routing trace: replaying an empty trace");
  if (layer < 0 || layer >= header_.n_layers)
    fail("routing trace: layer ", layer, " is outside 0..", header_.n_layers - 1);
  backend::Routing out;
  out.top_k = header_.top_k;
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t row = ((first_row + r) % rows_ + rows_) % rows_;
    const auto e = experts(row, layer);
    const auto w = weights(row, layer);
    out.experts.insert(out.experts.end(), e.begin(), e.end());
    out.weights.insert(out.weights.end(), w.begin(), w.end());
  }
  return out;
}

}  // namespace strata::route
