#include "cli/route_flags.h"

#include <cstdio>

#include "experts/pack.h"
#include "model/route_control.h"

namespace strata::cli {

void add_route_flags(CLI::App* cmd, RouteFlags& f, bool with_history) {
  cmd->add_option("--record-route", f.record, "Record every token's routing per layer to this trace file");
  cmd->add_option("--route-trace", f.trace,
                  "Route by this trace instead of the router (benchmarking with realistic locality)");
  cmd->add_option("--expert-profile", f.profile,
                  "Expert profile for the start-up fill (default: PACK.profile when present)");
  if (with_history)
    cmd->add_flag("--no-history", f.no_history, "Neither load nor save the usage history (PACK.history)");
  cmd->add_flag("--ccr", f.ccr.enabled,
                "Cache-conditional routing: resident experts may win close calls (default: exact routing)");
  cmd->add_option("--ccr-m", f.ccr.m, "--ccr: only the router's top M may be substituted in")
      ->capture_default_str();
  cmd->add_option("--ccr-lambda", f.ccr.lambda, "--ccr: logit bonus of a resident expert")->capture_default_str();
  cmd->add_option("--ccr-rprot", f.ccr.r_prot, "--ccr: ranks below this are never replaced")
      ->capture_default_str();
}

void install_routing(model::Model& m, const RouteFlags& f, const std::string& pack_option) {
  const bool streams = m.expert_stats().has_value();
  const std::string pack = streams ? experts::pack_path_for(m.reader(), pack_option) : "";
  model::RouteOptions o{.record_path = f.record, .trace_path = f.trace, .ccr = f.ccr};
  if (streams && !f.no_history) o.history_path = pack + ".history";
  const bool needed = !o.record_path.empty() || !o.trace_path.empty() || o.ccr.enabled || !o.history_path.empty();
  if (!needed) return;
  auto control = std::make_unique<model::RouteControl>(m.config(), m.renormalize_topk(),
                                                      model::route_model_id(m.config()), o);
  if (streams) {
    const size_t pinned = model::fill_from_profile(m, pack, f.profile, control->history());
    if (pinned > 0) std::fprintf(stderr, "[strata] start-up fill: %zu experts pinned\n", pinned);
  }
  m.set_route_control(std::move(control));
}

void finish_routing(model::Model& m) {
  model::RouteControl* control = m.route_control();
  if (!control) return;
  control->finish();
}

}  // namespace strata::cli
