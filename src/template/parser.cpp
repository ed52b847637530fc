// Recursive-descent parser following jinja2/parser.py (same precedence and the same corner cases: `-x|f` is
// f(-x), `is` binds tighter than comparisons, `a if b` without else is Undefined, `for x in y if c`).
// After parsing, a check pass applies jinja2's compile-time rules: an unknown filter or test is an error unless
// it sits (directly, not inside a loop/macro/block body) in an if statement or conditional expression, where
// jinja2 defers the error to run time (kiln marks the node `unknown` and fails if it is evaluated).
#include <unordered_set>

#include "template/ast.h"
#include "template/lexer.h"

namespace kiln::tpl {

namespace {

class Parser {
 public:
  Parser(std::vector<Token> toks, std::string name, const ParseLimits& lim)
      : t_(std::move(toks)), name_(std::move(name)), lim_(lim) {}

  Status parse(Body* out) {
    KILN_TRY(subparse({}, out, nullptr));
    if (cur().type != Tok::kEof) return err(cur(), "unexpected tag");
    return Status::ok();
  }

 private:
  std::vector<Token> t_;
  size_t p_ = 0;
  std::string name_;
  ParseLimits lim_;
  int depth_ = 0;
  int loop_depth_ = 0;  // break/continue are only valid inside a for body (macros reset it)

  const Token& cur() const { return t_[p_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  void next() {
    if (p_ + 1 < t_.size()) ++p_;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::kEof: return "end of template";
      case Tok::kVarEnd: return "end of print statement";
      case Tok::kBlockEnd: return "end of statement block";
      case Tok::kData: return "template data";
      case Tok::kVarBegin: return "begin of print statement";
      case Tok::kBlockBegin: return "begin of statement block";
      case Tok::kString: return "string";
      default: return "'" + t.text + "'";
    }
  }
  Status err(const Token& t, const std::string& msg) const {
    return make_error(ErrorCode::kInvalidArgument, "%s: line %d, column %d: %s", name_.c_str(), t.line, t.col,
                      msg.c_str());
  }
  bool is_op(const char* op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::kName && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  Status expect_op(const char* op) {
    if (!skip_op(op)) return err(cur(), std::string("expected '") + op + "', got " + describe(cur()));
    return Status::ok();
  }
  Status expect_block_end() {
    if (cur().type != Tok::kBlockEnd) return err(cur(), "expected end of statement block, got " + describe(cur()));
    next();
    return Status::ok();
  }
  Result<std::string> expect_name() {
    if (cur().type != Tok::kName) return err(cur(), "expected a name, got " + describe(cur()));
    std::string n = cur().text;
    next();
    return n;
  }
  ExprPtr mk(EK k, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = at.line;
    e->col = at.col;
    return e;
  }
  struct DepthGuard {
    int* d;
    explicit DepthGuard(int* d) : d(d) { ++*d; }
    ~DepthGuard() { --*d; }
  };
  Status check_depth(const Token& at) {
    if (depth_ > lim_.max_nesting) return err(at, strprintf("template nested deeper than %d levels", lim_.max_nesting));
    return Status::ok();
  }

  // ---- statements

  // Parses nodes until a block tag whose name is in `ends` (left unconsumed, name in *end), or EOF.
  Status subparse(const std::vector<std::string>& ends, Body* out, std::string* end) {
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::kEof) {
        if (!ends.empty()) {
          std::string list;
          for (const auto& e : ends) list += (list.empty() ? "'" : " or '") + e + "'";
          return err(t, "unexpected end of template, expected " + list);
        }
        return Status::ok();
      }
      if (t.type == Tok::kData) {
        auto n = std::make_unique<Node>();
        n->kind = NK::kData;
        n->line = t.line;
        n->col = t.col;
        n->text = t.text;
        out->push_back(std::move(n));
        next();
        continue;
      }
      if (t.type == Tok::kVarBegin) {
        next();
        auto n = std::make_unique<Node>();
        n->kind = NK::kOutput;
        n->line = t.line;
        n->col = t.col;
        KILN_ASSIGN_OR_RETURN(n->expr, parse_tuple(false, true, {}));
        if (cur().type != Tok::kVarEnd) return err(cur(), "expected end of print statement, got " + describe(cur()));
        next();
        out->push_back(std::move(n));
        continue;
      }
      if (t.type == Tok::kBlockBegin) {
        next();
        if (cur().type != Tok::kName) return err(cur(), "tag name expected");
        for (const auto& e : ends)
          if (cur().text == e) {
            *end = e;
            next();
            return Status::ok();
          }
        KILN_TRY(parse_statement(out));
        continue;
      }
      return err(t, "unexpected " + describe(t));
    }
  }

  Status body_until(const std::vector<std::string>& ends, Body* out, std::string* end) {
    DepthGuard g(&depth_);
    KILN_TRY(check_depth(cur()));
    return subparse(ends, out, end);
  }

  Status parse_statement(Body* out) {
    const Token tag = cur();
    const std::string& n = tag.text;
    auto node = std::make_unique<Node>();
    node->line = tag.line;
    node->col = tag.col;
    next();
    std::string end;
    if (n == "if") {
      node->kind = NK::kIf;
      while (true) {
        KILN_ASSIGN_OR_RETURN(ExprPtr test, parse_tuple(false, false, {}));
        KILN_TRY(expect_block_end());
        node->tests.push_back(std::move(test));
        node->bodies.emplace_back();
        KILN_TRY(body_until({"elif", "else", "endif"}, &node->bodies.back(), &end));
        if (end == "elif") continue;
        if (end == "else") {
          KILN_TRY(expect_block_end());
          KILN_TRY(body_until({"endif"}, &node->else_body, &end));
        }
        break;
      }
      KILN_TRY(expect_block_end());
    } else if (n == "for") {
      node->kind = NK::kFor;
      KILN_TRY(parse_targets(node.get(), false));
      if (!skip_name("in")) return err(cur(), "expected 'in', got " + describe(cur()));
      KILN_ASSIGN_OR_RETURN(node->expr, parse_tuple(false, false, {"recursive", "if"}));
      if (skip_name("if")) {
        KILN_ASSIGN_OR_RETURN(node->filter, parse_expression(true));
      }
      node->recursive = skip_name("recursive");
      KILN_TRY(expect_block_end());
      ++loop_depth_;
      Status st = body_until({"endfor", "else"}, &node->body, &end);
      --loop_depth_;
      KILN_TRY(st);
      if (end == "else") {
        KILN_TRY(expect_block_end());
        KILN_TRY(body_until({"endfor"}, &node->else_body, &end));
      }
      KILN_TRY(expect_block_end());
    } else if (n == "set") {
      KILN_TRY(parse_targets(node.get(), true));
      if (skip_op("=")) {
        node->kind = NK::kSet;
        KILN_ASSIGN_OR_RETURN(node->expr, parse_tuple(false, true, {}));
        KILN_TRY(expect_block_end());
      } else {
        node->kind = NK::kSetBlock;
        if (!node->attr_of.empty() || node->targets.size() != 1) return err(tag, "block set needs a single name");
        if (is_op("|")) {
          KILN_ASSIGN_OR_RETURN(node->filter, parse_filter(nullptr, tag));
        }
        KILN_TRY(expect_block_end());
        KILN_TRY(body_until({"endset"}, &node->body, &end));
        KILN_TRY(expect_block_end());
      }
    } else if (n == "macro") {
      node->kind = NK::kMacro;
      KILN_ASSIGN_OR_RETURN(node->name, expect_name());
      KILN_TRY(expect_op("("));
      KILN_TRY(parse_signature(node.get()));
      KILN_TRY(expect_block_end());
      const int saved = loop_depth_;
      loop_depth_ = 0;
      Status st = body_until({"endmacro"}, &node->body, &end);
      loop_depth_ = saved;
      KILN_TRY(st);
      if (cur().type == Tok::kName && cur().text == node->name) next();  // {% endmacro name %}
      KILN_TRY(expect_block_end());
    } else if (n == "call") {
      node->kind = NK::kCallBlock;
      if (skip_op("(")) KILN_TRY(parse_signature(node.get()));
      KILN_ASSIGN_OR_RETURN(node->expr, parse_expression(true));
      if (node->expr->kind != EK::kCall) return err(tag, "expected call");
      KILN_TRY(expect_block_end());
      const int saved = loop_depth_;
      loop_depth_ = 0;
      Status st = body_until({"endcall"}, &node->body, &end);
      loop_depth_ = saved;
      KILN_TRY(st);
      KILN_TRY(expect_block_end());
    } else if (n == "filter") {
      node->kind = NK::kFilterBlock;
      KILN_ASSIGN_OR_RETURN(node->filter, parse_filter(nullptr, tag, true));
      KILN_TRY(expect_block_end());
      KILN_TRY(body_until({"endfilter"}, &node->body, &end));
      KILN_TRY(expect_block_end());
    } else if (n == "with") {
      node->kind = NK::kWith;
      while (cur().type != Tok::kBlockEnd) {
        if (!node->targets.empty()) KILN_TRY(expect_op(","));
        KILN_ASSIGN_OR_RETURN(std::string t, expect_name());
        KILN_TRY(expect_op("="));
        KILN_ASSIGN_OR_RETURN(ExprPtr v, parse_expression(true));
        node->targets.push_back(t);
        node->with_values.push_back(std::move(v));
      }
      KILN_TRY(expect_block_end());
      KILN_TRY(body_until({"endwith"}, &node->body, &end));
      KILN_TRY(expect_block_end());
    } else if (n == "break" || n == "continue") {
      if (loop_depth_ == 0) return err(tag, "'" + n + "' outside of a loop");
      node->kind = n == "break" ? NK::kBreak : NK::kContinue;
      KILN_TRY(expect_block_end());
    } else if (n == "generation") {
      node->kind = NK::kGeneration;
      KILN_TRY(expect_block_end());
      KILN_TRY(body_until({"endgeneration"}, &node->body, &end));
      KILN_TRY(expect_block_end());
    } else if (n == "include" || n == "import" || n == "from" || n == "extends" || n == "block") {
      return err(tag, "'" + n + "' is not supported in chat templates (there is no template loader)");
    } else {
      return err(tag, "Encountered unknown tag '" + n + "'.");
    }
    out->push_back(std::move(node));
    return Status::ok();
  }

  // for/set targets: name, name1, name2 ..., (a, b), or (set only) ns.attr
  Status parse_targets(Node* node, bool allow_ns) {
    const bool paren = skip_op("(");
    while (true) {
      KILN_ASSIGN_OR_RETURN(std::string nm, expect_name());
      if (allow_ns && node->targets.empty() && is_op(".")) {
        next();
        KILN_ASSIGN_OR_RETURN(node->attr_of, expect_name());
        node->targets.push_back(nm);
        break;
      }
      node->targets.push_back(nm);
      if (!skip_op(",")) break;
      node->target_tuple = true;
      if (cur().type != Tok::kName) break;
    }
    if (paren) {
      node->target_tuple = true;
      KILN_TRY(expect_op(")"));
    }
    return Status::ok();
  }

  Status parse_signature(Node* node) {  // after "(": name [= default], ... ")"
    while (!is_op(")")) {
      if (!node->params.empty()) KILN_TRY(expect_op(","));
      if (is_op(")")) break;
      KILN_ASSIGN_OR_RETURN(std::string nm, expect_name());
      ExprPtr def;
      if (skip_op("=")) {
        KILN_ASSIGN_OR_RETURN(def, parse_expression(true));
      }
      else if (!node->defaults.empty() && node->defaults.back()) return err(cur(), "non-default argument follows default argument");
      node->params.push_back(nm);
      node->defaults.push_back(std::move(def));
    }
    next();
    return Status::ok();
  }

  // ---- expressions

  bool is_tuple_end(const std::vector<std::string>& extra) const {
    if (cur().type == Tok::kVarEnd || cur().type == Tok::kBlockEnd || cur().type == Tok::kEof) return true;
    if (is_op(")")) return true;
    for (const auto& e : extra)
      if (cur().type == Tok::kName && cur().text == e) return true;
    return false;
  }

  Result<ExprPtr> parse_tuple(bool explicit_parens, bool with_condexpr, const std::vector<std::string>& extra) {
    const Token start = cur();
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) KILN_TRY(expect_op(","));
      if (is_tuple_end(extra)) break;
      KILN_ASSIGN_OR_RETURN(ExprPtr e, with_condexpr ? parse_expression(true) : parse_or());
      args.push_back(std::move(e));
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) return err(cur(), "Expected an expression, got " + describe(cur()));
    }
    auto t = mk(EK::kTuple, start);
    t->args = std::move(args);
    return t;
  }

  Result<ExprPtr> parse_expression(bool with_condexpr) {
    DepthGuard g(&depth_);
    KILN_TRY(check_depth(cur()));
    if (!with_condexpr) return parse_or();
    const Token start = cur();
    KILN_ASSIGN_OR_RETURN(ExprPtr e1, parse_or());
    while (skip_name("if")) {
      KILN_ASSIGN_OR_RETURN(ExprPtr test, parse_or());
      ExprPtr e3;
      if (skip_name("else")) {
        KILN_ASSIGN_OR_RETURN(e3, parse_expression(true));
      }
      auto c = mk(EK::kCond, start);
      c->a = std::move(test);
      c->b = std::move(e1);
      c->c = std::move(e3);
      e1 = std::move(c);
    }
    return e1;
  }

  Result<ExprPtr> parse_or() {
    const Token start = cur();
    KILN_ASSIGN_OR_RETURN(ExprPtr l, parse_and());
    while (skip_name("or")) {
      KILN_ASSIGN_OR_RETURN(ExprPtr r, parse_and());
      auto e = mk(EK::kOr, start);
      e->a = std::move(l);
      e->b = std::move(r);
      l = std::move(e);
    }
    return l;
  }
  Result<ExprPtr> parse_and() {
    const Token start = cur();
    KILN_ASSIGN_OR_RETURN(ExprPtr l, parse_not());
    while (skip_name("and")) {
      KILN_ASSIGN_OR_RETURN(ExprPtr r, parse_not());
      auto e = mk(EK::kAnd, start);
      e->a = std::move(l);
      e->b = std::move(r);
      l = std::move(e);
    }
    return l;
  }
  Result<ExprPtr> parse_not() {
    const Token start = cur();
    if (skip_name("not")) {
      DepthGuard g(&depth_);
      KILN_TRY(check_depth(start));
      KILN_ASSIGN_OR_RETURN(ExprPtr x, parse_not());
      auto e = mk(EK::kNot, start);
      e->a = std::move(x);
      return e;
    }
    return parse_compare();
  }
  Result<ExprPtr> parse_compare() {
    const Token start = cur();
    KILN_ASSIGN_OR_RETURN(ExprPtr first, parse_math1());
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                     cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().type == Tok::kName && peek().text == "in") {
        op = "notin";
        next();
        next();
      } else {
        break;
      }
      KILN_ASSIGN_OR_RETURN(ExprPtr rhs, parse_math1());
      if (!cmp) {
        cmp = mk(EK::kCompare, start);
        cmp->a = std::move(first);
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(std::move(rhs));
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  Result<ExprPtr> binary(ExprPtr l, const std::string& op, ExprPtr r, const Token& at) {
    auto e = mk(EK::kBinary, at);
    e->name = op;
    e->a = std::move(l);
    e->b = std::move(r);
    return e;
  }
  Result<ExprPtr> parse_math1() {
    const Token start = cur();
    KILN_ASSIGN_OR_RETURN(ExprPtr l, parse_concat());
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().text;
      next();
      KILN_ASSIGN_OR_RETURN(ExprPtr r, parse_concat());
      KILN_ASSIGN_OR_RETURN(l, binary(std::move(l), op, std::move(r), start));
    }
    return l;
  }
  Result<ExprPtr> parse_concat() {
    const Token start = cur();
    KILN_ASSIGN_OR_RETURN(ExprPtr first, parse_math2());
    if (!is_op("~")) return first;
    auto e = mk(EK::kConcat, start);
    e->args.push_back(std::move(first));
    while (skip_op("~")) {
      KILN_ASSIGN_OR_RETURN(ExprPtr r, parse_math2());
      e->args.push_back(std::move(r));
    }
    return e;
  }
  Result<ExprPtr> parse_math2() {
    const Token start = cur();
    KILN_ASSIGN_OR_RETURN(ExprPtr l, parse_pow());
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().text;
      next();
      KILN_ASSIGN_OR_RETURN(ExprPtr r, parse_pow());
      KILN_ASSIGN_OR_RETURN(l, binary(std::move(l), op, std::move(r), start));
    }
    return l;
  }
  Result<ExprPtr> parse_pow() {
    const Token start = cur();
    KILN_ASSIGN_OR_RETURN(ExprPtr l, parse_unary(true));
    while (skip_op("**")) {
      KILN_ASSIGN_OR_RETURN(ExprPtr r, parse_unary(true));
      KILN_ASSIGN_OR_RETURN(l, binary(std::move(l), "**", std::move(r), start));
    }
    return l;
  }
  Result<ExprPtr> parse_unary(bool with_filter) {
    const Token start = cur();
    DepthGuard g(&depth_);
    KILN_TRY(check_depth(start));
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const bool neg = is_op("-");
      next();
      KILN_ASSIGN_OR_RETURN(ExprPtr x, parse_unary(false));
      node = mk(neg ? EK::kNeg : EK::kPos, start);
      node->a = std::move(x);
    } else {
      KILN_ASSIGN_OR_RETURN(node, parse_primary());
    }
    KILN_ASSIGN_OR_RETURN(node, parse_postfix(std::move(node)));
    if (with_filter) {
      KILN_ASSIGN_OR_RETURN(node, parse_filter_expr(std::move(node)));
    }
    return node;
  }
  Result<ExprPtr> parse_primary() {
    const Token t = cur();
    switch (t.type) {
      case Tok::kName: {
        next();
        auto e = mk(EK::kConst, t);
        if (t.text == "true" || t.text == "True") e->value = Value::boolean(true);
        else if (t.text == "false" || t.text == "False") e->value = Value::boolean(false);
        else if (t.text == "none" || t.text == "None") e->value = Value::none();
        else {
          e->kind = EK::kName;
          e->name = t.text;
        }
        return e;
      }
      case Tok::kString: {
        std::string s;
        while (cur().type == Tok::kString) {  // adjacent literals concatenate
          s += cur().text;
          next();
        }
        auto e = mk(EK::kConst, t);
        e->value = Value::string(std::move(s));
        return e;
      }
      case Tok::kInt: {
        next();
        auto e = mk(EK::kConst, t);
        errno = 0;
        char* endp = nullptr;
        const long long v = std::strtoll(t.text.c_str(), &endp, 10);
        if (errno == ERANGE) return err(t, "integer literal too large for kiln (64-bit integers)");
        e->value = Value::integer(v);
        return e;
      }
      case Tok::kFloat: {
        next();
        auto e = mk(EK::kConst, t);
        e->value = Value::number(std::strtod(t.text.c_str(), nullptr));
        return e;
      }
      case Tok::kOp:
        if (t.text == "(") {
          next();
          KILN_ASSIGN_OR_RETURN(ExprPtr e, parse_tuple(true, true, {}));
          KILN_TRY(expect_op(")"));
          return e;
        }
        if (t.text == "[") {
          next();
          auto e = mk(EK::kList, t);
          while (!is_op("]")) {
            if (!e->args.empty()) KILN_TRY(expect_op(","));
            if (is_op("]")) break;
            KILN_ASSIGN_OR_RETURN(ExprPtr x, parse_expression(true));
            e->args.push_back(std::move(x));
          }
          next();
          return e;
        }
        if (t.text == "{") {
          next();
          auto e = mk(EK::kDict, t);
          while (!is_op("}")) {
            if (!e->args.empty()) KILN_TRY(expect_op(","));
            if (is_op("}")) break;
            KILN_ASSIGN_OR_RETURN(ExprPtr k, parse_expression(true));
            KILN_TRY(expect_op(":"));
            KILN_ASSIGN_OR_RETURN(ExprPtr v, parse_expression(true));
            e->args.push_back(std::move(k));
            e->args.push_back(std::move(v));
          }
          next();
          return e;
        }
        break;
      default: break;
    }
    return err(t, "unexpected " + describe(t));
  }
  Result<ExprPtr> parse_postfix(ExprPtr node) {
    while (true) {
      const Token t = cur();
      if (is_op(".")) {
        next();
        if (cur().type == Tok::kName) {
          auto e = mk(EK::kGetAttr, t);
          e->name = cur().text;
          e->a = std::move(node);
          next();
          node = std::move(e);
        } else if (cur().type == Tok::kInt) {
          auto e = mk(EK::kGetItem, t);
          e->a = std::move(node);
          e->b = mk(EK::kConst, cur());
          e->b->value = Value::integer(std::strtoll(cur().text.c_str(), nullptr, 10));
          next();
          node = std::move(e);
        } else {
          return err(cur(), "expected name or number");
        }
      } else if (is_op("[")) {
        next();
        KILN_ASSIGN_OR_RETURN(node, parse_subscript(std::move(node), t));
      } else if (is_op("(")) {
        KILN_ASSIGN_OR_RETURN(node, parse_call(std::move(node)));
      } else {
        return node;
      }
    }
  }
  // after "[": index, slice or tuple of indices
  Result<ExprPtr> parse_subscript(ExprPtr obj, const Token& at) {
    std::vector<ExprPtr> idx;
    ExprPtr slice;
    while (!is_op("]")) {
      if (!idx.empty() || slice) KILN_TRY(expect_op(","));
      ExprPtr parts[3];
      bool is_slice = false;
      if (!is_op(":")) {
        KILN_ASSIGN_OR_RETURN(parts[0], parse_expression(true));
      }
      if (skip_op(":")) {
        is_slice = true;
        if (!is_op("]") && !is_op(",") && !is_op(":")) {
          KILN_ASSIGN_OR_RETURN(parts[1], parse_expression(true));
        }
        if (skip_op(":") && !is_op("]") && !is_op(",")) {
          KILN_ASSIGN_OR_RETURN(parts[2], parse_expression(true));
        }
      }
      if (is_slice) {
        if (slice || !idx.empty()) return err(at, "kiln supports one slice per subscript");
        slice = mk(EK::kSlice, at);
        slice->b = std::move(parts[0]);
        slice->c = std::move(parts[1]);
        slice->args.push_back(std::move(parts[2]));
      } else {
        if (slice) return err(at, "kiln supports one slice per subscript");
        if (!parts[0]) return err(cur(), "expected an expression");
        idx.push_back(std::move(parts[0]));
      }
    }
    next();
    if (slice) {
      slice->a = std::move(obj);
      return slice;
    }
    auto e = mk(EK::kGetItem, at);
    e->a = std::move(obj);
    if (idx.size() == 1) {
      e->b = std::move(idx[0]);
    } else {
      e->b = mk(EK::kTuple, at);
      e->b->args = std::move(idx);
    }
    return e;
  }
  Status parse_call_args(Expr* call) {  // at "("
    KILN_TRY(expect_op("("));
    while (!is_op(")")) {
      if (!call->args.empty() || !call->kwargs.empty() || call->star || call->dstar) KILN_TRY(expect_op(","));
      if (is_op(")")) break;
      if (skip_op("**")) {
        KILN_ASSIGN_OR_RETURN(call->dstar, parse_expression(true));
      } else if (skip_op("*")) {
        KILN_ASSIGN_OR_RETURN(call->star, parse_expression(true));
      } else if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
        std::string k = cur().text;
        next();
        next();
        KILN_ASSIGN_OR_RETURN(ExprPtr v, parse_expression(true));
        call->kwargs.emplace_back(std::move(k), std::move(v));
      } else {
        if (!call->kwargs.empty() || call->dstar) return err(cur(), "invalid syntax for function call expression");
        KILN_ASSIGN_OR_RETURN(ExprPtr v, parse_expression(true));
        call->args.push_back(std::move(v));
      }
    }
    next();
    return Status::ok();
  }
  Result<ExprPtr> parse_call(ExprPtr fn) {
    auto e = mk(EK::kCall, cur());
    e->line = fn->line;  // a call is located at its callee ("raise_exception" rather than its "(")
    e->col = fn->col;
    e->a = std::move(fn);
    KILN_TRY(parse_call_args(e.get()));
    return e;
  }
  Result<ExprPtr> parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        KILN_ASSIGN_OR_RETURN(node, parse_filter(std::move(node), cur()));
      } else if (is_name("is")) {
        KILN_ASSIGN_OR_RETURN(node, parse_test(std::move(node)));
      } else if (is_op("(")) {
        KILN_ASSIGN_OR_RETURN(node, parse_call(std::move(node)));
      } else {
        return node;
      }
    }
  }
  // "|name(args)|name2..." (start_inline: the first "|" is implied, as after {% filter %})
  Result<ExprPtr> parse_filter(ExprPtr node, const Token& at, bool start_inline = false) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      const Token nt = cur();
      KILN_ASSIGN_OR_RETURN(std::string nm, expect_name());
      while (is_op(".")) {
        next();
        KILN_ASSIGN_OR_RETURN(std::string part, expect_name());
        nm += "." + part;
      }
      auto e = mk(EK::kFilter, nt);
      e->name = nm;
      e->a = std::move(node);
      e->unknown = !have_filter(nm);
      if (is_op("(")) KILN_TRY(parse_call_args(e.get()));
      node = std::move(e);
    }
    (void)at;
    return node;
  }
  Result<ExprPtr> parse_test(ExprPtr node) {
    const Token at = cur();
    next();  // "is"
    const bool negated = skip_name("not");
    const Token nt = cur();
    KILN_ASSIGN_OR_RETURN(std::string nm, expect_name());
    while (is_op(".")) {
      next();
      KILN_ASSIGN_OR_RETURN(std::string part, expect_name());
      nm += "." + part;
    }
    auto e = mk(EK::kTest, nt);
    e->name = nm;
    e->a = std::move(node);
    e->unknown = !have_test(nm);
    if (is_op("(")) {
      KILN_TRY(parse_call_args(e.get()));
    } else if ((cur().type == Tok::kName || cur().type == Tok::kString || cur().type == Tok::kInt ||
                cur().type == Tok::kFloat || is_op("(") || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) return err(cur(), "You cannot chain multiple tests with is");
      KILN_ASSIGN_OR_RETURN(ExprPtr arg, parse_primary());
      KILN_ASSIGN_OR_RETURN(arg, parse_postfix(std::move(arg)));
      e->args.push_back(std::move(arg));
    }
    if (!negated) return e;
    auto n = mk(EK::kNot, at);
    n->a = std::move(e);
    return n;
  }
};

// ---- the compile-time check pass (see the file comment)

struct Checker {
  std::string name;
  Status first;  // the first hard error

  void fail(const Expr& e, const char* what) {
    if (first.is_ok())
      first = make_error(ErrorCode::kInvalidArgument, "%s: line %d, column %d: No %s named '%s'.", name.c_str(), e.line,
                         e.col, what, e.name.c_str());
  }
  void expr(const Expr* e, bool soft, Node* macro) {
    if (!e) return;
    if ((e->kind == EK::kFilter || e->kind == EK::kTest) && e->unknown && !soft)
      fail(*e, e->kind == EK::kFilter ? "filter" : "test");
    if (macro && e->kind == EK::kName) {
      if (e->name == "varargs") macro->uses_varargs = true;
      if (e->name == "kwargs") macro->uses_kwargs = true;
      if (e->name == "caller") macro->uses_caller = true;
    }
    const bool sub_soft = soft || e->kind == EK::kCond;
    expr(e->a.get(), sub_soft, macro);
    expr(e->b.get(), sub_soft, macro);
    expr(e->c.get(), sub_soft, macro);
    for (const auto& x : e->args) expr(x.get(), sub_soft, macro);
    for (const auto& kv : e->kwargs) expr(kv.second.get(), sub_soft, macro);
    expr(e->star.get(), sub_soft, macro);
    expr(e->dstar.get(), sub_soft, macro);
  }
  void body(Body& b, bool soft, Node* macro) {
    for (auto& n : b) node(*n, soft, macro);
  }
  void node(Node& n, bool soft, Node* macro) {
    switch (n.kind) {
      case NK::kIf:
        for (auto& t : n.tests) expr(t.get(), true, macro);
        for (auto& b : n.bodies) body(b, true, macro);
        body(n.else_body, true, macro);
        return;
      case NK::kFor:
        expr(n.expr.get(), soft, macro);
        expr(n.filter.get(), false, macro);
        body(n.body, false, macro);
        body(n.else_body, false, macro);
        return;
      case NK::kMacro:
        for (auto& d : n.defaults) expr(d.get(), false, &n);
        body(n.body, false, &n);
        return;
      case NK::kCallBlock:
        expr(n.expr.get(), soft, macro);
        for (auto& d : n.defaults) expr(d.get(), false, &n);
        body(n.body, false, &n);
        return;
      case NK::kSetBlock:
      case NK::kFilterBlock:
      case NK::kWith:
      case NK::kGeneration:
        expr(n.filter.get(), false, macro);
        for (auto& v : n.with_values) expr(v.get(), soft, macro);
        body(n.body, false, macro);
        return;
      default:
        expr(n.expr.get(), soft, macro);
        return;
    }
  }
};

}  // namespace

Result<std::shared_ptr<Program>> parse_template(const std::string& source, const std::string& name,
                                                const ParseLimits& limits) {
  auto toks = lex(source);
  if (!toks) return Status(toks.status().code(), name + ": " + toks.status().message());
  auto prog = std::make_shared<Program>();
  prog->name = name;
  Parser p(std::move(toks).value(), name, limits);
  KILN_TRY(p.parse(&prog->body));
  Checker c{name, Status::ok()};
  c.body(prog->body, false, nullptr);
  KILN_TRY(c.first);
  return prog;
}

}  // namespace kiln::tpl
