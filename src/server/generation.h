// The two generating endpoints, /v1/chat/completions and /v1/completions: parse and validate the
// request, render and tokenize the prompt, check it fits the context, queue one job on the
// scheduler, then answer with one JSON object or an SSE stream as the tokens come. The model
// state (decode::Session) is touched only by the scheduler's worker, which is what makes the
// prompt cache work: each request reuses the longest prefix the previous one left.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <httplib.h>

#include "decode/generate.h"
#include "decode/json_constraint.h"
#include "decode/loaded_model.h"
#include "server/metrics.h"
#include "server/request.h"
#include "server/scheduler.h"

namespace strata::server {

struct GenerationOptions {
  std::string model_id;
  size_t queue = 8;         // requests that may wait behind the running one
  double timeout_s = 600;   // a request's whole life: queue wait and generation
  int64_t batch = 512;      // prefill rows per window
  spec::Options spec;       // speculative decoding (strata serve --spec)
};

class Generation {
 public:
  // `model` and `metrics` must outlive this.
  Generation(decode::LoadedModel& model, Metrics& metrics, GenerationOptions options);

  void chat(const httplib::Request& req, httplib::Response& res);
  void completion(const httplib::Request& req, httplib::Response& res);

  // Refuses new jobs, drops queued ones, ends the running one at its next window.
  void shutdown() { scheduler_.shutdown(); }
  LiveGauges gauges() const;
  const RequestLimits& limits() const { return limits_; }

 private:
  // Queues `prompt` and waits until the worker starts it. Throws ApiError 429 (queue full), 503
  // (shutting down, or the deadline passed in the queue).
  std::shared_ptr<Job> start(const std::vector<int32_t>& prompt, decode::GenerateParams gen,
                             Clock::time_point deadline);
  decode::GenerateParams params_for(const GenerationRequest& r, size_t prompt_tokens) const;

  decode::LoadedModel& model_;
  Metrics& metrics_;
  GenerationOptions options_;
  RequestLimits limits_;
  decode::JsonVocab json_vocab_;  // what constrained replies need about the vocabulary, once
  decode::Session session_;
  Scheduler scheduler_;
};

}  // namespace strata::server
