// The routing and start-up flags `strata run`, `strata bench` and `strata profile` share
// (docs/EXPERT_CACHE.md, "Routing controls"), and how they become a model::RouteControl: the
// trace to replay or record, cache-conditional routing, the usage history next to the pack and
// the start-up fill from the profile blended with it.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "model/model.h"
#include "route/ccr.h"

namespace strata::cli {

struct RouteFlags {
  std::string record;   // --record-route
  std::string trace;    // --route-trace
  std::string profile;  // --expert-profile
  bool no_history = false;
  route::CcrParams ccr;
};

// with_history: also --no-history (a benchmark never keeps a history, so it omits it).
void add_route_flags(CLI::App* cmd, RouteFlags& flags, bool with_history = true);

// Installs the model's RouteControl from the flags: the usage history (PACK.history) when the
// experts stream, then the start-up fill. `pack_option` is the --pack given (may be empty).
// Prints what it did to stderr. Throws strata::Error.
void install_routing(model::Model& model, const RouteFlags& flags, const std::string& pack_option);

// Saves the usage history and closes a recorded trace (at the end of a run or a server).
void finish_routing(model::Model& model);

}  // namespace strata::cli
