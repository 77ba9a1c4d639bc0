// GET /expert-cache: the expert cache as the chat page's live panel draws it, as JSON. The
// counters and residency come from the cache's last window boundary (ExpertSource::snapshot),
// so reading them never waits for or disturbs a running window:
//   {"streamed": true, "description": "streamed from PACK, budget ...", "time_s": 12.5,
//    "windows": 140, "hits": 812, "misses": 40, "hit_rate": 0.953, "bytes_read": 8600000,
//    "read_seconds": 0.007, "stall_seconds": 0.012, "evictions": 71,
//    "n_layers": 2, "n_experts": 8, "resident": ["01100010", "11000001"]}
// `time_s` is the server's monotonic clock, for rates between two readings; `resident[l][e]` is
// '1' when expert e of layer l holds a cache slot. With the experts mapped from the GGUF (every
// expert always at hand) it is {"streamed": false, "description": ...} and nothing else.
#pragma once

#include <httplib.h>

#include "decode/loaded_model.h"

namespace strata::server {

void expert_cache(const decode::LoadedModel& model, const httplib::Request& req, httplib::Response& res);

}  // namespace strata::server
