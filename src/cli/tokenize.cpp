// kiln tokenize: text -> token ids with a model's vocabulary, like llama-tokenize.
//   --ids: one line "[id, id, ...]"; otherwise one line per token "%6d -> 'piece'" (specials rendered).
// As llama-tokenize: BOS/EOS are added as the model's flags say (--no-bos drops them), special tokens written in
// the text are parsed (--no-parse-special turns that off), and escapes (\n, \t, \xNN, ...) in -p and -f text are
// processed (--no-escape keeps the text verbatim).
#include <cstdio>
#include <fstream>

#include "cli/args.h"
#include "cli/model_source.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "util/mmap_file.h"

namespace kiln::cli {

namespace {

// llama.cpp's escape set: \n \r \t \' \" \\ and \xNN; any other backslash pair is kept as written.
std::string process_escapes(const std::string& in) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '\\' || i + 1 >= in.size()) {
      out += in[i];
      continue;
    }
    const char c = in[++i];
    switch (c) {
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case 'x': {
        const auto hex = [](char h) {
          return (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                                                   : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
        };
        if (i + 2 < in.size() && hex(in[i + 1]) >= 0 && hex(in[i + 2]) >= 0) {
          out += static_cast<char>(hex(in[i + 1]) * 16 + hex(in[i + 2]));
          i += 2;
          break;
        }
        out += '\\';
        out += c;
        break;
      }
      default:
        out += '\\';
        out += c;
    }
  }
  return out;
}

int run_tokenize(int argc, char** argv) {
  ArgParser args("tokenize", "print the token ids of a text (like llama-tokenize)");
  std::string model, prompt, file;
  bool ids_only = false, no_bos = false, no_parse_special = false, no_escape = false, show_count = false;
  args.option({"-m", "--model"}, &model, "FILE",
              std::string("GGUF file whose vocabulary to use (a vocabulary-only file works)") +
                  (have_embedded_model() ? "; default: the embedded kiln-demo model" : ""));
  args.option({"-p", "--prompt"}, &prompt, "TEXT", "text to tokenize");
  args.option({"-f", "--file"}, &file, "FILE", "read the text from FILE (bytes verbatim, then escapes)");
  args.flag({"--ids"}, &ids_only, "print only the ids, as one line [id, id, ...]");
  args.flag({"--no-bos"}, &no_bos, "do not add BOS/EOS even if the model asks for them");
  args.flag({"--no-parse-special"}, &no_parse_special, "do not recognize special tokens written in the text");
  args.flag({"--no-escape"}, &no_escape, "do not process escapes (\\n, \\t, \\xNN, ...) in the text");
  args.flag({"--show-count"}, &show_count, "print the number of tokens at the end");
  if (Status st = args.parse(argc, argv); !st) return fail("tokenize", st);
  if (args.help_requested()) {
    std::printf("%s", args.usage().c_str());
    return 0;
  }
  if (model.empty() && !have_embedded_model())
    return fail("tokenize", make_error(ErrorCode::kInvalidArgument,
                                       "no model: pass -m FILE (this build has no embedded default model)"));
  if (args.seen("-p") == args.seen("-f"))
    return fail("tokenize", make_error(ErrorCode::kInvalidArgument, "give exactly one of -p TEXT and -f FILE"));

  std::string text = prompt;
  if (args.seen("-f")) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return fail("tokenize", make_error(ErrorCode::kIo, "-f: cannot open '%s'", file.c_str()));
    // Bounded: -f /dev/zero or an endless pipe must not grow without limit.
    constexpr size_t kMaxText = size_t{256} << 20;
    char buf[1 << 16];
    while (in.read(buf, sizeof(buf)) || in.gcount() > 0) {
      text.append(buf, static_cast<size_t>(in.gcount()));
      if (text.size() > kMaxText)
        return fail("tokenize", make_error(ErrorCode::kInvalidArgument,
                                           "-f '%s': more than %zu MiB of text (the most tokenize reads)",
                                           file.c_str(), kMaxText >> 20));
    }
    if (in.bad()) return fail("tokenize", make_error(ErrorCode::kIo, "-f: error reading '%s'", file.c_str()));
  }
  if (!no_escape) text = process_escapes(text);

  auto gf = model.empty() ? gguf::File::parse(MappedFile::from_memory(embedded_model_bytes(), kEmbeddedModelName))
                          : gguf::File::open(model);
  if (!gf) return fail("tokenize", gf.status().with_context(model.empty() ? "embedded model" : "-m"));
  auto tok = Tokenizer::from_gguf(*gf);
  if (!tok) return fail("tokenize", tok.status().with_context(model.empty() ? kEmbeddedModelName : model));

  const std::vector<int32_t> ids = (*tok)->encode(text, /*add_special=*/!no_bos, /*parse_special=*/!no_parse_special);
  std::string out;
  if (ids_only) {
    out += "[";
    for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
    out += "]\n";
  } else {
    for (int32_t id : ids) {
      out += strprintf("%6d -> '", id);
      out += (*tok)->token_to_piece(id, /*render_special=*/true);
      out += "'\n";
    }
  }
  if (show_count) out += strprintf("Total number of tokens: %zu\n", ids.size());
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

KILN_REGISTER_COMMAND("tokenize", "print the token ids of a text", run_tokenize);

}  // namespace kiln::cli
