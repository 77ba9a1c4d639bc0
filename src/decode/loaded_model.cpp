#include "decode/loaded_model.h"

#include <filesystem>

#include "chat/chat.h"
#include "decode/device.h"
#include "tokenizer/vocab.h"
#include "util/error.h"

namespace strata::decode {

LoadedModel::LoadedModel(const LoadOptions& options) : path_(options.path), ctx_(options.ctx) {
  if (!std::filesystem::exists(path_)) fail("model file '", path_, "' does not exist");
  if (ctx_ < 1) fail(options.ctx_source, ": ", ctx_, " must be at least 1");
  decode::OpenedBackend opened =
      open_backend(parse_device(options.device), options.threads, path_, options.experts);
  backend_ = std::move(opened.backend);
  device_description_ = std::move(opened.description);
  threads_ = opened.threads;
  model_ = model::Model::load(path_, *backend_, options.experts);
  if (ctx_ > model_->config().n_ctx)
    fail(options.ctx_source, ": ", ctx_, " exceeds the model's context of ", model_->config().n_ctx);
  tokenizer_ =
      std::make_unique<tokenizer::Tokenizer>(tokenizer::read_vocab_metadata(model_->reader()));
  const auto& vocab = tokenizer_->vocab();
  const std::string& source = options.chat_template.empty() ? vocab.chat_template : options.chat_template;
  if (!source.empty()) template_.emplace(source);
  template_thinks_ = source.find("<think>") != std::string::npos;
  if (vocab.bos) bos_ = tokenizer_->piece(*vocab.bos);
  if (vocab.eos) eos_ = tokenizer_->piece(*vocab.eos);
}

std::string LoadedModel::render_chat(const nlohmann::ordered_json& messages,
                                     const nlohmann::ordered_json& tools,
                                     bool add_generation_prompt,
                                     const nlohmann::ordered_json& extra) const {
  if (!template_) fail(path_, " has no chat template");
  return chat::render_chat(*template_, messages, tools, add_generation_prompt, extra, bos_, eos_);
}

std::vector<int32_t> LoadedModel::encode(const std::string& text) const {
  const auto ids = tokenizer_->encode(text);
  return {ids.begin(), ids.end()};
}

}  // namespace strata::decode
