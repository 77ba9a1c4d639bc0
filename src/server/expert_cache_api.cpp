#include "server/expert_cache_api.h"

#include <chrono>

#include "server/encode.h"

namespace strata::server {

void expert_cache(const decode::LoadedModel& model, const httplib::Request&, httplib::Response& res) {
  const model::Model& m = model.model();
  Json out = {{"streamed", false}, {"description", m.experts_description()}};
  if (const auto snap = m.expert_source().snapshot()) {
    const experts::CacheStats& s = snap->stats;
    out["streamed"] = true;
    out["time_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    out["windows"] = snap->windows;
    out["hits"] = s.hits;
    out["misses"] = s.misses;
    out["hit_rate"] = s.hit_rate();
    out["bytes_read"] = s.bytes_read;
    out["read_seconds"] = s.read_seconds;
    out["stall_seconds"] = s.stall_seconds;
    out["evictions"] = s.evictions;
    out["h2d_bytes"] = s.h2d_bytes;
    out["h2d_seconds"] = s.h2d_seconds;
    out["handshakes"] = s.handshakes;
    out["handshake_seconds"] = s.handshake_seconds;
    out["host_hits"] = s.host_hits;
    out["host_reads"] = s.host_reads;
    out["read_ahead_bytes"] = s.read_ahead_bytes;
    out["read_ahead_useful_bytes"] = s.read_ahead_useful_bytes;
    out["read_ahead_value"] = s.read_ahead_value();
    out["n_layers"] = snap->n_layers;
    out["n_experts"] = snap->n_experts;
    Json layers = Json::array();
    for (int il = 0; il < snap->n_layers; ++il) {
      std::string row(size_t(snap->n_experts), '0');
      for (int e = 0; e < snap->n_experts; ++e)
        if (snap->resident[size_t(il) * size_t(snap->n_experts) + size_t(e)]) row[size_t(e)] = '1';
      layers.push_back(std::move(row));
    }
    out["resident"] = std::move(layers);
  }
  res.set_content(to_text(out), "application/json");
}

}  // namespace strata::server
