// The one-page chat UI served at `/`: plain HTML, CSS and JavaScript in one string, no external
// resources and no build step. It streams replies from /v1/chat/completions with fetch and an
// SSE reader, keeps the conversation client-side (the server's prompt cache makes each turn cost
// only its new tokens), and has a system prompt, a stop button and the usual sampling knobs.
// Under each reply it shows the reply's telemetry; beside the chat, a live expert-cache panel
// (chat_panel.cpp) fed from GET /expert-cache.
#pragma once

#include <string_view>

namespace strata::server {

std::string_view chat_page_html();

// The expert-cache panel's script (chat_panel.cpp), part of the page.
std::string_view cache_panel_script();

}  // namespace strata::server
