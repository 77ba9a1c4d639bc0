// A model ready to generate from: the compute backend (decode/device.h), the weights, the tokenizer from the file's
// metadata and its chat template parsed once. `strata run` and `strata serve` both start here,
// so the flags they share (model path, device, threads, context) are checked in one place.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "chat/template.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace strata::decode {

struct LoadOptions {
  std::string path;
  std::string device = "auto";  // --device: cpu, cuda, cuda:N or auto
  int threads = 0;     // CPU backend threads; 0: one per hardware thread
  int64_t ctx = 4096;  // context positions a session gets
  std::string ctx_source = "--ctx";  // where ctx comes from, for its errors
  experts::SourceOptions experts;  // where the routed experts come from (docs/EXPERT_CACHE.md)
  std::string chat_template{};     // a Jinja chat template to use instead of the file's; empty: the file's
};

class LoadedModel {
 public:
  // Throws strata::Error for a missing file, a bad model, or a context below 1 or above the
  // model's own (the messages name the --ctx flag, which is where the value comes from).
  explicit LoadedModel(const LoadOptions& options);

  model::Model& model() { return *model_; }
  const model::Model& model() const { return *model_; }
  const tokenizer::Tokenizer& tokenizer() const { return *tokenizer_; }
  const std::string& path() const { return path_; }
  // "cpu (2 threads)", "cuda:0 (NVIDIA H200, ...)": what runs the model, for the start-up line.
  const std::string& device_description() const { return device_description_; }
  int64_t ctx() const { return ctx_; }
  // CPU threads the backend computes with (what --threads asked for, or one per hardware thread
  // when it was not given); 0 when a GPU computes.
  int threads() const { return threads_; }

  bool has_chat_template() const { return template_.has_value(); }
  // Whether the chat template writes a <think> reasoning block (Qwen3 and its family).
  bool template_thinks() const { return template_thinks_; }
  // The model's chat template over OpenAI-style messages (see chat/chat.h), with the file's
  // bos/eos tokens. Throws strata::Error when the model has no template or rendering fails.
  std::string render_chat(const nlohmann::ordered_json& messages,
                          const nlohmann::ordered_json& tools, bool add_generation_prompt,
                          const nlohmann::ordered_json& extra) const;

  // Text -> token ids with special tokens parsed, as prompts are.
  std::vector<int32_t> encode(const std::string& text) const;

 private:
  std::string path_;
  int64_t ctx_;
  std::unique_ptr<backend::Backend> backend_;
  std::string device_description_;
  int threads_ = 0;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::optional<chat::Template> template_;
  std::string bos_, eos_;
  bool template_thinks_ = false;
};

}  // namespace strata::decode
