#include "server/respond.h"

#include <algorithm>
#include <vector>

#include "server/http_server.h"
#include "util/error.h"

namespace strata::server {

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

ApiError internal_error(const std::string& what) {
  return ApiError(500, cat("The generation failed: ", what), "", "internal_error", "server_error");
}

const decode::GenerateResult& finished(const Job& job) {
  if (!job.result()) throw internal_error(job.error());
  return *job.result();
}

void hold_status(Job& job) {
  constexpr auto kStatusHold = std::chrono::seconds(10);
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

Writer json_writer(std::function<Json(const decode::GenerateResult&)> body,
                   std::function<Json(const ApiError&)> error) {
  return {kJsonType, "", " ", [](const std::string&) { return std::string(" "); },
          [body = std::move(body), error = std::move(error)](const Job& done) {
            try {
              return to_text(body(finished(done)));
            } catch (const ApiError& e) {
              return to_text(error(e));
            }
          }};
}

std::string to_text(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string sse_event(const Json& j) { return "data: " + to_text(j) + "\n\n"; }

std::string sse_event(const std::string& name, const Json& j) {
  return "event: " + name + "\ndata: " + to_text(j) + "\n\n";
}

}  // namespace strata::server
