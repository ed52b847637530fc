// Speculative decoding with the model's multi-token-prediction layer (--spec-type draft-mtp; model/mtp.h,
// runtime/mtp_draft.h) on a small random qwen35 file written by `kiln synth --mtp 1` (a hybrid model: 3 Gated
// DeltaNet layers and a full-attention one, then the NextN block): the file loads with its NextN weights and its
// one-layer view; the view's logits for rows of tokens and hidden rows equal a reference composed here in double
// precision from the file's tensors; the proposer pairs token q + 1 with the model's row q and feeds its own rows
// back; greedy ids with draft-mtp are the ids without speculation at -b 1, -b 3 and a full batch (f16 and q8_0),
// for parallel sequences with the prefix cache too, while random weights reject most drafts (the recurrent state
// is rolled back); drafts that are partly right (a proposer that knows the answer and lies on purpose) keep the ids
// too; a request's limits; a model without NextN layers is refused naming the flag; the kiln run, info, synth and
// serve flags and fields.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/engine_util.h"
#include "common/test_util.h"
#include "unit/test_server_util.h"
#include "gguf/gguf.h"
#include "runtime/engine.h"
#include "runtime/mtp_draft.h"
#include "runtime/scheduler.h"
#include "util/fp16.h"

namespace kiln {
namespace {

constexpr const char* kShape =
    "--shape qwen3.5-0.8b --layers 4 --embd 128 --ff 256 --heads 2 --kv-heads 1 --head-dim 64 --n-vocab 1000 -t 2";

// The synthetic files, written once per test process: with one NextN block, and without; f16 unless `type`.
std::string synth(bool mtp, const std::string& type = "f16") {
  const std::string path = test::temp_dir() + (mtp ? "mtp-" : "plain-") + type + ".gguf";
  static std::set<std::string> done;
  if (done.insert(path).second) {
    const test::CmdResult r = test::run_kiln(std::string("synth ") + kShape + " --type " + type +
                                             (mtp ? " --mtp 1" : "") + " -o '" + path + "'");
    EXPECT_EQ(r.rc, 0) << r.err;
  }
  return path;
}

using test::ids;

EngineConfig with_mtp(EngineConfig c, int32_t draft_max = SpecConfig::kMtpDraftMax) {
  c.spec.type = SpecConfig::Type::kMtp;
  c.spec.draft_max = draft_max;
  return c;
}

TEST(Mtp, LoadsTheNextnBlockAndItsView) {
  auto m = test::load_cpu_model(synth(true));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->hparams().n_layer, 4);
  EXPECT_EQ(m->hparams().n_nextn, 1);
  EXPECT_TRUE(m->hparams().hybrid());
  Model* v = m->nextn_model();
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->hparams().n_layer, 1);
  EXPECT_FALSE(v->hparams().hybrid()) << "the NextN block is a full-attention layer";
  EXPECT_EQ(v->hparams().n_vocab, m->hparams().n_vocab);
  EXPECT_GT(v->stats().weight_bytes, 0u);
  auto plain = test::load_cpu_model(synth(false));
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->hparams().n_nextn, 0);
  EXPECT_EQ(plain->nextn_model(), nullptr);
}

// ---- the reference: NextN block 0 of the file, in double precision ----

struct Ref {
  const gguf::File& f;
  int64_t e = 128, nh = 2, nkv = 1, hd = 64, ff = 256, nv = 1000, n_rot = 64;
  double eps = 1e-6, base = 1e7;
  std::string b = "blk.4.";

  std::vector<double> vec(const std::string& name) const {
    const gguf::TensorInfo* t = f.find_tensor(name);
    EXPECT_NE(t, nullptr) << name;
    std::vector<double> v(t ? static_cast<size_t>(t->n_elements()) : 0);
    for (size_t i = 0; i < v.size(); ++i) {
      if (t->type == DType::F32) v[i] = reinterpret_cast<const float*>(t->data)[i];
      else v[i] = fp16_to_f32(reinterpret_cast<const uint16_t*>(t->data)[i]);
    }
    return v;
  }
  // y = W x for W [n_in, n_out] (ggml order: row o is n_in contiguous values).
  static std::vector<double> mv(const std::vector<double>& W, const std::vector<double>& x) {
    const size_t n_in = x.size(), n_out = W.size() / n_in;
    std::vector<double> y(n_out, 0.0);
    for (size_t o = 0; o < n_out; ++o)
      for (size_t i = 0; i < n_in; ++i) y[o] += W[o * n_in + i] * x[i];
    return y;
  }
  std::vector<double> rms(const double* x, size_t n, const std::vector<double>& w) const {
    double ss = 0;
    for (size_t i = 0; i < n; ++i) ss += x[i] * x[i];
    const double s = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
    std::vector<double> y(n);
    for (size_t i = 0; i < n; ++i) y[i] = x[i] * s * w[i];
    return y;
  }
  void rope(double* v, int64_t pos) const {  // NeoX pairs (i, i + n_rot / 2)
    for (int64_t i = 0; i < n_rot / 2; ++i) {
      const double th = static_cast<double>(pos) * std::pow(base, -2.0 * static_cast<double>(i) / n_rot);
      const double a = v[i], c = v[i + n_rot / 2];
      v[i] = a * std::cos(th) - c * std::sin(th);
      v[i + n_rot / 2] = a * std::sin(th) + c * std::cos(th);
    }
  }

  // Logits of every row: token toks[p] with hidden row hin[p], at positions 0.. of one sequence.
  std::vector<std::vector<double>> logits(const std::vector<int32_t>& toks, const std::vector<float>& hin) const {
    const auto emb = vec("token_embd.weight"), enorm = vec(b + "nextn.enorm.weight"),
               hnorm = vec(b + "nextn.hnorm.weight"), eh = vec(b + "nextn.eh_proj.weight"),
               an = vec(b + "attn_norm.weight"), wq = vec(b + "attn_q.weight"), wk = vec(b + "attn_k.weight"),
               wv = vec(b + "attn_v.weight"), wo = vec(b + "attn_output.weight"), qn = vec(b + "attn_q_norm.weight"),
               kn = vec(b + "attn_k_norm.weight"), fn = vec(b + "post_attention_norm.weight"),
               wg = vec(b + "ffn_gate.weight"), wu = vec(b + "ffn_up.weight"), wd = vec(b + "ffn_down.weight"),
               sh = vec(b + "nextn.shared_head_norm.weight");
    const size_t n = toks.size(), E = static_cast<size_t>(e), HD = static_cast<size_t>(hd);
    std::vector<std::vector<double>> xs(n), ks(n), vs(n), qs(n), gates(n), out(n);
    for (size_t p = 0; p < n; ++p) {
      // x = eh_proj [enorm(embed) | hnorm(h)]
      std::vector<double> h(hin.begin() + static_cast<std::ptrdiff_t>(p * E),
                            hin.begin() + static_cast<std::ptrdiff_t>((p + 1) * E));
      std::vector<double> cat = rms(&emb[static_cast<size_t>(toks[p]) * E], E, enorm);
      const std::vector<double> hh = rms(h.data(), E, hnorm);
      cat.insert(cat.end(), hh.begin(), hh.end());
      xs[p] = mv(eh, cat);
      const std::vector<double> a = rms(xs[p].data(), E, an);
      const std::vector<double> qf = mv(wq, a);
      ks[p] = mv(wk, a);
      vs[p] = mv(wv, a);
      qs[p].resize(static_cast<size_t>(nh) * HD);
      gates[p].resize(static_cast<size_t>(nh) * HD);
      for (int64_t hh2 = 0; hh2 < nh; ++hh2) {  // per head [query hd | gate hd]
        const size_t o = static_cast<size_t>(hh2) * 2 * HD;
        std::vector<double> q = rms(&qf[o], HD, qn);
        rope(q.data(), static_cast<int64_t>(p));
        std::copy(q.begin(), q.end(), qs[p].begin() + static_cast<std::ptrdiff_t>(hh2 * hd));
        std::copy(qf.begin() + static_cast<std::ptrdiff_t>(o + HD), qf.begin() + static_cast<std::ptrdiff_t>(o + 2 * HD),
                  gates[p].begin() + static_cast<std::ptrdiff_t>(hh2 * hd));
      }
      for (int64_t kh = 0; kh < nkv; ++kh) {
        std::vector<double> k = rms(&ks[p][static_cast<size_t>(kh) * HD], HD, kn);
        rope(k.data(), static_cast<int64_t>(p));
        std::copy(k.begin(), k.end(), ks[p].begin() + static_cast<std::ptrdiff_t>(kh * hd));
      }
    }
    for (size_t p = 0; p < n; ++p) {
      std::vector<double> attn(static_cast<size_t>(nh) * HD, 0.0);
      for (int64_t qh = 0; qh < nh; ++qh) {
        const size_t kh = static_cast<size_t>(qh / (nh / nkv));
        std::vector<double> s(p + 1);
        double mx = -1e300;
        for (size_t j = 0; j <= p; ++j) {
          double d = 0;
          for (size_t i = 0; i < HD; ++i) d += qs[p][static_cast<size_t>(qh) * HD + i] * ks[j][kh * HD + i];
          s[j] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (double& v : s) z += (v = std::exp(v - mx));
        for (size_t j = 0; j <= p; ++j)
          for (size_t i = 0; i < HD; ++i) attn[static_cast<size_t>(qh) * HD + i] += s[j] / z * vs[j][kh * HD + i];
      }
      for (size_t i = 0; i < attn.size(); ++i) attn[i] *= 1.0 / (1.0 + std::exp(-gates[p][i]));
      std::vector<double> x = xs[p];
      const std::vector<double> o = mv(wo, attn);
      for (size_t i = 0; i < E; ++i) x[i] += o[i];
      const std::vector<double> a = rms(x.data(), E, fn);
      std::vector<double> g = mv(wg, a);
      const std::vector<double> u = mv(wu, a);
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      const std::vector<double> d = mv(wd, g);
      for (size_t i = 0; i < E; ++i) x[i] += d[i];
      out[p] = mv(emb, rms(x.data(), E, sh));  // tied output
    }
    return out;
  }
};

TEST(Mtp, ViewLogitsMatchTheReference) {
  const std::string path = synth(true);
  auto m = test::load_cpu_model(path);
  ASSERT_TRUE(m && m->nextn_model());
  KvCacheConfig kc;
  kc.n_ctx = 64;
  kc.max_seqs = 1;
  kc.batch_tokens = 16;
  kc.max_outputs = 8;
  auto e = Engine::create(*m->nextn_model(), kc);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  ASSERT_TRUE((*e)->takes_hidden_in());
  const std::vector<int32_t> toks = ids(6, 7);
  std::vector<float> hin(toks.size() * 128);
  uint32_t x = 99;
  for (float& v : hin) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<float>((x >> 8) % 2001u) / 1000.0f - 1.0f;
  }
  std::vector<BatchToken> b;
  for (size_t p = 0; p < toks.size(); ++p) b.push_back({toks[p], static_cast<int32_t>(p), 0, true});
  const std::vector<OutputKind> kinds(toks.size(), OutputKind::kLogits);
  // In two steps: the second continues the view's own K/V cache.
  std::vector<std::vector<float>> got;
  for (size_t s0 : {size_t{0}, size_t{4}}) {
    const size_t s1 = s0 == 0 ? 4 : toks.size();
    auto out = (*e)->step(std::span<const BatchToken>(b.data() + s0, s1 - s0), kinds, false, {},
                          std::span<const float>(hin.data() + s0 * 128, (s1 - s0) * 128));
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    for (int32_t r = 0; r < out->n_out; ++r) got.emplace_back(out->row(r), out->row(r) + out->n_vocab);
  }
  // A step without hidden rows is refused.
  auto bad = (*e)->step(std::span<const BatchToken>(b.data(), 1), kinds);
  EXPECT_FALSE(bad.is_ok());
  auto file = gguf::File::open(path);
  ASSERT_TRUE(file.is_ok());
  const Ref ref{*file};
  const auto want = ref.logits(toks, hin);
  ASSERT_EQ(got.size(), want.size());
  for (size_t p = 0; p < want.size(); ++p) {
    std::vector<float> w(want[p].begin(), want[p].end());
    const double nmse = test::nmse(got[p].data(), w.data(), got[p].size());
    EXPECT_LT(nmse, 1e-5) << "row " << p;  // measured about 2e-7 (f16 weights, f32 activations)
    size_t am = 0;
    for (size_t i = 1; i < w.size(); ++i) am = w[i] > w[am] ? i : am;
    EXPECT_EQ(std::max_element(got[p].begin(), got[p].end()) - got[p].begin(), static_cast<std::ptrdiff_t>(am));
  }
  // The hidden rows matter: other rows, other logits.
  std::vector<float> hin2(hin.size(), 0.5f);
  const auto want2 = ref.logits(toks, hin2);
  double diff = 0;
  for (size_t i = 0; i < want2[0].size(); ++i) diff += std::abs(want2[0][i] - want[0][i]);
  EXPECT_GT(diff, 1.0);
}

// The proposer's pairing (runtime/mtp_draft.h): MTP row q takes token q + 1 with the trunk's row h_q; the first
// draft is the row after the last token, the next ones feed the view's own row back. Checked against the view run
// by hand, with the rows handed over in one piece and in two.
TEST(Mtp, ProposerPairsEachTokenWithThePreviousHiddenRow) {
  auto m = test::load_cpu_model(synth(true));
  ASSERT_TRUE(m && m->nextn_model());
  const int64_t E = m->hparams().n_embd;
  KvCacheConfig kc;
  kc.n_ctx = 64;
  kc.batch_tokens = 32;
  kc.hidden = true;
  auto trunk = Engine::create(*m, kc);
  ASSERT_TRUE(trunk.is_ok()) << trunk.status().to_string();
  std::vector<int32_t> toks = ids(10, 21);
  std::vector<BatchToken> b;
  for (size_t p = 0; p < toks.size(); ++p) b.push_back({toks[p], static_cast<int32_t>(p), 0, p + 1 == toks.size()});
  const OutputKind argmax[1] = {OutputKind::kArgmax};
  auto out = (*trunk)->step(b, argmax, true);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  const size_t n = toks.size();
  const std::vector<float> rows(out->hidden, out->hidden + n * static_cast<size_t>(E));
  toks.push_back(out->argmax[0]);  // the pending token

  // By hand: rows q = 0 .. n - 1 of the view are (toks[q + 1], h_q), then (draft, the view's last row).
  auto view = Engine::create(*m->nextn_model(), kc);
  ASSERT_TRUE(view.is_ok());
  std::vector<BatchToken> vb;
  for (size_t q = 0; q < n; ++q) vb.push_back({toks[q + 1], static_cast<int32_t>(q), 0, q + 1 == n});
  auto v = (*view)->step(vb, argmax, true, {}, rows);
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  std::vector<int32_t> want = {v->argmax[0]};
  std::vector<float> h(v->hidden_row(static_cast<int32_t>(n - 1)), v->hidden_row(static_cast<int32_t>(n - 1)) + E);
  for (int j = 1; j < 3; ++j) {
    const BatchToken t{want.back(), static_cast<int32_t>(n - 1 + j), 0, true};
    auto w = (*view)->step(std::span<const BatchToken>(&t, 1), argmax, true, {}, h);
    ASSERT_TRUE(w.is_ok());
    want.push_back(w->argmax[0]);
    h.assign(w->hidden_row(0), w->hidden_row(0) + E);
  }

  DraftCacheConfig mc;
  mc.n_ctx = 64;
  mc.batch_tokens = 32;
  auto mtp = MtpDraft::create(*m, mc);
  ASSERT_TRUE(mtp.is_ok()) << mtp.status().to_string();
  for (size_t split : {n, size_t{4}}) {
    SCOPED_TRACE("rows handed over in pieces of " + std::to_string(split));
    auto p = (*mtp)->proposer(0);
    ASSERT_TRUE(p->wants_hidden());
    for (size_t at = 0; at < n; at += split) {
      const size_t k = std::min(split, n - at);
      // Mid-prompt the tokens are the whole prompt (the pending token comes with the last piece).
      const std::span<const int32_t> seen(toks.data(), at + k < n ? n : n + 1);
      p->hidden_rows(seen, static_cast<int64_t>(at), rows.data() + at * static_cast<size_t>(E),
                     static_cast<int64_t>(k), E);
    }
    std::vector<int32_t> got(3);
    EXPECT_EQ(p->propose(std::span<const int32_t>(toks.data(), n), 3, got), 0) << "drafts for another length";
    ASSERT_EQ(p->propose(toks, 3, got), 3);
    EXPECT_EQ(got, want);
    // Again (the speculative positions are truncated first): the same drafts.
    ASSERT_EQ(p->propose(toks, 2, got), 2);
    EXPECT_EQ(got[0], want[0]);
    EXPECT_EQ(got[1], want[1]);
  }
}

using test::SpecRun;
const auto run = test::run_spec;

// At -b 1 (no room for drafts, the MTP still follows), 3 and a full batch, one and three drafts per step.
void check_greedy_ids(const std::string& type) {
  const std::string path = synth(true, type);
  const std::vector<int32_t> prompt = ids(12, 3);
  const SpecRun plain = run(path, test::one_sequence(256), test::greedy_request(prompt, 20));
  ASSERT_TRUE(plain.g.error.is_ok()) << plain.g.error.to_string();
  ASSERT_EQ(plain.g.ids.size(), 20u);
  for (int32_t batch : {1, 3, 512}) {
    for (int32_t n_max : {1, 3}) {
      SCOPED_TRACE("-b " + std::to_string(batch) + " --spec-draft-n-max " + std::to_string(n_max));
      const SpecRun spec = run(path, with_mtp(test::one_sequence(256, batch), n_max), test::greedy_request(prompt, 20));
      ASSERT_TRUE(spec.g.error.is_ok()) << spec.g.error.to_string();
      EXPECT_EQ(spec.g.ids, plain.g.ids);
      EXPECT_EQ(spec.g.text, plain.g.text);
      if (batch == 1) {
        EXPECT_EQ(spec.stats.draft_tokens, 0u) << "-b 1 leaves no room for drafts";
      } else {
        EXPECT_GT(spec.stats.draft_tokens, 0u);
        EXPECT_LT(spec.stats.draft_accepted, spec.stats.draft_tokens) << "random weights reject drafts";
      }
    }
  }
}

TEST(Mtp, GreedyIdsUnchanged) { check_greedy_ids("f16"); }
TEST(Mtp, GreedyIdsUnchangedQ8) { check_greedy_ids("q8_0"); }

// Three sequences at once, with the prefix cache and its recurrent-state checkpoints (serve's defaults): twice the
// same prompts, so the second round resumes from checkpoints whose prompt rows the MTP never saw (it starts its
// own sequence where the rows begin).
TEST(Mtp, ParallelSequencesKeepTheirIds) {
  const std::string path = synth(true);
  EngineConfig pc = test::one_sequence(1024);
  pc.max_seqs = 3;
  pc.prefix_cache = true;
  pc.block_size = 4;
  std::vector<std::vector<int32_t>> want;
  for (uint32_t s = 0; s < 3; ++s) {
    const SpecRun r = run(path, test::one_sequence(256), test::greedy_request(ids(9 + 4 * s, 11 + s), 12));
    want.push_back(r.g.ids);
  }
  auto sched = test::make_scheduler(path, with_mtp(pc));
  ASSERT_TRUE(sched);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<std::shared_ptr<RequestHandle>> hs;
    for (uint32_t s = 0; s < 3; ++s) {
      auto h = sched->submit(test::greedy_request(ids(9 + 4 * s, 11 + s), 12));
      ASSERT_TRUE(h.is_ok());
      hs.push_back(*h);
    }
    for (uint32_t s = 0; s < 3; ++s) {
      std::vector<int32_t> got;
      for (const TokenEvent& ev : hs[s]->wait_all())
        if (ev.id >= 0) got.push_back(ev.id);
      EXPECT_TRUE(hs[s]->error().is_ok()) << hs[s]->error().to_string();
      EXPECT_EQ(got, want[s]) << "sequence " << s;
    }
  }
  const SchedulerStats st = sched->stats();
  EXPECT_GT(st.draft_tokens, 0u);
  EXPECT_GT(st.prefix_hit_tokens, 0u) << "the second round resumes from checkpoints";
}

// Drafts that are right but for one in every few (a proposer that knows the greedy answer): the confirmed ones
// stay, the state rolls back past the rejected one and the confirmed tokens run again with the next drafts, the
// ids are the plain ones, and fewer steps run.
class KnowingProposer : public DraftProposer {
 public:
  KnowingProposer(std::vector<int32_t> answer, std::shared_ptr<int> calls)
      : answer_(std::move(answer)), calls_(std::move(calls)) {}
  int32_t propose(std::span<const int32_t> tokens, int32_t max_k, std::span<int32_t> out) override {
    ++*calls_;
    int32_t k = 0;
    for (size_t p = tokens.size(); k < max_k && k < static_cast<int32_t>(out.size()) && p < answer_.size(); ++p) {
      const int32_t right = answer_[p];
      out[static_cast<size_t>(k++)] = p % 4 == 3 ? (right == 5 ? 6 : 5) : right;
    }
    return k;
  }
  void accepted(int32_t) override {}

 private:
  std::vector<int32_t> answer_;
  std::shared_ptr<int> calls_;
};

TEST(Mtp, PartlyRightDraftsRollTheStateBack) {
  const std::string path = synth(true);
  const std::vector<int32_t> prompt = ids(9, 5);
  const SpecRun plain = run(path, test::one_sequence(256), test::greedy_request(prompt, 24));
  ASSERT_EQ(plain.g.ids.size(), 24u);
  std::vector<int32_t> answer = prompt;
  answer.insert(answer.end(), plain.g.ids.begin(), plain.g.ids.end());
  GenRequest r = test::greedy_request(prompt, 24);
  auto calls = std::make_shared<int>(0);
  r.hooks = [answer, calls] {
    SequenceHooks h;
    h.drafts = std::make_unique<KnowingProposer>(answer, calls);
    return h;
  };
  const SpecRun spec = run(path, with_mtp(test::one_sequence(256), 4), r);
  ASSERT_TRUE(spec.g.error.is_ok()) << spec.g.error.to_string();
  EXPECT_EQ(spec.g.ids, plain.g.ids);
  EXPECT_GT(spec.stats.draft_accepted, 0u);
  EXPECT_LT(spec.stats.draft_accepted, spec.stats.draft_tokens);
  EXPECT_LT(spec.stats.steps, plain.stats.steps);
  // Every step but the prompt's decodes with drafts, those that run the confirmed tokens again included.
  EXPECT_EQ(static_cast<uint64_t>(*calls) + 1, spec.stats.steps);
}

// The limits inside a verified chunk on the hybrid model (stop strings, max_new_tokens), with drafts that are
// mostly right: the text ends where it ends without drafts.
TEST(Mtp, LimitsInsideVerifiedDrafts) {
  const std::string path = synth(true);
  const std::vector<int32_t> prompt = ids(9, 8);
  const SpecRun plain = run(path, test::one_sequence(256), test::greedy_request(prompt, 24));
  ASSERT_EQ(plain.g.ids.size(), 24u);
  std::vector<int32_t> answer = prompt;
  answer.insert(answer.end(), plain.g.ids.begin(), plain.g.ids.end());
  auto knowing = [&](GenRequest r) {
    r.hooks = [answer] {
      SequenceHooks h;
      h.drafts = std::make_unique<KnowingProposer>(answer, std::make_shared<int>(0));
      return h;
    };
    return r;
  };
  ASSERT_GT(plain.g.text.size(), 8u);
  GenRequest stop = test::greedy_request(prompt, 24);
  stop.stop = {plain.g.text.substr(plain.g.text.size() / 2, 3)};
  const SpecRun a = run(path, test::one_sequence(256), stop);
  const SpecRun b = run(path, with_mtp(test::one_sequence(256), 4), knowing(stop));
  EXPECT_EQ(b.g.text, a.g.text);
  EXPECT_EQ(b.g.stop, StopReason::kStopString);
  for (int32_t n : {1, 2, 5, 11}) {
    const SpecRun c = run(path, with_mtp(test::one_sequence(256), 4), knowing(test::greedy_request(prompt, n)));
    EXPECT_EQ(c.g.ids, std::vector<int32_t>(plain.g.ids.begin(), plain.g.ids.begin() + n)) << "max_new_tokens " << n;
  }
}

// A request's speculative fields (llama-server's speculative.*): n_max 0 turns drafts off for it, a smaller n_max
// holds, p_min is refused (MTP drafts carry no probability); the ids stay the plain ones.
TEST(Mtp, RequestLimits) {
  const std::string path = synth(true);
  const std::vector<int32_t> prompt = ids(8, 9);
  const SpecRun plain = run(path, test::one_sequence(256), test::greedy_request(prompt, 10));
  auto s = test::make_scheduler(path, with_mtp(test::one_sequence(256), 3));
  ASSERT_TRUE(s);
  GenRequest off = test::greedy_request(prompt, 10);
  off.spec.n_max = 0;
  const test::Generated a = test::generate(*s, off);
  EXPECT_EQ(a.ids, plain.g.ids);
  EXPECT_EQ(a.timings.n_draft, 0);
  GenRequest one = test::greedy_request(prompt, 10);
  one.spec.n_max = 1;
  const test::Generated b = test::generate(*s, one);
  EXPECT_EQ(b.ids, plain.g.ids);
  EXPECT_GT(b.timings.n_draft, 0);
  EXPECT_LE(b.timings.n_draft, 10) << "one draft per step at most";
  GenRequest pm = test::greedy_request(prompt, 10);
  pm.spec.p_min = 0.5f;
  const test::Generated c = test::generate(*s, pm);
  EXPECT_NE(c.error.to_string().find("speculative.p_min: draft-mtp drafts carry no probability"), std::string::npos)
      << c.error.to_string();
}

TEST(Mtp, ModelWithoutNextnLayersIsRefused) {
  for (const std::string& path : {synth(false), test::data_path("models/fixture-llama-f16.gguf")}) {
    auto m = test::load_cpu_model(path);
    ASSERT_TRUE(m);
    auto s = Scheduler::create(std::move(m), with_mtp(test::one_sequence(256)));
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.status().to_string().find("--spec-type draft-mtp: " + path +
                                          " has no multi-token-prediction layers (nextn_predict_layers 0)"),
              std::string::npos)
        << s.status().to_string();
  }
}

TEST(Mtp, RunFlags) {
  const std::string m = synth(true);
  const std::string base = "run -m '" + m + "' -t 1 -p 'The cat sat on the mat' -n 16 --temp 0 --ids";
  const test::CmdResult a = test::run_kiln(base);
  const test::CmdResult b = test::run_kiln(base + " --spec-type draft-mtp");
  const test::CmdResult c = test::run_kiln(base + " --spec-type draft-mtp --spec-draft-n-max 2 -b 4");
  ASSERT_EQ(a.rc, 0) << a.err;
  ASSERT_EQ(b.rc, 0) << b.err;
  ASSERT_EQ(c.rc, 0) << c.err;
  EXPECT_EQ(b.out, a.out);
  EXPECT_EQ(c.out, a.out);
  EXPECT_NE(b.err.find("kiln run: speculative: "), std::string::npos) << b.err;
  const test::CmdResult d = test::run_kiln("run -m '" + synth(false) + "' -p hi -n 2 --spec-type draft-mtp");
  EXPECT_NE(d.rc, 0);
  EXPECT_NE(d.err.find("--spec-type draft-mtp: "), std::string::npos) << d.err;
  EXPECT_NE(d.err.find("has no multi-token-prediction layers (nextn_predict_layers 0)"), std::string::npos) << d.err;
  const test::CmdResult e = test::run_kiln(base + " --spec-type draft-mtp --spec-draft-n-max 300");
  EXPECT_NE(e.rc, 0);
  EXPECT_NE(e.err.find("--spec-draft-n-max"), std::string::npos) << e.err;
  const test::CmdResult f = test::run_kiln(base + " --spec-type draft-mpt");
  EXPECT_NE(f.rc, 0);
  EXPECT_NE(f.err.find("draft-mtp"), std::string::npos) << f.err;
  const test::CmdResult g = test::run_kiln("info '" + m + "'");
  EXPECT_NE(g.out.find("mtp:         1 multi-token-prediction layer"), std::string::npos) << g.out;
  EXPECT_EQ(test::run_kiln("info '" + synth(false) + "'").out.find("mtp:"), std::string::npos);
  const test::CmdResult h = test::run_kiln("synth --shape tiny --mtp 1 -o '" + test::temp_dir() + "x.gguf'");
  EXPECT_NE(h.rc, 0);
  EXPECT_NE(h.err.find("--mtp"), std::string::npos) << h.err;
}

// kiln serve --spec-type draft-mtp: llama-server's per-request fields (the type repeated, a lower n_max, n_max 0;
// another type or a p_min is a 400 naming the field), the same greedy text, /props.
TEST(Mtp, ServeFields) {
  test::ServeProcess proc;
  ASSERT_TRUE(proc.start({"-m", synth(true), "-t", "1", "--parallel", "2", "-c", "1024", "--spec-type", "draft-mtp"}))
      << proc.log();
  auto post = [&](const test::json& b) { return test::http(proc.port, "POST", "/v1/completions", b.dump()); };
  const test::json base = {{"prompt", ids(8, 4)}, {"max_tokens", 12}, {"temperature", 0}};
  test::json off = base;
  off["speculative.n_max"] = 0;
  const auto a = post(off);
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_FALSE(a.j()["timings"].contains("draft_n")) << a.body;
  test::json one = base;
  one["speculative.type"] = "draft-mtp";
  one["speculative.n_max"] = 1;
  const auto b = post(one);
  ASSERT_EQ(b.status, 200) << b.body;
  EXPECT_EQ(b.j()["choices"][0]["text"], a.j()["choices"][0]["text"]);
  ASSERT_TRUE(b.j()["timings"].contains("draft_n")) << b.body;
  EXPECT_LE(b.j()["timings"]["draft_n"].get<int64_t>(), 12);
  const auto c = post(base);
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(c.j()["choices"][0]["text"], a.j()["choices"][0]["text"]);
  struct Case {
    const char* field;
    test::json value;
  };
  for (const Case& k : {Case{"speculative.type", "draft-simple"}, Case{"speculative.p_min", 0.5},
                        Case{"speculative.n_max", 4}}) {
    test::json r = base;
    r[k.field] = k.value;
    const auto e = post(r);
    EXPECT_EQ(e.status, 400) << k.field << ": " << e.body;
    EXPECT_EQ(e.j()["error"]["param"], k.field) << e.body;
  }
  const auto p = test::http(proc.port, "GET", "/props");
  ASSERT_EQ(p.status, 200) << p.body;
  const test::json props = p.j();
  const test::json& params = props["default_generation_settings"]["params"];
  EXPECT_EQ(params["speculative.type"], "draft-mtp");
  EXPECT_EQ(params["speculative.n_max"], SpecConfig::kMtpDraftMax);
  EXPECT_EQ(proc.stop(SIGTERM), 0) << proc.log();
}

}  // namespace
}  // namespace kiln
