// Chat prompts end to end: `kiln chat` and `kiln run --chat` render conversations with the GGUF's own
// tokenizer.chat_template (through kiln's Jinja interpreter), --chat-template-file overrides it,
// --chat-template-kwargs adds variables, reasoning goes to stderr and back into the conversation as
// reasoning_content, template errors exit 1 with the template line and column, and files without a template fall
// back to a built-in family (or plain text) with a notice. The models are the random-weight llama fixture with
// metadata edited by the gguf Writer (a template added, two tokens turned into ChatML's markers).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "common/test_util.h"
#include "gguf/gguf.h"
#include "runtime/prompt.h"
#include "tokenizer/tokenizer.h"

namespace {

using kiln::test::CmdResult;
using kiln::test::run_kiln;
using json = nlohmann::ordered_json;

std::string base_model() { return kiln::test::data_path("models/fixture-llama-f16.gguf"); }

// A copy of `base` with tokenizer.chat_template = tmpl ("" : none) and, with chatml, tokens 990/991 renamed to
// <|im_start|>/<|im_end|> (control tokens).
void write_model(const std::string& out, const std::string& tmpl, bool chatml = false) {
  auto src = kiln::gguf::File::open(base_model());
  ASSERT_TRUE(src.is_ok()) << src.status().to_string();
  kiln::gguf::Writer w;
  for (const auto& kv : src->kvs()) {
    if (kv.key == "tokenizer.chat_template") continue;
    kiln::gguf::Value v = kv.value;
    if (chatml && kv.key == "tokenizer.ggml.tokens") {
      auto& a = std::get<kiln::gguf::Array>(v.v);
      a.items[990] = std::string("<|im_start|>");
      a.items[991] = std::string("<|im_end|>");
    }
    if (chatml && kv.key == "tokenizer.ggml.token_type") {
      auto& a = std::get<kiln::gguf::Array>(v.v);
      a.items[990] = int32_t{3};
      a.items[991] = int32_t{3};
    }
    w.set(kv.key, v);
  }
  if (!tmpl.empty()) w.set("tokenizer.chat_template", tmpl);
  for (const auto& t : src->tensors())
    ASSERT_TRUE(w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data).is_ok());
  ASSERT_TRUE(w.write(out).is_ok());
}

// A template in the shape of Qwen3's: roles in tags, the BOS text first, reasoning markers, a kwarg that opens the
// reasoning block in the generation prompt, reasoning_content of earlier replies shown in brackets.
const char* kTemplate =
    "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{% if m.reasoning_content is defined %}[r:{{ m.reasoning_content }}]{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% if think is defined and think %}<think>\n{% endif %}{% endif %}";

class CliChatTemplate : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(kiln::test::kiln_binary())) << "build kiln_cli first";
    dir_ = ::kiln::test::temp_dir() + "kiln_chatcli_" + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
    model_ = dir_ + "/with-template.gguf";
    write_model(model_, kTemplate);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string p = dir_ + "/" + name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  CmdResult chat(const std::string& args, const std::string& input) {
    return run_kiln("chat -t 1 --temp 0 --verbose-prompt -m '" + model_ + "' " + args, input);
  }
  std::string dir_, model_;
};

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

TEST_F(CliChatTemplate, ChatRendersTheModelsTemplate) {
  CmdResult r = chat("-n 4 --ignore-eos -sys 'be brief'", "hello\nagain\n");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err.find("no chat template"), std::string::npos) << r.err;  // no fallback notice
  EXPECT_EQ(count(r.err, "kiln chat: prompt (the model's chat template, "), 2u) << r.err;
  // bos_token is the BOS token's text; the first turn, then the second with the first reply in between.
  EXPECT_NE(r.err.find("tokens):\n<|begin_of_text|><system>be brief\n<user>hello\n<assistant>\n"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("<user>hello\n<assistant>"), r.err.rfind("<user>hello\n<assistant>")) << r.err;
  EXPECT_NE(r.err.find("\n<user>again\n<assistant>\n"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r.out;  // two replies
}

TEST_F(CliChatTemplate, BosIsNotDoubledWhenTheTemplateWritesIt) {
  // The fixture's tokenizer adds BOS: a template writing bos_token gives the same token count as one that does not.
  const std::string with = write("with.jinja", "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}");
  const std::string without = write("without.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}");
  CmdResult a = run_kiln("run -t 1 -n 1 --verbose-prompt -m '" + model_ + "' -p hello --chat-template-file '" + with + "'");
  CmdResult b = run_kiln("run -t 1 -n 1 --verbose-prompt -m '" + model_ + "' -p hello --chat-template-file '" + without + "'");
  CmdResult c = run_kiln("run -t 1 -n 1 --verbose-prompt -m '" + model_ + "' -p hello");
  ASSERT_EQ(a.rc, 0) << a.err;
  ASSERT_EQ(b.rc, 0) << b.err;
  ASSERT_EQ(c.rc, 0) << c.err;
  auto n_tokens = [](const std::string& err) {
    const size_t p = err.find(" tokens):");
    const size_t q = err.rfind(", ", p);
    return std::stoi(err.substr(q + 2, p - q - 2));
  };
  EXPECT_EQ(n_tokens(a.err), n_tokens(b.err)) << a.err << b.err;
  EXPECT_EQ(n_tokens(a.err), n_tokens(c.err)) << a.err << c.err;
}

TEST_F(CliChatTemplate, TemplateFileOverridesAndKwargsReachTheTemplate) {
  const std::string t = write("t.jinja", "{% for m in messages %}[{{ m.role }}|{{ m.content }}|{{ mood }}]{% endfor %}");
  CmdResult r = chat("-n 2 --ignore-eos --chat-template-file '" + t + "' --chat-template-kwargs '{\"mood\": \"calm\"}'", "hi\n");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("kiln chat: prompt (chat template " + t + ", "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tokens):\n[user|hi|calm]\n"), std::string::npos) << r.err;
  // Bad kwargs are refused before the model loads, naming the flag.
  for (const char* bad : {"'[1]'", "'{not json'", "'{\"messages\": 1}'"}) {
    CmdResult b = chat(std::string("--chat-template-kwargs ") + bad, "hi\n");
    EXPECT_EQ(b.rc, 1) << bad;
    EXPECT_NE(b.err.find("--chat-template-kwargs"), std::string::npos) << b.err;
    EXPECT_EQ(b.err.find("model:"), std::string::npos) << b.err;
  }
  // A missing file, and both template flags at once.
  CmdResult m = chat("--chat-template-file '" + dir_ + "/none.jinja'", "hi\n");
  EXPECT_EQ(m.rc, 1);
  EXPECT_NE(m.err.find("--chat-template-file: cannot open"), std::string::npos) << m.err;
  CmdResult both = chat("--chat-template-file '" + t + "' --chat-template chatml", "hi\n");
  EXPECT_EQ(both.rc, 1);
  EXPECT_NE(both.err.find("pass only one of --chat-template and --chat-template-file"), std::string::npos) << both.err;
  // --chat-template NAME still picks a built-in family over the model's template.
  CmdResult named = chat("-n 1 --chat-template llama3", "hi\n");
  ASSERT_EQ(named.rc, 0) << named.err;
  EXPECT_NE(named.err.find("kiln chat: prompt (built-in llama3, "), std::string::npos) << named.err;
  EXPECT_NE(named.err.find("<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"), std::string::npos) << named.err;
}

TEST_F(CliChatTemplate, ReasoningGoesToStderrAndIntoReasoningContent) {
  // think=true opens the reasoning block in the generation prompt: the random model never closes it, so the whole
  // reply is reasoning: shown on stderr, an empty content line on stdout, and the next turn carries it as
  // reasoning_content (the template prints it in brackets) with empty content.
  CmdResult r = chat("-n 3 --ignore-eos --chat-template-kwargs '{\"think\": true}'", "hello\nagain\n");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("<user>hello\n<assistant><think>\n"), std::string::npos) << r.err;
  EXPECT_EQ(count(r.err, "[reasoning] "), 2u) << r.err;
  EXPECT_EQ(r.out, "\n\n");
  EXPECT_NE(r.err.find("<user>hello\n<assistant>[r:"), std::string::npos) << r.err;
}

TEST_F(CliChatTemplate, TemplateErrorsExitWithThePosition) {
  const std::string raising =
      write("raise.jinja", "{% for m in messages %}\n{% if m.role == 'system' %}{{ raise_exception('no system role') }}"
                           "{% endif %}{{ m.content }}{% endfor %}");
  CmdResult r = chat("--chat-template-file '" + raising + "' -sys x", "hi\n");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("raise.jinja: line 2, column "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no system role"), std::string::npos) << r.err;
  CmdResult rr = run_kiln("run -t 1 -m '" + model_ + "' -p hi -sys x --chat-template-file '" + raising + "'");
  EXPECT_EQ(rr.rc, 1);
  EXPECT_NE(rr.err.find("raise.jinja: line 2, column "), std::string::npos) << rr.err;
  EXPECT_EQ(rr.out, "");
  // A template that does not parse is refused before the model loads.
  const std::string broken = write("broken.jinja", "{% for m in messages %}\n{{ m.content }\n");
  CmdResult b = chat("--chat-template-file '" + broken + "'", "hi\n");
  EXPECT_EQ(b.rc, 1);
  EXPECT_NE(b.err.find("broken.jinja: line 2, column "), std::string::npos) << b.err;
  EXPECT_EQ(b.err.find("model:"), std::string::npos) << b.err;
  // The model's own template broken: the error names the model's template and how to replace it.
  const std::string bad_model = dir_ + "/bad-template.gguf";
  write_model(bad_model, "{% if %}");
  CmdResult m = run_kiln("chat -t 1 -m '" + bad_model + "'", "hi\n");
  EXPECT_EQ(m.rc, 1);
  EXPECT_NE(m.err.find("tokenizer.chat_template: line 1, column "), std::string::npos) << m.err;
  EXPECT_NE(m.err.find("--chat-template-file FILE"), std::string::npos) << m.err;
}

TEST_F(CliChatTemplate, FilesWithoutATemplateFallBackWithANotice) {
  // ChatML tokens in the vocabulary: the built-in chatml family, announced.
  const std::string chatml = dir_ + "/chatml-no-template.gguf";
  write_model(chatml, "", /*chatml=*/true);
  CmdResult r = run_kiln("chat -t 1 -n 2 --ignore-eos --verbose-prompt -m '" + chatml + "'", "hi\n");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("kiln chat: the model has no chat template: using the built-in chatml format"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"), std::string::npos) << r.err;
  CmdResult run = run_kiln("run --chat -t 1 -n 2 --ignore-eos --verbose-prompt -m '" + chatml + "' -p hi");
  ASSERT_EQ(run.rc, 0) << run.err;
  EXPECT_NE(run.err.find("kiln run: the model has no chat template: using the built-in chatml format"), std::string::npos) << run.err;
  // A template file wins over the fallback (no notice).
  const std::string t = write("t.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}");
  CmdResult f = run_kiln("chat -t 1 -n 1 -m '" + chatml + "' --chat-template-file '" + t + "'", "hi\n");
  ASSERT_EQ(f.rc, 0) << f.err;
  EXPECT_EQ(f.err.find("no chat template"), std::string::npos) << f.err;
  // No template, no ChatML tokens: plain text (the existing mode), in run --chat too.
  CmdResult p = run_kiln("run --chat -t 1 -n 2 --verbose-prompt -m '" + base_model() + "' -p hi");
  ASSERT_EQ(p.rc, 0) << p.err;
  EXPECT_NE(p.err.find("kiln run: the model has no chat template and its vocabulary has no ChatML tokens: plain-text"),
            std::string::npos) << p.err;
  EXPECT_NE(p.err.find("User: hi\nAssistant:\n"), std::string::npos) << p.err;
}

TEST_F(CliChatTemplate, RunChatRendersOneUserMessage) {
  CmdResult r = run_kiln("run --chat -t 1 -n 3 --ignore-eos --temp 0 --verbose-prompt -m '" + model_ +
                         "' -p 'what is this' -sys 'be kind'");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("kiln run: prompt (the model's chat template, "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("<|begin_of_text|><system>be kind\n<user>what is this\n<assistant>\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("generated 3 tokens"), std::string::npos) << r.err;
  // Greedy: the same ids as feeding the rendered prompt's tokens by hand.
  CmdResult ids = run_kiln("run --chat -t 1 -n 3 --ignore-eos --temp 0 --ids -m '" + model_ + "' -p 'what is this' -sys 'be kind'");
  ASSERT_EQ(ids.rc, 0) << ids.err;
  CmdResult tok = run_kiln("tokenize -m '" + model_ + "' --ids --no-bos -p '<|begin_of_text|><system>be kind\n<user>what is this\n<assistant>'");
  ASSERT_EQ(tok.rc, 0) << tok.err;
  std::string list = tok.out.substr(1, tok.out.find(']') - 1);
  list.erase(std::remove(list.begin(), list.end(), ' '), list.end());
  CmdResult manual = run_kiln("run -t 1 -n 3 --ignore-eos --temp 0 --ids -m '" + model_ + "' --tokens " + list);
  ASSERT_EQ(manual.rc, 0) << manual.err;
  EXPECT_EQ(ids.out, manual.out);
  // -sys alone implies --chat; --chat needs a text prompt.
  CmdResult implied = run_kiln("run -t 1 -n 1 --verbose-prompt -m '" + model_ + "' -p q -sys s");
  ASSERT_EQ(implied.rc, 0) << implied.err;
  EXPECT_NE(implied.err.find("<system>s\n<user>q\n"), std::string::npos) << implied.err;
  CmdResult no_text = run_kiln("run --chat -t 1 -m '" + model_ + "' --tokens 1,2");
  EXPECT_EQ(no_text.rc, 1);
  EXPECT_NE(no_text.err.find("--chat"), std::string::npos) << no_text.err;
  CmdResult none = run_kiln("run --chat -t 1 -m '" + model_ + "'");
  EXPECT_EQ(none.rc, 1);
  EXPECT_NE(none.err.find("-p TEXT or -f FILE"), std::string::npos) << none.err;
}

TEST(CliChatDemo, RunChatOnTheEmbeddedModelIsPlainText) {
  CmdResult r = run_kiln("run --chat -t 1 -s 7 -p 'who is the lord' --verbose-prompt");
  if (r.rc != 0 && r.err.find("no model: pass -m FILE") != std::string::npos) GTEST_SKIP() << "skipped: no embedded model";
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("plain-text conversation"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("User: who is the lord\nAssistant:\n"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("User:"), std::string::npos) << r.out;  // the reply stops before the next turn
}

// ---- runtime/prompt's ChatPrompt directly (a vocabulary-only GGUF is enough)

std::unique_ptr<kiln::Tokenizer> tokenizer_of(const std::string& path) {
  auto f = kiln::gguf::File::open(path);
  EXPECT_TRUE(f.is_ok()) << f.status().to_string();
  auto t = kiln::Tokenizer::from_gguf(*f);
  EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  return std::move(t).value();
}

TEST(ChatPrompt, PathsAndReplies) {
  auto tok = tokenizer_of(base_model());
  const json msgs = json::parse(R"([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])");
  // No template: plain (allowed) or chatml.
  auto plain = kiln::ChatPrompt::create(*tok, {});
  ASSERT_TRUE(plain.is_ok());
  EXPECT_EQ(plain->path(), kiln::ChatPath::kPlain);
  EXPECT_EQ(*plain->render(msgs), "User: ab\nAssistant:");
  kiln::ChatPromptOptions o;
  o.allow_plain = false;
  auto chatml = kiln::ChatPrompt::create(*tok, o);
  ASSERT_TRUE(chatml.is_ok());
  EXPECT_EQ(chatml->path(), kiln::ChatPath::kBuiltin);
  EXPECT_EQ(*chatml->render(msgs), "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_NE(chatml->notice().find("no chat template"), std::string::npos);
  // A caller's template with reasoning markers and tools.
  o = {};
  o.template_source = "{% for m in messages %}{{ m.content[0].text }}{% endfor %}{{ tools | length }}<think>";
  o.template_name = "t.jinja";
  auto t = kiln::ChatPrompt::create(*tok, o);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t->path(), kiln::ChatPath::kCallerTemplate);
  EXPECT_TRUE(t->notice().empty());
  EXPECT_TRUE(t->has_reasoning());
  EXPECT_EQ(*t->render(msgs, json::parse(R"([{"type": "function", "function": {"name": "f"}}])")), "a1<think>");
  EXPECT_TRUE(t->prompt_opens_reasoning("x<think>\n"));
  EXPECT_FALSE(t->prompt_opens_reasoning("x<think>\n\n</think>\n\n"));
  auto reply = t->parse_reply("hmm</think>\n\nYes.", false, /*opened_reasoning=*/true);
  EXPECT_EQ(reply.reasoning_content, "hmm");
  EXPECT_EQ(reply.content, "Yes.");
  EXPECT_EQ(t->parse_reply("still thinking", false, true).reasoning_content, "still thinking");
  json m = t->assistant_message(reply);
  EXPECT_EQ(m.dump(), R"({"role":"assistant","content":"Yes.","reasoning_content":"hmm"})");
  // Errors are values with the position.
  auto r = t->render(json::array());
  EXPECT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("t.jinja: line 1, column "), std::string::npos) << r.status().to_string();
  o.template_source = "{% if %}";
  EXPECT_NE(kiln::check_chat_prompt_options(o).to_string().find("t.jinja: line 1, column "), std::string::npos);
  o = {};
  o.builtin = "nonsense";
  EXPECT_FALSE(kiln::check_chat_prompt_options(o).is_ok());
}

// ReplyStream: pushed one byte at a time, the deltas add up to parse_reply's split; tool calls come at finish().
struct Streamed {
  std::string reasoning, content;
  std::vector<kiln::tpl::ToolCall> calls;
  int reasoning_ends = 0;
};
Streamed stream_bytes(const kiln::ChatPrompt& p, const std::string& text, const kiln::ReplyContext& ctx) {
  kiln::ReplyStream rs(p, ctx);
  Streamed out;
  auto add = [&](const kiln::ReplyStream::Delta& d) {
    out.reasoning += d.reasoning;
    out.content += d.content;
    out.reasoning_ends += d.reasoning_ended;
    for (const auto& c : d.tool_calls) out.calls.push_back(c);
  };
  for (char c : text) add(rs.push(std::string(1, c)));
  add(rs.finish());
  return out;
}
Streamed stream_bytes(const kiln::ChatPrompt& p, const std::string& text, bool opened, bool tools) {
  kiln::ReplyContext ctx;
  ctx.opened_reasoning = opened;
  ctx.want_tools = tools;
  return stream_bytes(p, text, ctx);
}

TEST(ChatPrompt, ReplyStreamSplitsAsParseReply) {
  auto tok = tokenizer_of(base_model());
  kiln::ChatPromptOptions o;
  o.template_source = kiln::test::slurp(kiln::test::data_path("templates/Qwen-Qwen3-0.6B.jinja"));
  auto qwen = kiln::ChatPrompt::create(*tok, o);
  ASSERT_TRUE(qwen.is_ok()) << qwen.status().to_string();
  ASSERT_TRUE(qwen->has_reasoning());
  Streamed s = stream_bytes(*qwen, "<think>\nlet me see\n</think>\n\nThe answer <is> 4.", false, false);
  EXPECT_EQ(s.reasoning, "\nlet me see\n");
  EXPECT_EQ(s.content, "The answer <is> 4.");
  EXPECT_EQ(s.reasoning_ends, 1);
  // No reasoning block: all content, a '<' that is not the marker included.
  s = stream_bytes(*qwen, "<b>bold</b>", false, false);
  EXPECT_EQ(s.reasoning, "");
  EXPECT_EQ(s.content, "<b>bold</b>");
  // Tools: content before the call streams, the call comes at the end, text after a malformed block stays.
  const std::string call = "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  s = stream_bytes(*qwen, "<think>hm</think>" + call, false, true);
  EXPECT_EQ(s.reasoning, "hm");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].name, "get_weather");
  EXPECT_EQ(s.calls[0].arguments, "{\"city\":\"Paris\"}");
  const auto parsed = qwen->parse_reply("<think>hm</think>" + call, true);
  EXPECT_EQ(s.content, parsed.content);
  s = stream_bytes(*qwen, "x <tool_call>{not json</tool_call>", false, true);
  EXPECT_TRUE(s.calls.empty());
  EXPECT_EQ(s.content, "x <tool_call>{not json</tool_call>");
  // Without tools the same text is content.
  s = stream_bytes(*qwen, call, false, false);
  EXPECT_EQ(s.content, call);
  // The prompt opened the block (DeepSeek-R1): reasoning until the closing marker.
  s = stream_bytes(*qwen, "thinking</think>done", true, false);
  EXPECT_EQ(s.reasoning, "thinking");
  EXPECT_EQ(s.content, "done");
  // Llama 3.1: a bare JSON object opening the content is a call.
  o.template_source = kiln::test::slurp(kiln::test::data_path("templates/meta-llama-Llama-3.1-8B-Instruct.jinja"));
  auto llama = kiln::ChatPrompt::create(*tok, o);
  ASSERT_TRUE(llama.is_ok()) << llama.status().to_string();
  s = stream_bytes(*llama, "{\"name\": \"f\", \"parameters\": {\"a\": 1}}", false, true);
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].name, "f");
  EXPECT_EQ(s.content, "");
  s = stream_bytes(*llama, "Plain {braces} text", false, true);
  EXPECT_TRUE(s.calls.empty());
  EXPECT_EQ(s.content, "Plain {braces} text");
}

// A prompt that ends with the tool-call opener (Qwen3's Hermes "<tool_call>\n", from a prefill or the generation
// prompt), or with the opener less its trailing newline, opened a call: the reply, streamed or not, is read as its
// continuation. at_start formats (Llama 3.1) never count as opened.
TEST(ChatPrompt, APromptEndingInTheOpenerOpensTheCall) {
  auto tok = tokenizer_of(base_model());
  kiln::ChatPromptOptions o;
  o.template_source = kiln::test::slurp(kiln::test::data_path("templates/Qwen-Qwen3-0.6B.jinja"));
  auto qwen = kiln::ChatPrompt::create(*tok, o);
  ASSERT_TRUE(qwen.is_ok()) << qwen.status().to_string();
  ASSERT_NE(qwen->tool_format(), nullptr);
  ASSERT_EQ(qwen->tool_format()->opener(), "<tool_call>\n");
  const std::string base = "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n";
  const std::string body = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  std::string tail = "x";
  EXPECT_TRUE(qwen->prompt_opens_tool_call(base + "<tool_call>\n", &tail));
  EXPECT_EQ(tail, "");
  EXPECT_TRUE(qwen->prompt_opens_tool_call(base + "Let me check. <tool_call>", &tail));
  EXPECT_EQ(tail, "\n");
  EXPECT_TRUE(qwen->prompt_opens_tool_call(base + "<tool_call>"));
  for (const std::string& p : {base, base + "<tool_call>\n" + body, base + "</tool_call>", base + "<tool_call>\n\n",
                               base + "<tool_call> ", base + "tool_call>", std::string()})
    EXPECT_FALSE(qwen->prompt_opens_tool_call(p)) << p;
  // The reply to each prompt: the opener's rest, then the call (or prose, which stays the content).
  for (const bool exact : {true, false}) {
    kiln::ReplyContext ctx;
    ctx.want_tools = true;
    ctx.opened_tool_call = qwen->prompt_opens_tool_call(base + (exact ? "<tool_call>\n" : "<tool_call>"),
                                                        &ctx.opener_tail);
    ASSERT_TRUE(ctx.opened_tool_call);
    const std::string reply = (exact ? "" : "\n") + body;
    const auto parsed = qwen->parse_reply(reply, ctx);
    ASSERT_EQ(parsed.tool_calls.size(), 1u) << exact;
    EXPECT_EQ(parsed.tool_calls[0].name, "get_weather");
    EXPECT_EQ(parsed.tool_calls[0].arguments, "{\"city\":\"Paris\"}");
    EXPECT_EQ(parsed.content, "") << exact;
    Streamed s = stream_bytes(*qwen, reply, ctx);
    ASSERT_EQ(s.calls.size(), 1u) << exact;
    EXPECT_EQ(s.calls[0].name, "get_weather");
    EXPECT_EQ(s.calls[0].arguments, parsed.tool_calls[0].arguments);
    EXPECT_EQ(s.content, "") << exact;
    s = stream_bytes(*qwen, "\nNo call after all.", ctx);
    EXPECT_TRUE(s.calls.empty());
    EXPECT_EQ(s.content, qwen->parse_reply("\nNo call after all.", ctx).content);
    EXPECT_EQ(s.content, "\nNo call after all.");  // as written
    // Not opened, the same reply is the content.
    ctx.opened_tool_call = false;
    EXPECT_TRUE(qwen->parse_reply(reply, ctx).tool_calls.empty()) << exact;
  }
  o.template_source = kiln::test::slurp(kiln::test::data_path("templates/meta-llama-Llama-3.1-8B-Instruct.jinja"));
  auto llama = kiln::ChatPrompt::create(*tok, o);
  ASSERT_TRUE(llama.is_ok()) << llama.status().to_string();
  ASSERT_NE(llama->tool_format(), nullptr);
  ASSERT_TRUE(llama->tool_format()->at_start);
  EXPECT_FALSE(llama->prompt_opens_tool_call("<|start_header_id|>assistant<|end_header_id|>\n\n<|python_tag|>"));
  EXPECT_FALSE(llama->prompt_opens_tool_call("<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": "));
}

// gpt-oss's template (harmony): replies stream as parse_reply splits them, header texts never in a delta; a call
// comes at finish(); the reasoning budget's close ends the analysis message and starts the next; reasoning_content
// sent back reaches the template as its `thinking`, and a conversation with a call and its result renders as the
// template writes it.
TEST(ChatPrompt, HarmonyStreamsAndRendersCalls) {
  auto tok = tokenizer_of(base_model());
  kiln::ChatPromptOptions o;
  o.template_source = kiln::test::slurp(kiln::test::data_path("templates/openai-gpt-oss-120b.jinja"));
  auto g = kiln::ChatPrompt::create(*tok, o);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  ASSERT_TRUE(g->has_reasoning());
  ASSERT_NE(g->tool_format(), nullptr);
  EXPECT_EQ(g->tool_format()->name, "harmony");
  EXPECT_EQ(g->reasoning_close(), "<|end|><|start|>assistant");
  const std::string think = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant";
  const std::string two = think + "<|channel|>analysis<|message|> Again. <|end|><|start|>assistant<|channel|>final"
                                  "<|message|>The answer <is> 4.<|return|>";
  for (const bool tools : {false, true}) {
    Streamed s = stream_bytes(*g, two, false, tools);
    const auto parsed = g->parse_reply(two, tools);
    EXPECT_EQ(s.reasoning, "Think.\n\nAgain.");
    EXPECT_EQ(s.reasoning, parsed.reasoning_content);
    EXPECT_EQ(s.content, "The answer <is> 4.");
    EXPECT_EQ(s.content, parsed.content);
    EXPECT_EQ(s.reasoning_ends, 2);
    EXPECT_TRUE(s.calls.empty());
  }
  const std::string call = think + "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                                   "{\"city\": \"Paris\"}";
  Streamed s = stream_bytes(*g, call, false, true);
  EXPECT_EQ(s.reasoning, "Think.");
  EXPECT_EQ(s.content, "");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].name, "get_weather");
  EXPECT_EQ(s.calls[0].arguments, "{\"city\":\"Paris\"}");
  // a preamble streams before the call; a malformed call is content at the end
  s = stream_bytes(*g, "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to=functions.f"
                       "<|channel|>commentary json<|message|>{}", false, true);
  EXPECT_EQ(s.content, "Checking.");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].name, "f");
  s = stream_bytes(*g, think + "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\":", false, true);
  EXPECT_TRUE(s.calls.empty());
  EXPECT_EQ(s.content, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\":");
  // Messages sent back: the call's reasoning (as reasoning_content), the call, its result, then the answer.
  const json msgs = json::parse(R"([
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "reasoning_content": "Need the tool.",
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])");
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "description": "The weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  auto text = g->render(msgs, tools);
  ASSERT_TRUE(text.is_ok()) << text.status().to_string();
  EXPECT_NE(text->find("type get_weather = (_: {\ncity?: string,\n}) => any;"), std::string::npos) << *text;
  EXPECT_NE(text->find("<|start|>user<|message|>Weather in Paris?<|end|>"
                       "<|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|>"
                       "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
                       "{\"city\": \"Paris\"}<|call|>"
                       "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"sunny\"<|end|>"
                       "<|start|>assistant"),
            std::string::npos) << *text;
  EXPECT_TRUE(text->ends_with("<|start|>assistant"));
  // what the model wrote, as assistant_message returns it, renders back as that call
  const auto reply = g->parse_reply(call, true);
  json back = json::array({msgs[0]});
  back.push_back(g->assistant_message(reply));
  auto again = g->render(back, tools);
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_NE(again->find("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant to=functions.get_weather"
                        "<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>"),
            std::string::npos) << *again;
}

}  // namespace
