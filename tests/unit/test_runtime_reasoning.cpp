// Reasoning budgets (runtime/reasoning.h): the tracker's states on hand-made token pieces (the close forced after
// exactly N tokens of the block, budget 0, unlimited, markers split across tokens, a budget reached inside a UTF-8
// character), the bytes of each token that are the block's, the reasoning_effort table, the close text read from a
// template (after a budget message's tokens), and the engine loop emitting the forced text in place of sampled
// tokens (greedy on the device's argmax, and sampled from the row).
#include <gtest/gtest.h>

#include "common/engine_util.h"
#include "common/test_util.h"
#include "runtime/prompt.h"
#include "runtime/reasoning.h"

namespace kiln {
namespace {

using State = ReasoningTracker::State;

ReasoningBudget budget(int32_t n, bool opened) {
  ReasoningBudget b;
  b.budget = n;
  b.begin = "<think>";
  b.end = "</think>";
  b.close = {900, 901, 902};  // ids of the close text (the tracker forces them in order)
  b.opened = opened;
  return b;
}

// Accepts the forced tokens until the close is out; how many there were.
int drain(ReasoningTracker& t) {
  int n = 0;
  for (int32_t f = t.forced(); f >= 0; f = t.forced(), ++n) t.accept(f, f == 901 ? "</think>" : "\n");
  return n;
}

TEST(ReasoningTracker, ClosesAfterExactlyNTokens) {
  ReasoningTracker t(budget(4, true));
  EXPECT_EQ(t.state(), State::kInside);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(t.forced(), -1) << i;
    t.accept(10 + i, " word");
  }
  EXPECT_EQ(t.state(), State::kForcing);
  EXPECT_EQ(t.forced(), 900);
  t.accept(900, "\n");
  EXPECT_EQ(t.forced(), 901);
  t.accept(901, "</think>");
  EXPECT_EQ(t.forced(), 902);
  t.accept(902, "\n\n");
  EXPECT_EQ(t.state(), State::kDone);
  EXPECT_EQ(t.forced(), -1);
  EXPECT_TRUE(t.forced_close());
  EXPECT_EQ(t.n_inside(), 4);
  EXPECT_EQ(t.n_reasoning(), 4 + 3);
  t.accept(50, "<think> more");  // after the block: nothing is counted or forced
  EXPECT_EQ(t.n_reasoning(), 7);
  EXPECT_EQ(t.forced(), -1);
}

TEST(ReasoningTracker, BudgetZeroClosesAtOnce) {
  ReasoningTracker opened(budget(0, true));
  EXPECT_EQ(opened.forced(), 900);  // the first token of the reply is already the close
  EXPECT_EQ(drain(opened), 3);
  EXPECT_EQ(opened.n_inside(), 0);
  EXPECT_EQ(opened.n_reasoning(), 3);
  // The reply opens the block itself (whitespace first, the marker split across tokens): closed right after it.
  ReasoningTracker t(budget(0, false));
  EXPECT_EQ(t.state(), State::kStart);
  t.accept(1, "\n");
  t.accept(2, "<th");
  EXPECT_EQ(t.forced(), -1);
  t.accept(3, "ink>");
  EXPECT_EQ(t.forced(), 900);
  EXPECT_EQ(drain(t), 3);
  EXPECT_EQ(t.n_reasoning(), 3 + 3);
}

TEST(ReasoningTracker, UnlimitedCountsUntilTheModelCloses) {
  ReasoningTracker t(budget(-1, false));
  t.accept(1, "<think>");
  for (int i = 0; i < 1000; ++i) {
    t.accept(7, "x");
    ASSERT_EQ(t.forced(), -1);
  }
  // The closing marker split across three tokens, its last one with content after it.
  t.accept(2, "</");
  t.accept(3, "thi");
  EXPECT_EQ(t.state(), State::kInside);
  t.accept(4, "nk>\n\nHello");
  EXPECT_EQ(t.state(), State::kDone);
  EXPECT_FALSE(t.forced_close());
  EXPECT_EQ(t.n_inside(), 1002);
  EXPECT_EQ(t.n_reasoning(), 1 + 1002 + 1);
}

TEST(ReasoningTracker, ModelClosingBeforeTheBudgetIsNotForced) {
  ReasoningTracker t(budget(5, true));
  t.accept(1, "a");
  t.accept(2, "b</think>");
  EXPECT_EQ(t.state(), State::kDone);
  for (int i = 0; i < 10; ++i) t.accept(3, "c");
  EXPECT_EQ(t.forced(), -1);
  EXPECT_EQ(t.n_reasoning(), 2);
}

TEST(ReasoningTracker, ReplyWithoutABlock) {
  ReasoningTracker t(budget(0, false));
  t.accept(1, " ");
  t.accept(2, "<");  // could still be the marker
  EXPECT_EQ(t.state(), State::kStart);
  t.accept(3, "b>bold");
  EXPECT_EQ(t.state(), State::kDone);
  EXPECT_EQ(t.forced(), -1);
  EXPECT_EQ(t.n_reasoning(), 0);
  ReasoningTracker off;  // a default tracker (no markers) never acts
  off.accept(1, "<think>");
  EXPECT_EQ(off.forced(), -1);
  EXPECT_EQ(off.n_reasoning(), 0);
}

TEST(ReasoningTracker, TextAfterTheOpeningMarkerIsNotCounted) {
  ReasoningTracker t(budget(1, false));
  t.accept(1, "<think>Hmm");
  EXPECT_EQ(t.forced(), -1);
  t.accept(2, ",");
  EXPECT_EQ(t.forced(), 900);
  // One token opening and closing the block: no budget is spent.
  ReasoningTracker u(budget(0, false));
  u.accept(1, "<think></think>");
  EXPECT_EQ(u.state(), State::kDone);
  EXPECT_EQ(u.forced(), -1);
}

TEST(ReasoningTracker, BudgetInsideAUtf8CharacterWaitsForItsLastByte) {
  // 你 = E4 BD A0 as three byte tokens; the budget is spent at the first of them.
  ReasoningTracker t(budget(2, true));
  t.accept(1, "a");
  t.accept(2, "\xE4");
  EXPECT_EQ(t.forced(), -1);
  t.accept(3, "\xBD");
  EXPECT_EQ(t.forced(), -1);
  t.accept(4, "\xA0");
  EXPECT_EQ(t.forced(), 900);
  EXPECT_EQ(t.n_inside(), 4);
  // A whole character in one token: the budget closes right after it.
  ReasoningTracker u(budget(1, true));
  u.accept(1, "\xE4\xBD\xA0");
  EXPECT_EQ(u.forced(), 900);
  // A broken sequence (a lead byte never completed) waits at most 3 tokens.
  ReasoningTracker v(budget(1, true));
  v.accept(1, "\xF0");
  v.accept(2, "\xF0");
  v.accept(3, "\xF0");
  EXPECT_EQ(v.forced(), -1);
  v.accept(4, "\xF0");
  EXPECT_EQ(v.forced(), 900);
}

// accept() says how many of a token's leading bytes are the block's: none before it opens or after it, all inside and
// while forcing, those up to the closing marker for the token that closes it.
TEST(ReasoningTracker, AcceptSaysWhichBytesAreTheBlocks) {
  ReasoningTracker t(budget(3, false));
  EXPECT_EQ(t.accept(1, "\n"), 0u);
  EXPECT_EQ(t.accept(2, "<th"), 0u);  // may still be the marker
  EXPECT_EQ(t.accept(3, "ink>Hm"), 6u);
  EXPECT_EQ(t.accept(4, " x</th"), 6u);
  EXPECT_EQ(t.accept(5, "ink>\n\nHi"), 4u);  // the marker ends 4 bytes in
  EXPECT_EQ(t.accept(6, "there"), 0u);
  ReasoningTracker one(budget(3, false));
  EXPECT_EQ(one.accept(1, " <think>a</think>b"), 17u);
  ReasoningTracker forced(budget(0, true));
  EXPECT_EQ(forced.accept(900, "\n"), 1u);
  EXPECT_EQ(forced.accept(901, "</think>"), 8u);
  EXPECT_EQ(forced.accept(902, "\n\n"), 2u);
  EXPECT_EQ(forced.accept(7, "x"), 0u);
  ReasoningTracker none(budget(3, false));
  EXPECT_EQ(none.accept(1, "Hello"), 0u);
}

TEST(ReasoningEffort, OpenAiLevels) {
  EXPECT_EQ(reasoning_effort_budget("none"), 0);
  EXPECT_EQ(reasoning_effort_budget("minimal"), 0);
  EXPECT_EQ(reasoning_effort_budget("low"), 1024);
  EXPECT_EQ(reasoning_effort_budget("medium"), 8192);
  EXPECT_EQ(reasoning_effort_budget("high"), 24576);
  EXPECT_EQ(reasoning_effort_budget("xhigh"), -1);
  EXPECT_FALSE(reasoning_effort_budget("max"));
  EXPECT_FALSE(reasoning_effort_budget(""));
  EXPECT_FALSE(reasoning_effort_budget("High"));
}

std::string fixture() { return test::data_path("models/fixture-llama-q8_0.gguf"); }

// The close text as the template writes it (Qwen3's "\n</think>\n\n"), the budget built from a rendered prompt,
// and budget 0 rendering Qwen3's block closed through enable_thinking.
TEST(ReasoningBudgetFor, ReadsTheTemplate) {
  auto s = test::make_scheduler(fixture(), test::one_sequence());
  ASSERT_TRUE(s);
  ChatPromptOptions o;
  o.template_source = test::slurp(test::data_path("templates/Qwen-Qwen3-0.6B.jinja"));
  auto qwen = ChatPrompt::create(s->tokenizer(), o);
  ASSERT_TRUE(qwen) << qwen.status().to_string();
  EXPECT_EQ(qwen->reasoning_close(), "\n</think>\n\n");
  const nlohmann::ordered_json msgs = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  nlohmann::ordered_json kwargs = nullptr;
  reasoning_budget_kwargs(*qwen, 5, &kwargs);
  EXPECT_TRUE(kwargs.is_null());
  reasoning_budget_kwargs(*qwen, 0, &kwargs);
  EXPECT_EQ(kwargs, nlohmann::ordered_json({{"enable_thinking", false}}));
  nlohmann::ordered_json keep = {{"enable_thinking", true}};
  reasoning_budget_kwargs(*qwen, 0, &keep);
  EXPECT_EQ(keep["enable_thinking"], true);  // the request's own value stays
  auto closed = qwen->render(msgs, nullptr, true, kwargs);
  ASSERT_TRUE(closed);
  EXPECT_NE(closed->find("<think>\n\n</think>"), std::string::npos);
  const ReasoningBudget b = reasoning_budget_for(*qwen, 7, *closed);
  EXPECT_TRUE(b.enabled());
  EXPECT_EQ(b.budget, 7);
  EXPECT_FALSE(b.opened);
  EXPECT_EQ(s->tokenizer().decode(b.close), "\n</think>\n\n");
  // A budget message: its tokens, then the close's (each tokenized on its own).
  const std::string msg = " Time is up, I answer now.";
  const ReasoningBudget m = reasoning_budget_for(*qwen, 7, *closed, msg);
  std::vector<int32_t> want = qwen->tokenize(msg, false);
  const std::vector<int32_t> close_ids = qwen->tokenize("\n</think>\n\n", false);
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(b.close, close_ids);  // no message: the close alone
  want.insert(want.end(), close_ids.begin(), close_ids.end());
  EXPECT_EQ(m.close, want);
  EXPECT_EQ(s->tokenizer().decode(m.close), msg + "\n</think>\n\n");
  // A template that writes reasoning in no earlier turn: the default close; the prompt opens the block.
  o.template_source = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant><think>\n";
  auto r1 = ChatPrompt::create(s->tokenizer(), o);
  ASSERT_TRUE(r1);
  EXPECT_EQ(r1->reasoning_close(), "\n</think>\n\n");
  auto text = r1->render(msgs);
  ASSERT_TRUE(text);
  EXPECT_TRUE(reasoning_budget_for(*r1, -1, *text).opened);
  // No markers: disabled.
  o.template_source = "{% for m in messages %}{{ m.content }}{% endfor %}";
  auto plain = ChatPrompt::create(s->tokenizer(), o);
  ASSERT_TRUE(plain);
  EXPECT_FALSE(reasoning_budget_for(*plain, 3, "x").enabled());
}

// The engine loop: the block the prompt opened gets exactly N sampled tokens, then the close text's tokens, then the
// reply goes on; usage counts the block.
TEST(ReasoningGeneration, ForcedCloseReplacesSampledTokens) {
  auto s = test::make_scheduler(fixture(), test::one_sequence(512));
  ASSERT_TRUE(s);
  const Tokenizer& tok = s->tokenizer();
  const std::vector<int32_t> close = tok.encode("\n</think>\n\n", false, false);
  ASSERT_GE(close.size(), 3u);  // the marker is several tokens of this vocabulary
  for (float temp : {0.0f, 1.0f}) {
    SCOPED_TRACE("temp " + std::to_string(temp));
    GenRequest r;
    r.prompt = tok.encode("Once upon a time <think>\n", true, false);
    r.sampling.temp = temp;
    r.sampling.seed = 7;
    r.max_new_tokens = 20;
    r.ignore_eos = true;
    const test::Generated free_run = test::generate(*s, r);
    ASSERT_TRUE(free_run.error.is_ok()) << free_run.error.to_string();
    ASSERT_EQ(free_run.ids.size(), 20u);
    EXPECT_EQ(free_run.timings.n_reasoning, 0);  // nothing tracked without a budget
    // The forced text: the close alone, or a budget message's tokens then the close's.
    std::vector<int32_t> with_message = tok.encode(" I have to give the answer now.", false, false);
    with_message.insert(with_message.end(), close.begin(), close.end());
    for (const std::vector<int32_t>& forced : {close, with_message})
      for (int32_t n : {0, 5}) {
        SCOPED_TRACE("budget " + std::to_string(n) + ", forced " + std::to_string(forced.size()));
        GenRequest b = r;
        b.reasoning.budget = n;
        b.reasoning.begin = "<think>";
        b.reasoning.end = "</think>";
        b.reasoning.close = forced;
        b.reasoning.opened = true;
        b.max_new_tokens = n + static_cast<int32_t>(forced.size()) + 2;  // the forced text and a little content
        const test::Generated g = test::generate(*s, b);
        ASSERT_TRUE(g.error.is_ok()) << g.error.to_string();
        ASSERT_EQ(g.ids.size(), static_cast<size_t>(b.max_new_tokens));
        const size_t k = static_cast<size_t>(n);
        EXPECT_EQ(std::vector<int32_t>(g.ids.begin(), g.ids.begin() + k),
                  std::vector<int32_t>(free_run.ids.begin(), free_run.ids.begin() + k));
        EXPECT_EQ(std::vector<int32_t>(g.ids.begin() + k, g.ids.begin() + k + forced.size()), forced);
        EXPECT_EQ(g.timings.n_reasoning, n + static_cast<int64_t>(forced.size()));
        const char* want = forced.size() > close.size() ? "I have to give the answer now.\n</think>" : "</think>";
        EXPECT_NE(g.text.find(want), std::string::npos) << g.text;
      }
  }
}

}  // namespace
}  // namespace kiln
