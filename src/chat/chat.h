// Renders a conversation with a model's own chat template, as Hugging Face's
// apply_chat_template does: the template sees `messages`, `tools`, `documents`,
// `add_generation_prompt`, `bos_token`, `eos_token` and any extra variables
// (enable_thinking, ...).
//
// Messages are OpenAI-style: {"role": "system"|"user"|"assistant"|"tool", "content": ...},
// assistants optionally with "reasoning_content" and "tool_calls":
// [{"type": "function", "function": {"name": ..., "arguments": ...}}]. Before rendering:
//  - a missing or null "content" becomes "" (OpenAI sends null beside tool_calls; templates
//    concatenate content as a string);
//  - tool-call "arguments" given as a JSON string are parsed into an object, since HF templates
//    expect a mapping (they iterate it or print it with tojson); a string that is not a JSON
//    object is an error;
//  - everything else passes through unchanged, key order included (nlohmann::ordered_json), so
//    tojson prints tool schemas in the order they were given, as Python's dicts do.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "chat/template.h"

namespace strata::chat {

// The template variables for one rendering. `tools` is an array or null; `extra` an object (or
// null) of further variables, which may not redefine the ones above. Throws strata::Error
// naming the offending message ("messages[2].tool_calls[0].function.arguments: ...").
nlohmann::ordered_json chat_variables(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                      bool add_generation_prompt, const nlohmann::ordered_json& extra,
                                      const std::string& bos_token, const std::string& eos_token);

// Template(tmpl).render(chat_variables(...)). Throws strata::Error for a template syntax error
// ("chat template L:C: ..."), bad messages, or a template's raise_exception (its own text).
std::string render_chat(const std::string& tmpl, const nlohmann::ordered_json& messages,
                        const nlohmann::ordered_json& tools, bool add_generation_prompt,
                        const nlohmann::ordered_json& extra, const std::string& bos_token,
                        const std::string& eos_token);

// The same with a template parsed once, for rendering many conversations.
std::string render_chat(const Template& tmpl, const nlohmann::ordered_json& messages,
                        const nlohmann::ordered_json& tools, bool add_generation_prompt,
                        const nlohmann::ordered_json& extra, const std::string& bos_token,
                        const std::string& eos_token);

}  // namespace strata::chat
