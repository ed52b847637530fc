// Pieces of `kiln synth`: random tensor data generators and the tokenizer metadata it writes.
#pragma once

#include <cstdint>
#include <string>

#include "gguf/gguf.h"

namespace kiln::cli::synth {

// ---- tensor data (synth_fill.cpp) ------------------------------------------------------------------------------
// Every generator is deterministic per (key, block index): a block's bytes come from a splitmix64 stream seeded
// by the tensor key and the block's index, so the output does not depend on how the writer chunks or threads it.

// Random weights with element standard deviation about `sigma`, in `type`'s block layout (F32, F16, Q8_0, Q4_0,
// Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4, TQ1_0, TQ2_0): random quants with small, finite,
// normal-range f16 scales. Q8_0 never uses -128 (symmetric range, as llama.cpp's quantizer produces).
Result<gguf::Writer::FillFn> random_weights(DType type, uint64_t key, float sigma);
// F32 values uniform in [center - spread, center + spread] (norm weights near 1, small biases near 0).
gguf::Writer::FillFn uniform_f32(uint64_t key, float center, float spread);

// ---- tokenizer metadata (synth_vocab.cpp) -----------------------------------------------------------------------
// Built-in byte-level BPE (model "gpt2", pre "gpt-2"): the 256 byte tokens in GPT-2's byte-to-unicode order, merges
// learned from a built-in English paragraph, "<|endoftext|>" (control, BOS and EOS), then "[PAD<id>]" control
// tokens up to n_vocab. Error if n_vocab is too small to hold them.
// harmony (gpt-oss): pre "gpt-4o" and, after the same BPE tokens and "[PAD<id>]" tokens, o200k_harmony's special
// block at the end of the vocabulary (201088 - 199998 = 1090 control tokens, fewer when n_vocab leaves less room):
// <|startoftext|> (BOS), <|endoftext|> (padding), <|reserved_200000|>, <|reserved_200001|>, <|return|> (EOS),
// <|constrain|>, <|reserved_200004|>, <|channel|>, <|start|>, <|end|>, <|message|>, 3 reserved, <|call|>,
// 5 reserved, <|endofprompt|>, then <|reserved_ID|> with ID its o200k id; at n_vocab 201088 every special token
// has its o200k_harmony id.
Status add_builtin_vocab(gguf::Writer& w, int64_t n_vocab, bool harmony = false);
// Smallest vocabulary add_builtin_vocab accepts.
int64_t builtin_vocab_size(bool harmony = false);
// Copies every tokenizer.* key of `vocab` and pads tokens / scores / token_type with "[PAD<id>]" control tokens
// up to n_vocab (n_vocab >= the vocabulary's size).
Status copy_vocab(gguf::Writer& w, const gguf::File& vocab, int64_t n_vocab);
// Number of tokens in a vocabulary GGUF (tokenizer.ggml.tokens), with an error naming the file.
Result<int64_t> vocab_size(const gguf::File& vocab);

}  // namespace kiln::cli::synth
