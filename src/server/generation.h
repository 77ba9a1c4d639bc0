// Generation for every API: OpenAI's /v1/chat/completions and /v1/completions here, and
// start_chat() for the other chat APIs (anthropic_api.h, responses_api.h): parse and validate the
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
#include "server/batch_loop.h"
#include "server/chat_reply.h"
#include "server/metrics.h"
#include "server/request.h"
#include "server/scheduler.h"

namespace strata::server {

struct GenerationOptions {
  std::string model_id;
  size_t queue = 8;         // requests that may wait behind the running one
  double timeout_s = 600;   // a request's whole life: queue wait and generation
  int64_t batch = 512;      // prefill rows per window
  size_t parallel = 1;      // generations that share windows (1: one at a time)
  spec::Options spec;       // speculative decoding (strata serve --spec; with --parallel 1)
  double warmup_after_s = 30;  // a warm-up window for a request after this much idle (<= 0: never)
};

// A chat request queued and started: its job, and the reader that turns its text into
// reasoning, answer and tool calls.
struct StartedChat {
  std::shared_ptr<Job> job;
  std::shared_ptr<ReplyReader> reader;
  int64_t prompt_tokens = 0;
};

class Generation {
 public:
  // `model` and `metrics` must outlive this.
  Generation(decode::LoadedModel& model, Metrics& metrics, GenerationOptions options);

  // OpenAI's /v1/chat/completions and /v1/completions.
  void chat(const httplib::Request& req, httplib::Response& res);
  void completion(const httplib::Request& req, httplib::Response& res);

  // What every chat API shares once its request is parsed into a ChatRequest: plan the
  // constraint, render the template, tokenize, check the context, add the thinking budget,
  // queue the job and wait until it starts. Throws ApiError (400, 429, 503).
  StartedChat start_chat(const ChatRequest& r, Clock::time_point deadline);
  // How many tokens the prompt of `r` has (Anthropic's count_tokens).
  int64_t count_chat_tokens(const ChatRequest& r) const;
  // When a request arriving now runs out of time (--timeout).
  Clock::time_point deadline() const;
  const std::string& model_id() const { return options_.model_id; }
  decode::LoadedModel& model() { return model_; }

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
  std::string render(const ChatRequest& r, const ChatPlan& plan) const;
  int64_t conversation_end(const ChatRequest& r, const ChatPlan& plan, const std::vector<int32_t>& prompt) const;

  decode::LoadedModel& model_;
  Metrics& metrics_;
  GenerationOptions options_;
  RequestLimits limits_;
  decode::JsonVocab json_vocab_;  // what constrained replies need about the vocabulary, once
  // One of the two: a session for one generation at a time, or the slots of --parallel N.
  WarmUp warmup_;  // before session_ and batch_: the batch loop's thread calls it
  std::unique_ptr<decode::Session> session_;
  std::unique_ptr<BatchLoop> batch_;
  Scheduler scheduler_;  // last: its workers stop before the above go
};

}  // namespace strata::server
