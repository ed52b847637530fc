#include "template/chat_formats.h"

#include <cstring>

namespace kiln {

namespace {

struct FormatName {
  ChatFormat f;
  const char* name;
};
constexpr FormatName kNames[] = {
    {ChatFormat::kLlama3, "llama3"}, {ChatFormat::kChatML, "chatml"}, {ChatFormat::kMistral, "mistral"},
    {ChatFormat::kGemma, "gemma"},   {ChatFormat::kPhi3, "phi3"},     {ChatFormat::kLlama2, "llama2"},
};

std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\v\f";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return {};
  const size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

std::string render_llama3(const std::vector<ChatMessage>& msgs, bool gen) {
  std::string out = msgs.empty() ? "" : "<|begin_of_text|>";  // the template writes it with the first message
  for (const auto& m : msgs)
    out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) + "<|eot_id|>";
  if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string render_chatml(const std::vector<ChatMessage>& msgs, bool gen) {
  std::string out;
  for (const auto& m : msgs) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

// System text is folded into the next user message (formats whose template has no system role).
std::string render_mistral(const std::vector<ChatMessage>& msgs) {
  std::string out = "<s>", system;
  for (const auto& m : msgs) {
    if (m.role == "system") {
      system += m.content + "\n\n";
    } else if (m.role == "user") {
      out += "[INST] " + system + m.content + " [/INST]";
      system.clear();
    } else {
      out += m.content + "</s>";
    }
  }
  return out;  // the template has no generation prompt: the answer follows "[/INST]"
}

std::string render_gemma(const std::vector<ChatMessage>& msgs, bool gen) {
  std::string out = "<bos>", system;
  for (const auto& m : msgs) {
    if (m.role == "system") {
      system += trim(m.content);
      continue;
    }
    const std::string role = m.role == "assistant" ? "model" : m.role;
    out += "<start_of_turn>" + role + "\n";
    std::string content = trim(m.content);
    if (!system.empty() && role != "model") {
      content = system + "\n\n" + content;
      system.clear();
    }
    out += content + "<end_of_turn>\n";
  }
  if (gen) out += "<start_of_turn>model\n";
  return out;
}

std::string render_phi3(const std::vector<ChatMessage>& msgs) {
  std::string out = "<s>";
  for (const auto& m : msgs) {
    if (m.role == "user") out += "<|user|>\n" + m.content + "<|end|>\n<|assistant|>\n";
    else if (m.role == "assistant") out += m.content + "<|end|>\n";
    else if (m.role == "system") out += "<|system|>\n" + m.content + "<|end|>\n";
  }
  return out;  // the template opens the assistant turn after every user message
}

std::string render_llama2(const std::vector<ChatMessage>& msgs) {
  std::string out;
  size_t first = 0;
  std::string system;
  bool has_system = false;
  if (!msgs.empty() && msgs[0].role == "system") {
    system = msgs[0].content;
    has_system = true;
    first = 1;
  }
  for (size_t i = first; i < msgs.size(); ++i) {
    std::string content = msgs[i].content;
    if (i == first && has_system) content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
    if (msgs[i].role == "user") out += "<s>[INST] " + trim(content) + " [/INST]";
    else if (msgs[i].role == "assistant") out += " " + trim(content) + " </s>";
  }
  return out;
}

}  // namespace

Result<ChatFormat> detect_chat_format(const std::string& src) {
  const auto has = [&](const char* s) { return src.find(s) != std::string::npos; };
  if (has("<|im_start|>")) return ChatFormat::kChatML;
  if (has("[INST]")) return has("<<SYS>>") ? ChatFormat::kLlama2 : ChatFormat::kMistral;
  if (has("<|start_header_id|>")) return ChatFormat::kLlama3;
  if (has("<start_of_turn>")) return ChatFormat::kGemma;
  if (has("<|user|>")) return ChatFormat::kPhi3;
  if (src.empty()) return make_error(ErrorCode::kNotFound, "the model has no chat template (tokenizer.chat_template)");
  return make_error(ErrorCode::kUnsupported,
                    "chat template not recognized: none of the markers <|im_start|> (chatml), [INST] (mistral; with "
                    "<<SYS>>: llama2), <|start_header_id|> (llama3), <start_of_turn> (gemma), <|user|> (phi3) occurs "
                    "in it; pass --chat-template NAME");
}

Result<ChatFormat> chat_format_from_name(const std::string& name) {
  for (const auto& n : kNames)
    if (name == n.name) return n.f;
  return make_error(ErrorCode::kInvalidArgument,
                    "unknown chat template '%s' (llama3, chatml, mistral, gemma, phi3, llama2)", name.c_str());
}

const char* chat_format_name(ChatFormat f) {
  for (const auto& n : kNames)
    if (f == n.f) return n.name;
  return "?";
}

const char* chat_format_bos_text(ChatFormat f) {
  switch (f) {
    case ChatFormat::kLlama3: return "<|begin_of_text|>";
    case ChatFormat::kChatML: return "";
    case ChatFormat::kGemma: return "<bos>";
    case ChatFormat::kMistral:
    case ChatFormat::kPhi3:
    case ChatFormat::kLlama2: return "<s>";
  }
  return "";
}

std::string apply_chat_template(ChatFormat f, const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  switch (f) {
    case ChatFormat::kLlama3: return render_llama3(messages, add_generation_prompt);
    case ChatFormat::kChatML: return render_chatml(messages, add_generation_prompt);
    case ChatFormat::kMistral: return render_mistral(messages);
    case ChatFormat::kGemma: return render_gemma(messages, add_generation_prompt);
    case ChatFormat::kPhi3: return render_phi3(messages);
    case ChatFormat::kLlama2: return render_llama2(messages);
  }
  return {};
}

}  // namespace kiln
