#include "cli/sampling_options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>

#include "runtime/dry.h"

namespace kiln::cli {

Result<LogitBias> parse_logit_bias(const std::string& flag, const std::string& value) {
  auto bad = [&] {
    return make_error(ErrorCode::kInvalidArgument, "%s: '%s' is not TOKEN_ID(+/-)BIAS (e.g. 15043+1, 15043-0.5, "
                      "15043-inf to ban the token)", flag.c_str(), value.c_str());
  };
  size_t i = 0;
  while (i < value.size() && value[i] >= '0' && value[i] <= '9') ++i;
  if (i == 0 || i > 9 || i + 1 >= value.size() || (value[i] != '+' && value[i] != '-')) return bad();
  const int32_t token = static_cast<int32_t>(std::strtol(value.substr(0, i).c_str(), nullptr, 10));
  const bool minus = value[i] == '-';
  const std::string mag = value.substr(i + 1);
  if (minus && mag == "inf") return LogitBias{token, -std::numeric_limits<float>::infinity()};
  errno = 0;
  char* end = nullptr;
  const float x = std::strtof(mag.c_str(), &end);
  // Digits only (no second sign, no "nan"/"inf" spelled otherwise), finite.
  if (mag[0] < '0' || mag[0] > '9' || *end != '\0' || errno != 0 || !std::isfinite(x)) return bad();
  return LogitBias{token, minus ? -x : x};
}

void add_sampling_options(ArgParser& args, SamplerParams* p) {
  args.option({"--temp"}, &p->temp, "T", "temperature; <= 0: greedy (default 0.8)");
  args.option({"--top-k"}, &p->top_k, "N", "top-k sampling; 0: off (default 40)");
  args.option({"--top-p"}, &p->top_p, "P", "top-p (nucleus) sampling in [0, 1]; 1: off (default 0.95)");
  args.option({"--min-p"}, &p->min_p, "P", "min-p sampling; 0: off (default 0.05)");
  args.option({"--typical"}, &p->typical_p, "P", "locally typical sampling in [0, 1]; 1: off (default 1.0)");
  args.option({"--repeat-penalty"}, &p->repeat_penalty, "X", "penalty for repeated tokens; 1: off (default 1.0)");
  args.option({"--repeat-last-n"}, &p->penalty_last_n, "N",
              "tokens the penalties look back over; 0: off, -1: whole context (default 64)");
  args.option({"--presence-penalty"}, &p->presence_penalty, "X", "presence penalty (default 0)");
  args.option({"--frequency-penalty"}, &p->frequency_penalty, "X", "frequency penalty (default 0)");
  args.option({"--dry-multiplier"}, &p->dry_multiplier, "X", "DRY repetition penalty multiplier; 0: off (default 0)");
  args.option({"--dry-base"}, &p->dry_base, "X", "DRY base, >= 1 (default 1.75)");
  args.option({"--dry-allowed-length"}, &p->dry_allowed_length, "N",
              "DRY: repetitions longer than this are penalized (default 2)");
  args.option({"--dry-penalty-last-n"}, &p->dry_penalty_last_n, "N",
              "tokens DRY looks back over; 0: off, -1: whole context (default -1)");
  // llama.cpp: the first --dry-sequence-breaker replaces the defaults; "none" leaves no breaker.
  auto cleared = std::make_shared<bool>(false);
  args.option(
      {"--dry-sequence-breaker"},
      [p, cleared](const std::string& name, const std::string& v) -> Status {
        if (!*cleared) p->dry_sequence_breakers.clear(), *cleared = true;
        if (v == "none") {
          p->dry_sequence_breakers.clear();
          return Status::ok();
        }
        if (v.empty()) return make_error(ErrorCode::kInvalidArgument, "%s: empty (\"none\" for no breakers)", name.c_str());
        p->dry_sequence_breakers.push_back(v);
        return Status::ok();
      },
      "STRING", "a DRY sequence breaker (repeatable; replaces the defaults '\\n', ':', '\"', '*'; none: no breakers)");
  args.option({"--xtc-probability"}, &p->xtc_probability, "P", "XTC: chance of removing the top tokens; 0: off (default 0)");
  args.option({"--xtc-threshold"}, &p->xtc_threshold, "P", "XTC: minimum probability of a top token; > 0.5: off (default 0.1)");
  args.option({"--mirostat"}, &p->mirostat, "N",
              "mirostat sampling: 0 off, 1 mirostat, 2 mirostat 2.0; replaces top-k, top-p, min-p, typical, XTC, the "
              "penalties and DRY (default 0)");
  args.option({"--mirostat-lr"}, &p->mirostat_eta, "ETA", "mirostat learning rate eta (default 0.1)");
  args.option({"--mirostat-ent"}, &p->mirostat_tau, "TAU", "mirostat target entropy tau (default 5.0)");
  args.option(
      {"-l", "--logit-bias"},
      [p](const std::string& name, const std::string& v) -> Status {
        KILN_ASSIGN_OR_RETURN(LogitBias b, parse_logit_bias(name, v));
        p->logit_bias.push_back(b);
        return Status::ok();
      },
      "TOKEN_ID(+/-)BIAS", "add BIAS to the token's logit (repeatable; 15043-inf bans token 15043)");
  args.option(
      {"-s", "--seed"},
      [p](const std::string& name, const std::string& v) -> Status {
        if (v == "-1") {  // llama.cpp: -1 (LLAMA_DEFAULT_SEED) picks a random seed
          p->seed = kRandomSeed;
          return Status::ok();
        }
        errno = 0;
        char* end = nullptr;
        const unsigned long long x = v.empty() || v[0] == '-' ? 0 : std::strtoull(v.c_str(), &end, 10);
        if (v.empty() || v[0] == '-' || errno != 0 || *end != '\0')
          return make_error(ErrorCode::kInvalidArgument, "%s: '%s' is not a seed (a non-negative integer, or -1 for a "
                            "random one)", name.c_str(), v.c_str());
        p->seed = x;
        return Status::ok();
      },
      "N", "RNG seed; -1: random (default: random)");
}

Status check_sampling_options(const SamplerParams& p) {
  auto bad = [](const char* flag, const char* rule, double v) {
    return make_error(ErrorCode::kInvalidArgument, "%s: must be %s (got %g)", flag, rule, v);
  };
  if (!std::isfinite(p.temp)) return bad("--temp", "a finite number (<= 0: greedy)", p.temp);
  if (p.top_k < 0) return bad("--top-k", ">= 0 (0: off)", p.top_k);
  if (!(p.top_p >= 0.0f && p.top_p <= 1.0f)) return bad("--top-p", "in [0, 1] (1: off)", p.top_p);
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return bad("--min-p", "in [0, 1] (0: off)", p.min_p);
  if (!(p.typical_p >= 0.0f && p.typical_p <= 1.0f)) return bad("--typical", "in [0, 1] (1: off)", p.typical_p);
  if (!(p.repeat_penalty > 0.0f) || !std::isfinite(p.repeat_penalty) || !std::isfinite(1.0f / p.repeat_penalty))
    return bad("--repeat-penalty", "a finite number > 0 (1: off)", p.repeat_penalty);
  if (p.penalty_last_n < -1) return bad("--repeat-last-n", ">= -1 (0: off, -1: the whole context)", p.penalty_last_n);
  if (!std::isfinite(p.presence_penalty)) return bad("--presence-penalty", "a finite number", p.presence_penalty);
  if (!std::isfinite(p.frequency_penalty)) return bad("--frequency-penalty", "a finite number", p.frequency_penalty);
  if (!(p.dry_multiplier >= 0.0f) || !std::isfinite(p.dry_multiplier))
    return bad("--dry-multiplier", "a finite number >= 0 (0: off)", p.dry_multiplier);
  if (!(p.dry_base >= 1.0f) || !std::isfinite(p.dry_base)) return bad("--dry-base", "a finite number >= 1", p.dry_base);
  if (p.dry_allowed_length < 0) return bad("--dry-allowed-length", ">= 0", p.dry_allowed_length);
  if (p.dry_penalty_last_n < -1)
    return bad("--dry-penalty-last-n", ">= -1 (0: off, -1: the whole context)", p.dry_penalty_last_n);
  if (p.dry_sequence_breakers.size() > DryBreakers::kMaxBreakers)
    return bad("--dry-sequence-breaker", "given at most 64 times", static_cast<double>(p.dry_sequence_breakers.size()));
  if (!(p.xtc_probability >= 0.0f && p.xtc_probability <= 1.0f))
    return bad("--xtc-probability", "in [0, 1] (0: off)", p.xtc_probability);
  if (!(p.xtc_threshold >= 0.0f && p.xtc_threshold <= 1.0f))
    return bad("--xtc-threshold", "in [0, 1] (> 0.5: off)", p.xtc_threshold);
  if (p.mirostat < 0 || p.mirostat > 2) return bad("--mirostat", "0 (off), 1 or 2", p.mirostat);
  if (!(p.mirostat_eta >= 0.0f) || !std::isfinite(p.mirostat_eta))
    return bad("--mirostat-lr", "a finite number >= 0", p.mirostat_eta);
  if (!(p.mirostat_tau >= 0.0f) || !std::isfinite(p.mirostat_tau))
    return bad("--mirostat-ent", "a finite number >= 0", p.mirostat_tau);
  return Status::ok();
}

Status check_sampling_vocab(const SamplerParams& p, int32_t n_vocab) {
  for (const LogitBias& b : p.logit_bias)
    if (b.token < 0 || b.token >= n_vocab)
      return make_error(ErrorCode::kInvalidArgument, "--logit-bias: token id %d is outside the model's vocabulary [0, %d)",
                        b.token, n_vocab);
  return Status::ok();
}

}  // namespace kiln::cli
