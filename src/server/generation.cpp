#include "server/generation.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include "server/api_error.h"
#include "server/chat_reply.h"
#include "server/encode.h"
#include "util/error.h"

namespace strata::server {

namespace {

std::string generation_label(const decode::GenerateResult& r, bool client_gone) {
  if (client_gone) return "cancelled";
  switch (r.finish) {
    case decode::FinishReason::Eos:
    case decode::FinishReason::Stop: return "stop";
    case decode::FinishReason::Length: return "length";
    case decode::FinishReason::Cancelled: return "timeout";
  }
  return "stop";
}

// A streaming response: `opening`, the chunks of each batch of text, the last chunks (the
// finish reason in the final one), the usage chunk when asked for, then [DONE]. A failed
// generation ends with an error event instead, as OpenAI's streams do.
Writer sse_writer(std::string opening, std::function<std::vector<Json>(const std::string&)> chunks,
                  std::function<std::vector<Json>(const decode::GenerateResult&)> last,
                  std::function<Json(const Usage& usage)> usage_chunk) {
  const auto events = [](const std::vector<Json>& chunks) {
    std::string out;
    for (const auto& c : chunks) out += sse_event(c);
    return out;
  };
  return {kSseType, std::move(opening), ": keep-alive\n\n",
          [chunks = std::move(chunks), events](const std::string& text) {
            return events(chunks(text));
          },
          [last = std::move(last), usage_chunk = std::move(usage_chunk),
           events](const Job& done) {
            if (!done.result()) return sse_event(error_body(internal_error(done.error())));
            const auto& result = *done.result();
            std::string out = events(last(result));
            if (usage_chunk) out += sse_event(usage_chunk(usage_of(result.telemetry)));
            return out + kSseDone;
          }};
}

uint64_t random_salt() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) | rd();
}

// Runs `filter` and `on_token` after the hooks `gen` already has.
void add_hooks(decode::GenerateParams& gen, std::function<void(std::span<float>)> filter,
               std::function<void(int32_t)> on_token) {
  gen.logits_filter = [first = std::move(gen.logits_filter), filter = std::move(filter)](std::span<float> logits) {
    if (first) first(logits);
    filter(logits);
  };
  gen.on_token = [first = std::move(gen.on_token), on_token = std::move(on_token)](int32_t id) {
    if (first) first(id);
    on_token(id);
  };
}

}  // namespace

Generation::Generation(decode::LoadedModel& model, Metrics& metrics, GenerationOptions options)
    : model_(model),
      metrics_(metrics),
      options_(std::move(options)),
      // Ids the tokenizer can decode (a model's padded logit rows are not tokens).
      limits_{options_.model_id,
              std::min<int64_t>(model.model().config().n_vocab, int64_t(model.tokenizer().size()))},
      json_vocab_(model.tokenizer()),
      warmup_(model.model(), options_.warmup_after_s),
      session_(options_.parallel > 1
                   ? nullptr
                   : std::make_unique<decode::Session>(
                         model.model(), model.tokenizer(),
                         decode::SessionOptions{.n_ctx = model.ctx(), .snapshot_prompt = true, .spec = options_.spec})),
      batch_(options_.parallel > 1
                 ? std::make_unique<BatchLoop>(model.model(), model.tokenizer(),
                                               decode::SessionOptions{.n_ctx = model.ctx(), .spec = options_.spec},
                                               options_.parallel, options_.batch, &warmup_)
                 : nullptr),
      scheduler_(options_.queue, options_.parallel) {}

LiveGauges Generation::gauges() const {
  LiveGauges g{scheduler_.queued(), scheduler_.capacity(), scheduler_.running(), scheduler_.workers(), {}, {}};
  for (const Job::Progress& p : scheduler_.progress()) g.sequences.push_back({p.sequence, p.tokens, p.decode_tok_per_s});
  if (const auto snap = model_.model().expert_source().snapshot()) g.expert_cache = snap->stats;
  g.warmup_windows = warmup_.windows();
  g.warmup_seconds = warmup_.seconds();
  return g;
}

decode::GenerateParams Generation::params_for(const GenerationRequest& r,
                                              size_t prompt_tokens) const {
  const int64_t ctx = model_.ctx();
  const int64_t n = int64_t(prompt_tokens);
  if (n == 0) throw ApiError(400, "The prompt is empty: there is nothing to continue.", "prompt",
                             "empty_prompt");
  if (n >= ctx || (r.max_tokens_given && r.gen.max_tokens > ctx - n))
    throw ApiError(400,
                   cat("This model's maximum context length is ", ctx, " tokens. However, you "
                       "requested ",
                       // Unsigned: max_tokens may be as large as int64 allows, n is positive.
                       r.max_tokens_given ? cat(uint64_t(n) + uint64_t(r.gen.max_tokens)) : cat(n),
                       " tokens (", n, " in the prompt",
                       r.max_tokens_given ? cat(", ", r.gen.max_tokens, " in the completion") : "",
                       "). Please shorten the prompt or lower max_tokens."),
                   "messages", "context_length_exceeded");
  decode::GenerateParams gen = r.gen;
  gen.batch = options_.batch;
  // Without a seed every request samples differently, as clients expect; with one it is
  // reproducible.
  gen.sampling.seed = r.seed ? *r.seed : std::random_device{}();
  if (!r.logit_bias.empty())
    gen.logits_filter = [bias = r.logit_bias](std::span<float> logits) {
      for (const auto& [id, b] : bias) logits[size_t(id)] += b;
    };
  return gen;
}

std::shared_ptr<Job> Generation::start(const std::vector<int32_t>& prompt,
                                       decode::GenerateParams gen, Clock::time_point deadline) {
  auto job = std::make_shared<Job>(
      [this, prompt, gen = std::move(gen)](Job& self) mutable {
        gen.should_stop = [&self] { return self.should_stop(); };
        gen.on_token = [first = std::move(gen.on_token), &self](int32_t id) {
          if (first) first(id);
          self.count_token();
        };
        decode::GenerateResult result;
        try {
          const auto emit = [&self](const std::string& piece) { self.emit(piece); };
          if (batch_) {
            result = batch_->run(prompt, gen, emit);
          } else {
            warmup_.before_request();
            struct Active {
              WarmUp& warmup;
              ~Active() { warmup.after_window(); }
            } active{warmup_};
            result = session_->generate(prompt, gen, emit);
          }
        } catch (const std::exception&) {
          metrics_.count_generation({}, "error");
          throw;
        }
        metrics_.count_generation(result.telemetry, generation_label(result, self.cancelled()));
        std::fprintf(stderr, "[strata] %s\n", decode::format_telemetry(result.telemetry).c_str());
        return result;
      },
      deadline);
  switch (scheduler_.submit(job)) {
    case Scheduler::Admission::Accepted: break;
    case Scheduler::Admission::Full:
      metrics_.count_rejection();
      throw ApiError(429,
                     cat("The server is busy: ", scheduler_.capacity(),
                         " requests are already waiting. Retry later."),
                     "", "queue_full", "rate_limit_error");
    case Scheduler::Admission::Closed:
      throw ApiError(503, "The server is shutting down.", "", "shutting_down", "server_error");
  }
  const Job::Phase phase = job->wait_started(deadline);
  // dropped() is settled only once the job is Done.
  const bool never_ran = phase == Job::Phase::Queued || (phase == Job::Phase::Done && job->dropped());
  if (!never_ran) return job;
  job->cancel();
  if (phase == Job::Phase::Done && !job->expired())
    throw ApiError(503, "The server is shutting down.", "", "shutting_down", "server_error");
  throw ApiError(503,
                 cat("The request waited ", options_.timeout_s,
                     " s (--timeout) in the queue without starting."),
                 "", "queue_timeout", "server_error");
}

Clock::time_point Generation::deadline() const {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(options_.timeout_s));
}

std::string Generation::render(const ChatRequest& r, const ChatPlan& plan) const {
  try {
    return model_.render_chat(r.messages, plan.tools, true, plan.template_kwargs);
  } catch (const Error& e) {
    throw ApiError(400, cat("The messages do not fit the model's chat template: ", e.what()),
                   "messages", "invalid_value");
  }
}

// How much of the prompt the next turn will repeat, in tokens: the prompt cache keeps the state
// there. The next turn renders this conversation, then this reply in the template's own way, which
// need not match the generation prompt (Qwen3's drops the empty <think> block that
// enable_thinking=false writes there), so the answer is the prompt's common prefix with a
// rendering of a conversation that goes on past a reply.
int64_t Generation::conversation_end(const ChatRequest& r, const ChatPlan& plan,
                                     const std::vector<int32_t>& prompt) const {
  nlohmann::ordered_json next = r.messages;
  next.push_back({{"role", "assistant"}, {"content", "."}});
  next.push_back({{"role", "user"}, {"content", "."}});
  std::vector<int32_t> later;
  try {
    later = model_.encode(model_.render_chat(next, plan.tools, false, plan.template_kwargs));
  } catch (const Error&) {
    return -1;
  }
  size_t common = 0;
  while (common < later.size() && common < prompt.size() && later[common] == prompt[common]) ++common;
  return int64_t(common);
}

int64_t Generation::count_chat_tokens(const ChatRequest& r) const {
  const ChatPlan plan = plan_chat(r, json_vocab_);
  return int64_t(model_.encode(render(r, plan)).size());
}

StartedChat Generation::start_chat(const ChatRequest& r, Clock::time_point deadline) {
  const ChatPlan plan = plan_chat(r, json_vocab_);
  const std::string text = render(r, plan);
  const auto prompt = model_.encode(text);
  decode::GenerateParams gen = params_for(r, prompt.size());
  gen.snapshot_at = conversation_end(r, plan, prompt);
  const decode::ThinkingStart thinking = decode::thinking_start(text, model_.template_thinks());
  if (r.thinking_budget &&
      (thinking == decode::ThinkingStart::MayOpen || thinking == decode::ThinkingStart::Inside)) {
    std::shared_ptr<decode::ThinkingBudget> budget;
    try {
      budget = std::make_shared<decode::ThinkingBudget>(model_.tokenizer(), thinking, *r.thinking_budget);
    } catch (const Error& e) {
      throw ApiError(400, e.what(), "thinking_token_budget", "invalid_value");
    }
    add_hooks(gen, [budget](std::span<float> logits) { budget->filter(logits); },
              [budget](int32_t id) { budget->accept(id); });
  }
  if (plan.constraint) {
    // The reply must close within max_tokens and the context, whichever ends it first.
    plan.constraint->set_token_budget(std::min(gen.max_tokens, model_.ctx() - int64_t(prompt.size())));
    add_hooks(gen, [constraint = plan.constraint](std::span<float> logits) { constraint->apply(logits); },
              [constraint = plan.constraint](int32_t id) { constraint->accept(id); });
  }
  return {start(prompt, std::move(gen), deadline),
          std::make_shared<ReplyReader>(thinking, plan.read_tool_calls, random_salt()),
          int64_t(prompt.size())};
}

void Generation::chat(const httplib::Request& req, httplib::Response& res) {
  const auto until = deadline();
  const ChatRequest r = parse_chat_request(req.body, limits_);
  const StartedChat started = start_chat(r, until);
  const auto& job = started.job;
  const auto& reader = started.reader;
  const ResponseHeader head = new_header("chatcmpl-", options_.model_id);

  if (!r.stream) {
    hold_status(*job);
    respond(res, job, json_writer([head, reader](const decode::GenerateResult& result) {
              reader->feed(result.text);
              reader->finish();
              Json out = chat_completion(head, chat_message(*reader),
                                         finish_reason(result.finish, reader->has_tool_calls()),
                                         usage_of(result.telemetry));
              out["timings"] = timings_json(result.telemetry);
              return out;
            }, error_body));
    return;
  }
  const auto chunks = [head](const std::vector<Json>& deltas) {
    std::vector<Json> out;
    for (const auto& d : deltas) out.push_back(chat_chunk(head, d, ""));
    return out;
  };
  respond(res, job,
          sse_writer(
              sse_event(chat_chunk(head, {{"role", "assistant"}, {"content", ""}}, "")),
              [reader, chunks](const std::string& text) { return chunks(chat_deltas(reader->feed(text))); },
              [head, reader, chunks](const decode::GenerateResult& result) {
                auto out = chunks(chat_deltas(reader->finish()));
                out.push_back(chat_chunk(head, Json::object(),
                                         finish_reason(result.finish, reader->has_tool_calls())));
                out.back()["timings"] = timings_json(result.telemetry);
                return out;
              },
              r.include_usage ? std::function([head](const Usage& u) {
                return chat_usage_chunk(head, u);
              })
                              : nullptr));
}

void Generation::completion(const httplib::Request& req, httplib::Response& res) {
  const auto until = deadline();
  CompletionRequest r = parse_completion_request(req.body, limits_);
  std::vector<int32_t> prompt;
  std::string echo;
  if (r.prompt_tokens) {
    prompt = *r.prompt_tokens;
    if (r.echo) {
      const std::vector<uint32_t> ids(prompt.begin(), prompt.end());
      echo = model_.tokenizer().decode(ids);
    }
  } else {
    prompt = model_.encode(r.prompt);
    if (r.echo) echo = r.prompt;
  }
  auto job = start(prompt, params_for(r, prompt.size()), until);
  const ResponseHeader head = new_header("cmpl-", options_.model_id);
  if (!r.stream) {
    hold_status(*job);
    respond(res, job, json_writer([head, echo](const decode::GenerateResult& result) {
              Json out = text_completion(head, echo + result.text, finish_reason(result.finish, false),
                                         usage_of(result.telemetry));
              out["timings"] = timings_json(result.telemetry);
              return out;
            }, error_body));
    return;
  }
  respond(res, job,
          sse_writer(
              echo.empty() ? "" : sse_event(text_chunk(head, echo, "")),
              [head](const std::string& text) {
                return std::vector<Json>{text_chunk(head, text, "")};
              },
              [head](const decode::GenerateResult& result) {
                Json last = text_chunk(head, "", finish_reason(result.finish, false));
                last["timings"] = timings_json(result.telemetry);
                return std::vector<Json>{last};
              },
              r.include_usage ? std::function([head](const Usage& u) {
                return text_usage_chunk(head, u);
              })
                              : nullptr));
}

}  // namespace strata::server
