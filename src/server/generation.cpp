#include "server/generation.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include "server/api_error.h"
#include "server/chat_reply.h"
#include "server/encode.h"
#include "server/http_server.h"
#include "util/error.h"

namespace strata::server {

namespace {

// How long a response may stay silent. A write is the only way to learn that the client has
// gone, so a quiet stretch (a long prefill, a wait in the queue) still writes something: an SSE
// comment, or a space before a JSON body, which JSON parsers skip.
constexpr auto kHeartbeat = std::chrono::seconds(1);

// Not "application/json" exactly: httplib gzips that content type, and a compressor would hold
// the heartbeat bytes back. text/event-stream is never compressed.
constexpr const char* kJsonType = "application/json; charset=utf-8";
constexpr const char* kSseType = "text/event-stream";

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

ApiError internal_error(const std::string& what) {
  return ApiError(500, cat("The generation failed: ", what), "", "internal_error", "server_error");
}

// What a response needs from a finished job: its result, or the error to report.
const decode::GenerateResult& finished(const Job& job) {
  if (!job.result()) throw internal_error(job.error());
  return *job.result();
}

// How a response is written while its job runs.
struct Writer {
  const char* content_type;
  std::string opening;    // written at once
  std::string heartbeat;  // written after kHeartbeat without news
  std::function<std::string(const std::string& text)> part;  // a batch of streamed text
  std::function<std::string(const Job& job)> closing;       // once the job is done
};

// Drives a started job to the client. A failed write cancels the job.
void respond(httplib::Response& res, std::shared_ptr<Job> job, Writer writer) {
  res.set_header("Cache-Control", "no-cache");
  const char* content_type = writer.content_type;
  res.set_chunked_content_provider(
      content_type,
      [job, writer = std::move(writer)](size_t, httplib::DataSink& sink) {
        const auto& opening = writer.opening;
        if (!opening.empty() && !sink.write(opening.data(), opening.size())) {
          job->cancel();
          return false;
        }
        std::vector<std::string> pieces;
        for (bool more = true; more;) {
          pieces.clear();
          more = job->next(pieces, Clock::now() + kHeartbeat);
          std::string text;
          for (const auto& p : pieces) text += p;
          std::string out = !text.empty() ? writer.part(text) : more ? writer.heartbeat : "";
          if (!more) out += writer.closing(*job);
          if (!out.empty() && !sink.write(out.data(), out.size())) {
            job->cancel();
            return false;
          }
        }
        sink.done();
        return true;
      },
      [job](bool success) {
        if (!success) job->cancel();
      });
}

// How long a non-streaming response holds its status line while the job runs, so that a
// generation that fails early (an expert record that cannot be read) answers with a 5xx rather
// than a 200 whose body is an error. A longer job then goes on as json_writer says.
constexpr auto kStatusHold = std::chrono::seconds(10);

// Waits (up to kStatusHold) for a non-streaming job, watching the client's connection meanwhile:
// throws the job's error as a 500 if it failed, cancels it if the client hung up.
void hold_status(Job& job) {
  const auto until = Clock::now() + kStatusHold;
  std::vector<std::string> pieces;  // a non-streaming reply takes its text from the result
  while (Clock::now() < until) {
    pieces.clear();
    if (!job.next(pieces, std::min(until, Clock::now() + kHeartbeat))) {
      finished(job);
      return;
    }
    if (!HttpServer::client_connected()) {
      job.cancel();
      return;
    }
  }
}

// A non-streaming response: spaces while the job runs, then the JSON body from the result.
Writer json_writer(std::function<Json(const decode::GenerateResult&)> body) {
  return {kJsonType, "", " ", [](const std::string&) { return std::string(" "); },
          [body = std::move(body)](const Job& done) {
            try {
              return to_text(body(finished(done)));
            } catch (const ApiError& e) {
              return to_text(error_body(e));
            }
          }};
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

}  // namespace

Generation::Generation(decode::LoadedModel& model, Metrics& metrics, GenerationOptions options)
    : model_(model),
      metrics_(metrics),
      options_(std::move(options)),
      // Ids the tokenizer can decode (a model's padded logit rows are not tokens).
      limits_{options_.model_id,
              std::min<int64_t>(model.model().config().n_vocab, int64_t(model.tokenizer().size()))},
      json_vocab_(model.tokenizer()),
      session_(model.model(), model.tokenizer(), {.n_ctx = model.ctx(), .snapshot_prompt = true, .spec = options_.spec}),
      scheduler_(options_.queue) {}

LiveGauges Generation::gauges() const {
  return {scheduler_.queued(), scheduler_.capacity(), scheduler_.running()};
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
        decode::GenerateResult result;
        try {
          result = session_.generate(prompt, gen, [&self](const std::string& piece) {
            self.emit(piece);
          });
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

void Generation::chat(const httplib::Request& req, httplib::Response& res) {
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(options_.timeout_s));
  const ChatRequest r = parse_chat_request(req.body, limits_);
  const ChatPlan plan = plan_chat(r, json_vocab_);
  std::string text;
  try {
    text = model_.render_chat(r.messages, plan.tools, true, plan.template_kwargs);
  } catch (const Error& e) {
    throw ApiError(400, cat("The messages do not fit the model's chat template: ", e.what()),
                   "messages", "invalid_value");
  }
  const auto prompt = model_.encode(text);
  decode::GenerateParams gen = params_for(r, prompt.size());
  if (plan.constraint) {
    gen.logits_filter = [bias = std::move(gen.logits_filter),
                         constraint = plan.constraint](std::span<float> logits) {
      if (bias) bias(logits);
      constraint->apply(logits);
    };
    gen.on_token = [constraint = plan.constraint](int32_t id) { constraint->accept(id); };
  }
  auto job = start(prompt, std::move(gen), deadline);
  const ResponseHeader head = new_header("chatcmpl-", options_.model_id);
  auto reader = std::make_shared<ReplyReader>(plan.read_tool_calls, random_salt());

  if (!r.stream) {
    hold_status(*job);
    respond(res, job, json_writer([head, reader](const decode::GenerateResult& result) {
              reader->feed(result.text);
              reader->finish();
              return chat_completion(head, reader->message(),
                                     finish_reason(result.finish, reader->has_tool_calls()),
                                     usage_of(result.telemetry));
            }));
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
              [reader, chunks](const std::string& text) { return chunks(reader->feed(text)); },
              [head, reader, chunks](const decode::GenerateResult& result) {
                auto out = chunks(reader->finish());
                out.push_back(chat_chunk(head, Json::object(),
                                         finish_reason(result.finish, reader->has_tool_calls())));
                return out;
              },
              r.include_usage ? std::function([head](const Usage& u) {
                return chat_usage_chunk(head, u);
              })
                              : nullptr));
}

void Generation::completion(const httplib::Request& req, httplib::Response& res) {
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(options_.timeout_s));
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
  auto job = start(prompt, params_for(r, prompt.size()), deadline);
  const ResponseHeader head = new_header("cmpl-", options_.model_id);
  if (!r.stream) {
    hold_status(*job);
    respond(res, job, json_writer([head, echo](const decode::GenerateResult& result) {
              return text_completion(head, echo + result.text,
                                     finish_reason(result.finish, false),
                                     usage_of(result.telemetry));
            }));
    return;
  }
  respond(res, job,
          sse_writer(
              echo.empty() ? "" : sse_event(text_chunk(head, echo, "")),
              [head](const std::string& text) {
                return std::vector<Json>{text_chunk(head, text, "")};
              },
              [head](const decode::GenerateResult& result) {
                return std::vector<Json>{text_chunk(head, "", finish_reason(result.finish, false))};
              },
              r.include_usage ? std::function([head](const Usage& u) {
                return text_usage_chunk(head, u);
              })
                              : nullptr));
}

}  // namespace strata::server
