// Routing traces: per token (row) and layer, the routed experts in rank order with their weights,
// and optionally the router's top-M candidates (ids and logits, sorted) plus the log-sum-exp of all
// the row's logits, so cache-conditional routing can be replayed with quality numbers. The file
// format is in docs/ROUTING.md.
//
// Recording (engine side): one TraceWriter per run; for each window call append() once per layer,
// in layer order 0..n_layers-1, with that layer's backend::Routing for the window's rows (and the
// router's top-M from router_top_m() when the trace carries candidates). The window reaches the
// file when its last layer is appended.
//
// Replaying (`--route-trace FILE`): a TraceReader holds the whole trace; routing(first_row, rows,
// layer) gives a backend::Routing for a window in place of the router's, wrapping past the end.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace strata::route {

// The largest candidate list a trace may carry, and the largest expert count (ids are u16).
constexpr int kMaxTopM = 64;
constexpr int kMaxExperts = 65535;

struct TraceHeader {
  int n_layers = 0;
  int n_experts = 0;
  int top_k = 0;
  int top_m = 0;             // router candidates per (row, layer); 0 = none recorded
  bool renormalized = true;  // weights are p / sum of the chosen p (else the plain softmax p)
  std::string model;         // identity of the model the routes belong to (name, shape, file)
};

// Throws strata::Error when a field is out of range (top_m is 0 or top_k..kMaxTopM).
void validate_header(const TraceHeader& h, const std::string& source);

// A window's router candidates for one layer: for each row the top-M experts by logit (descending,
// ties to the lower id) and the log-sum-exp over all of the row's logits.
struct RouterTopM {
  int m = 0;
  std::vector<int32_t> ids;    // rows x m
  std::vector<float> logits;   // rows x m
  std::vector<float> lse;      // rows
};

// The top-M of `rows` rows of n router logits (row r starts at logits + r * stride). The
// log-sum-exp is max + log(sum exp(z - max)) summed in column order.
RouterTopM router_top_m(const float* logits, int64_t rows, int64_t n, int64_t stride, int m);

class TraceWriter {
 public:
  // Creates (truncates) `path` and writes the header. Throws strata::Error.
  TraceWriter(const std::string& path, TraceHeader header);
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Layer `layer` of the current window. Layers come in order; every layer of a window has the
  // same rows; top_m is required exactly when the header's top_m > 0. Ids out of range, repeated
  // experts in a row, non-finite weights or candidates that do not contain the routed experts
  // throw strata::Error naming the row and layer.
  void append(int layer, const backend::Routing& routing, const RouterTopM* top_m = nullptr);
  // Flushes to the OS and closes; further appends throw. A window left half-appended is an error.
  void close();

  int64_t rows_written() const { return rows_written_; }
  const TraceHeader& header() const { return header_; }

 private:
  void write_bytes(std::span<const uint8_t> bytes);

  std::string path_;
  TraceHeader header_;
  std::FILE* file_ = nullptr;
  int next_layer_ = 0;
  int64_t window_rows_ = 0;
  std::vector<std::vector<uint8_t>> layer_bytes_;  // per layer: rows x per-layer record
  int64_t rows_written_ = 0;
};

class TraceReader {
 public:
  // Reads and validates the whole file: header, window checksums and counts, ids in range,
  // distinct experts per row, finite non-negative weights, sorted finite candidate logits that
  // contain the routed experts. Throws strata::Error naming the file, window/row/layer and problem.
  static TraceReader open(const std::string& path);
  static TraceReader parse(std::span<const uint8_t> bytes, const std::string& source);

  const TraceHeader& header() const { return header_; }
  int64_t rows() const { return rows_; }

  // Row `row` (0-based, in recording order) of layer `layer`.
  std::span<const int32_t> experts(int64_t row, int layer) const;
  std::span<const float> weights(int64_t row, int layer) const;
  // Only when header().top_m > 0.
  std::span<const int32_t> candidates(int64_t row, int layer) const;
  std::span<const float> logits(int64_t row, int layer) const;
  float lse(int64_t row, int layer) const;

  // A window of `n_rows` rows starting at trace row first_row (taken modulo rows(), so a run longer
  // than the trace cycles through it) for layer `layer`, as the router would have produced it.
  backend::Routing routing(int64_t first_row, int64_t n_rows, int layer) const;

 private:
  size_t slot(int64_t row, int layer) const {
    return size_t(row) * size_t(header_.n_layers) + size_t(layer);
  }

  TraceHeader header_;
  int64_t rows_ = 0;
  std::vector<int32_t> experts_;  // rows x layers x top_k
  std::vector<float> weights_;
  std::vector<int32_t> cand_ids_;  // rows x layers x top_m
  std::vector<float> cand_logits_;
  std::vector<float> lse_;  // rows x layers
};

}  // namespace strata::route
