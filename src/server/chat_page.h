// The one-page chat UI served at `/`: plain HTML, CSS and JavaScript in one string, no external
// resources and no build step. It streams replies from /v1/chat/completions with fetch and an
// SSE reader, keeps the conversation client-side (the server's prompt cache makes each turn cost
// only its new tokens), and has a system prompt, a stop button and the usual sampling knobs.
#pragma once

#include <string_view>

namespace strata::server {

std::string_view chat_page_html();

}  // namespace strata::server
