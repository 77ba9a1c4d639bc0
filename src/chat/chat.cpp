#include "chat/chat.h"

#include "util/error.h"

namespace strata::chat {

namespace {

using ojson = nlohmann::ordered_json;

ojson normalize_message(const ojson& m, size_t i) {
  const std::string where = cat("messages[", i, "]");
  if (!m.is_object()) fail(where, ": expected an object, got ", m.type_name());
  if (!m.contains("role") || !m["role"].is_string()) fail(where, ": \"role\" must be a string");
  ojson out = m;
  if (!out.contains("content") || out["content"].is_null()) out["content"] = "";
  if (!out.contains("tool_calls") || out["tool_calls"].is_null()) return out;
  if (!out["tool_calls"].is_array()) fail(where, ".tool_calls: expected an array");
  for (size_t j = 0; j < out["tool_calls"].size(); ++j) {
    ojson& call = out["tool_calls"][j];
    const std::string call_where = cat(where, ".tool_calls[", j, "]");
    if (!call.is_object()) fail(call_where, ": expected an object");
    // OpenAI nests name and arguments under "function"; some clients put them at the top.
    ojson& fn = call.contains("function") && call["function"].is_object() ? call["function"] : call;
    const std::string fn_where = &fn == &call ? call_where : call_where + ".function";
    if (!fn.contains("arguments") || !fn["arguments"].is_string()) continue;
    const std::string& text = fn["arguments"].get_ref<const std::string&>();
    ojson parsed = ojson::parse(text, nullptr, false);
    if (parsed.is_discarded() || !parsed.is_object())
      fail(fn_where, ".arguments: expected a JSON object (as text or as an object), got ",
           text.size() > 60 ? text.substr(0, 60) + "..." : text);
    fn["arguments"] = std::move(parsed);
  }
  return out;
}

}  // namespace

ojson chat_variables(const ojson& messages, const ojson& tools, bool add_generation_prompt, const ojson& extra,
                     const std::string& bos_token, const std::string& eos_token) {
  if (!messages.is_array()) fail("messages: expected an array, got ", messages.type_name());
  if (!tools.is_null() && !tools.is_array()) fail("tools: expected an array or null, got ", tools.type_name());
  if (!extra.is_null() && !extra.is_object()) fail("chat template variables: expected an object, got ", extra.type_name());
  ojson vars = ojson::object();
  ojson& msgs = vars["messages"] = ojson::array();
  for (size_t i = 0; i < messages.size(); ++i) msgs.push_back(normalize_message(messages[i], i));
  vars["tools"] = tools;
  vars["documents"] = nullptr;
  vars["add_generation_prompt"] = add_generation_prompt;
  vars["bos_token"] = bos_token;
  vars["eos_token"] = eos_token;
  if (extra.is_object())
    for (const auto& [k, v] : extra.items()) {
      if (vars.contains(k)) fail("chat template variables: \"", k, "\" is set by the renderer and cannot be overridden");
      vars[k] = v;
    }
  return vars;
}

std::string render_chat(const Template& tmpl, const ojson& messages, const ojson& tools, bool add_generation_prompt,
                        const ojson& extra, const std::string& bos_token, const std::string& eos_token) {
  return tmpl.render(chat_variables(messages, tools, add_generation_prompt, extra, bos_token, eos_token));
}

std::string render_chat(const std::string& tmpl, const ojson& messages, const ojson& tools, bool add_generation_prompt,
                        const ojson& extra, const std::string& bos_token, const std::string& eos_token) {
  return render_chat(Template(tmpl), messages, tools, add_generation_prompt, extra, bos_token, eos_token);
}

}  // namespace strata::chat
