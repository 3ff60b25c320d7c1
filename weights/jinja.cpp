// Jinja2 subset interpreter; jinja.h lists the language and the environment it
// mirrors. Layout of this file:
//   1. text helpers: UTF-8, Python whitespace and case rules, float repr
//   2. values: the Python data model templates see
//   3. lexer   4. AST and parser   5. renderer
//   6. builtins: filters, tests, string/dict methods, globals
#include "weights/jinja.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <utility>
#include <variant>
#include <vector>

#include <utf8proc.h>

namespace llm::weights::jinja {
namespace {

// Expression and block nesting the parser accepts; deeper templates are
// rejected so that parsing, evaluation and destruction stay within the stack.
constexpr int kMaxNesting = 64;
constexpr int kMaxExprHeight = 160;

// A runtime error that does not know where it happened yet: the innermost
// statement or expression being evaluated adds its line and column.
struct Failure {
  std::string message;
  bool raised = false;  // from raise_exception(): shown to the user verbatim
};
[[noreturn]] void fail(std::string message) { throw Failure{std::move(message), false}; }

template <class... F>
struct overloaded : F... {
  using F::operator()...;
};

// ---------------------------------------------------------------------------
// 1. Text helpers

// Decodes the code point at s[i] and advances i. A byte that does not start
// valid UTF-8 decodes as itself and reports valid = false.
char32_t decode(std::string_view s, size_t& i, bool* valid = nullptr) {
  utf8proc_int32_t cp = 0;
  const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                  static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
  if (valid != nullptr) *valid = n > 0;
  if (n <= 0) return static_cast<unsigned char>(s[i++]);
  i += static_cast<size_t>(n);
  return static_cast<char32_t>(cp);
}

void encode(std::string& out, char32_t cp) {
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

// Python's str.isspace().
bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
         c == 0x202f || c == 0x205f || c == 0x3000;
}

bool is_line_break(char32_t c) {  // the separators of Python's str.splitlines()
  return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || (c >= 0x1c && c <= 0x1e) ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

bool is_cased(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}
char32_t to_upper(char32_t c) { return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))); }
char32_t to_lower(char32_t c) { return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))); }

// Rewrites s code point by code point; f may keep state (it sees them in order).
// Invalid UTF-8 passes through untouched.
template <class F>
std::string map_chars(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    bool valid = false;
    const char32_t c = decode(s, i, &valid);
    if (valid) {
      encode(out, f(c));
    } else {
      out.append(s.substr(start, i - start));
    }
  }
  return out;
}

std::string lower(std::string_view s) { return map_chars(s, to_lower); }
std::string upper(std::string_view s) { return map_chars(s, to_upper); }

bool all_space(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (!is_space(decode(s, i))) return false;
  }
  return true;
}

// str.strip/lstrip/rstrip: whitespace, or any code point of `chars` when given.
std::string_view strip(std::string_view s, const std::string* chars, bool left, bool right) {
  auto stripped = [chars](char32_t c) {
    if (chars == nullptr) return is_space(c);
    for (size_t i = 0; i < chars->size();) {
      if (decode(*chars, i) == c) return true;
    }
    return false;
  };
  size_t begin = 0;
  if (left) {
    while (begin < s.size()) {
      size_t next = begin;
      if (!stripped(decode(s, next))) break;
      begin = next;
    }
  }
  size_t end = s.size();
  if (right) {
    end = begin;
    for (size_t i = begin; i < s.size();) {
      if (!stripped(decode(s, i))) end = i;
    }
  }
  return s.substr(begin, end - begin);
}

// Byte offsets of each code point of s, plus s.size(): Python indexes strings
// by code point.
std::vector<size_t> char_offsets(std::string_view s) {
  std::vector<size_t> offsets;
  for (size_t i = 0; i < s.size();) {
    offsets.push_back(i);
    decode(s, i);
  }
  offsets.push_back(s.size());
  return offsets;
}

size_t char_count(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) decode(s, i);
  return n;
}

std::vector<std::string_view> split_lines(std::string_view s) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    const char32_t c = decode(s, i);
    if (!is_line_break(c)) continue;
    lines.push_back(s.substr(start, at - start));
    if (c == '\r' && i < s.size() && s[i] == '\n') ++i;
    start = i;
  }
  if (start < s.size()) lines.push_back(s.substr(start));
  return lines;
}

// Python's repr(float): the shortest round-trip digits, positional notation
// for exponents in [-4, 16), scientific otherwise.
std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));  // "-1.2345e+05"
  std::string out;
  if (sci.front() == '-') {
    out += '-';
    sci.remove_prefix(1);
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e)) {
    if (c != '.') digits += c;
  }
  int exponent = 0;
  std::string_view exp_text = sci.substr(e + 1);
  if (exp_text.front() == '+') exp_text.remove_prefix(1);
  std::from_chars(exp_text.data(), exp_text.data() + exp_text.size(), exponent);
  const int point = exponent + 1;  // digits are 0.DIGITS * 10^point
  if (point > -4 && point <= 16) {
    if (point <= 0) {
      out += "0." + std::string(static_cast<size_t>(-point), '0') + digits;
    } else if (static_cast<size_t>(point) >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(point) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(point)) + "." + digits.substr(static_cast<size_t>(point));
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += exponent < 0 ? "e-" : "e+";
    if (std::abs(exponent) < 10) out += '0';
    out += std::to_string(std::abs(exponent));
  }
  return out;
}

// ---------------------------------------------------------------------------
// 2. Values

struct Value;
struct List;
struct Dict;
struct Namespace;
struct Function;
struct Builtin;
struct Stmt;

// Jinja's Undefined: renders empty, is falsy and iterates as empty, but using
// it as an object (attribute, call, arithmetic) is an error, reported with `hint`.
struct Undefined {
  std::string hint;
};

struct Value {
  // Lists and dicts are immutable once built (the sandbox forbids mutation) and
  // shared; namespaces are the only mutable objects and live in the renderer.
  std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::string,
               std::shared_ptr<const List>, std::shared_ptr<const Dict>, Namespace*,
               std::shared_ptr<const Function>>
      v;

  Value() = default;
  Value(Undefined u) : v(std::move(u)) {}
  Value(std::nullptr_t) : v(nullptr) {}
  Value(bool b) : v(b) {}
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  Value(I i) : v(static_cast<int64_t>(i)) {}
  Value(double d) : v(d) {}
  Value(std::string s) : v(std::move(s)) {}
  Value(std::string_view s) : v(std::string(s)) {}
  Value(const char* s) : v(std::string(s)) {}
  Value(std::shared_ptr<const List> l) : v(std::move(l)) {}
  Value(std::shared_ptr<const Dict> d) : v(std::move(d)) {}
  Value(Namespace* ns) : v(ns) {}
  Value(std::shared_ptr<const Function> f) : v(std::move(f)) {}

  template <class T>
  bool is() const { return std::holds_alternative<T>(v); }
  const Undefined* undefined() const { return std::get_if<Undefined>(&v); }
  const std::string* str() const { return std::get_if<std::string>(&v); }
  const List* list() const;
  const Dict* dict() const;
  Namespace* ns() const { return is<Namespace*>() ? std::get<Namespace*>(v) : nullptr; }
  const Function* function() const;
};

struct List {
  std::vector<Value> items;
  bool is_tuple = false;
  int depth = 1;  // nesting depth, bounded so that printing and destruction stay shallow
};

// A Python dict with string keys, in insertion order.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  int depth = 1;

  const Value* find(std::string_view key) const {
    for (const auto& [k, v] : items) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  void set(std::string key, Value value) {
    for (auto& [k, v] : items) {
      if (k == key) {
        v = std::move(value);
        return;
      }
    }
    items.emplace_back(std::move(key), std::move(value));
  }
};

struct Namespace {
  Dict attrs;
};

// A macro, a global function, or a string/dict method bound to `self`.
struct Function {
  std::string name;
  const Builtin* builtin = nullptr;
  const Stmt* macro = nullptr;
  Value self;
};

const List* Value::list() const {
  const auto* p = std::get_if<std::shared_ptr<const List>>(&v);
  return p != nullptr ? p->get() : nullptr;
}
const Dict* Value::dict() const {
  const auto* p = std::get_if<std::shared_ptr<const Dict>>(&v);
  return p != nullptr ? p->get() : nullptr;
}
const Function* Value::function() const {
  const auto* p = std::get_if<std::shared_ptr<const Function>>(&v);
  return p != nullptr ? p->get() : nullptr;
}

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
};

std::string type_name(const Value& v) {
  static constexpr const char* kNames[] = {"Undefined", "NoneType", "bool",      "int",     "float",
                                           "str",       "list",     "dict",      "Namespace", "function"};
  if (const List* l = v.list(); l != nullptr && l->is_tuple) return "tuple";
  return kNames[v.v.index()];
}

[[noreturn]] void fail_undefined(const Undefined& u) {
  fail(u.hint.empty() ? "a value is undefined" : u.hint);
}

bool is_number(const Value& v) { return v.is<bool>() || v.is<int64_t>() || v.is<double>(); }
bool is_integral(const Value& v) { return v.is<bool>() || v.is<int64_t>(); }
int64_t as_int(const Value& v) { return v.is<bool>() ? int64_t{std::get<bool>(v.v)} : std::get<int64_t>(v.v); }
double as_double(const Value& v) {
  return v.is<double>() ? std::get<double>(v.v) : static_cast<double>(as_int(v));
}

bool truthy(const Value& v) {
  return std::visit(overloaded{
                        [](const Undefined&) { return false; },
                        [](std::nullptr_t) { return false; },
                        [](bool b) { return b; },
                        [](int64_t i) { return i != 0; },
                        [](double d) { return d != 0.0; },
                        [](const std::string& s) { return !s.empty(); },
                        [](const std::shared_ptr<const List>& l) { return !l->items.empty(); },
                        [](const std::shared_ptr<const Dict>& d) { return !d->items.empty(); },
                        [](Namespace*) { return true; },
                        [](const std::shared_ptr<const Function>&) { return true; },
                    },
                    v.v);
}

// Python's ==.
bool equal(const Value& a, const Value& b) {
  if (is_number(a) && is_number(b)) {
    if (is_integral(a) && is_integral(b)) return as_int(a) == as_int(b);
    return as_double(a) == as_double(b);
  }
  if (a.v.index() != b.v.index()) return false;
  if (const List* la = a.list()) {
    const List* lb = b.list();
    if (la->is_tuple != lb->is_tuple || la->items.size() != lb->items.size()) return false;
    for (size_t i = 0; i < la->items.size(); ++i) {
      if (!equal(la->items[i], lb->items[i])) return false;
    }
    return true;
  }
  if (const Dict* da = a.dict()) {
    const Dict* db = b.dict();
    if (da->items.size() != db->items.size()) return false;
    for (const auto& [k, v] : da->items) {
      const Value* other = db->find(k);
      if (other == nullptr || !equal(v, *other)) return false;
    }
    return true;
  }
  if (const std::string* s = a.str()) return *s == *b.str();
  if (a.is<Namespace*>()) return a.ns() == b.ns();
  if (a.function() != nullptr) return a.function() == b.function();
  return true;  // both undefined or both none
}

// Python's <, which refuses to order unrelated types.
bool less(const Value& a, const Value& b) {
  if (is_number(a) && is_number(b)) {
    if (is_integral(a) && is_integral(b)) return as_int(a) < as_int(b);
    return as_double(a) < as_double(b);
  }
  if (const Undefined* u = a.undefined()) fail_undefined(*u);
  if (const Undefined* u = b.undefined()) fail_undefined(*u);
  if (a.str() != nullptr && b.str() != nullptr) return *a.str() < *b.str();  // UTF-8 sorts by code point
  if (a.list() != nullptr && b.list() != nullptr && a.list()->is_tuple == b.list()->is_tuple) {
    const auto& x = a.list()->items;
    const auto& y = b.list()->items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equal(x[i], y[i])) return less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  fail("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

[[noreturn]] void fail_size(size_t max_bytes) {
  fail("string exceeds the limit of " + std::to_string(max_bytes) + " bytes");
}

void repr(const Value& v, std::string& out, int depth, size_t max_bytes);

// Python's str(); containers print their repr, which may not exceed max_bytes.
std::string to_str(const Value& v, size_t max_bytes) {
  if (v.is<Undefined>()) return "";
  if (const std::string* s = v.str()) return *s;
  std::string out;
  repr(v, out, 0, max_bytes);
  return out;
}

void repr_string(std::string_view s, std::string& out) {
  const char quote =
      (s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos) ? '"' : '\'';
  out += quote;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == quote || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  out += quote;
}

// Python's repr(), which is also how str() prints containers.
void repr(const Value& v, std::string& out, int depth, size_t max_bytes) {
  // Values are depth-bounded, but namespaces can refer to themselves.
  if (depth > 512) fail("value nested too deeply to print");
  if (out.size() > max_bytes) fail_size(max_bytes);  // a list may hold one big string many times
  std::visit(overloaded{
                 [&](const Undefined&) { out += "Undefined"; },
                 [&](std::nullptr_t) { out += "None"; },
                 [&](bool b) { out += b ? "True" : "False"; },
                 [&](int64_t i) { out += std::to_string(i); },
                 [&](double d) { out += float_repr(d); },
                 [&](const std::string& s) { repr_string(s, out); },
                 [&](const std::shared_ptr<const List>& l) {
                   out += l->is_tuple ? '(' : '[';
                   for (size_t i = 0; i < l->items.size(); ++i) {
                     if (i > 0) out += ", ";
                     repr(l->items[i], out, depth + 1, max_bytes);
                   }
                   if (l->is_tuple && l->items.size() == 1) out += ',';
                   out += l->is_tuple ? ')' : ']';
                 },
                 [&](const std::shared_ptr<const Dict>& d) {
                   out += '{';
                   for (size_t i = 0; i < d->items.size(); ++i) {
                     if (i > 0) out += ", ";
                     repr_string(d->items[i].first, out);
                     out += ": ";
                     repr(d->items[i].second, out, depth + 1, max_bytes);
                   }
                   out += '}';
                 },
                 [&](Namespace* ns) {
                   out += "<Namespace ";
                   repr(Value(std::make_shared<const Dict>(ns->attrs)), out, depth + 1, max_bytes);
                   out += '>';
                 },
                 [&](const std::shared_ptr<const Function>& f) { out += "<function " + f->name + ">"; },
             },
             v.v);
}

// Python's json.dumps, as transformers' tojson filter calls it.
struct JsonFormat {
  std::optional<std::string> indent;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
  size_t max_bytes = SIZE_MAX;
};

void json_string(std::string_view s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const char* escape = nullptr;
    switch (c) {
      case '"': escape = "\\\""; break;
      case '\\': escape = "\\\\"; break;
      case '\n': escape = "\\n"; break;
      case '\r': escape = "\\r"; break;
      case '\t': escape = "\\t"; break;
      case '\b': escape = "\\b"; break;
      case '\f': escape = "\\f"; break;
      default: break;
    }
    char buf[16];
    if (escape != nullptr) {
      out += escape;
      ++i;
    } else if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      ++i;
    } else if (c < 0x80 || !ensure_ascii) {
      out += static_cast<char>(c);
      ++i;
    } else {
      char32_t cp = decode(s, i);
      if (cp >= 0x10000) {  // a UTF-16 surrogate pair, as Python writes it
        cp -= 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
      }
      out += buf;
    }
  }
  out += '"';
}

void dump_json(const Value& v, const JsonFormat& f, int level, std::string& out) {
  if (level > 512) fail("value nested too deeply for tojson");
  if (out.size() > f.max_bytes) fail_size(f.max_bytes);
  auto newline = [&](int n) {
    if (!f.indent) return;
    out += '\n';
    for (int i = 0; i < n; ++i) {
      out += *f.indent;
      if (out.size() > f.max_bytes) fail_size(f.max_bytes);
    }
  };
  if (v.is<std::nullptr_t>()) {
    out += "null";
  } else if (v.is<bool>()) {
    out += std::get<bool>(v.v) ? "true" : "false";
  } else if (v.is<int64_t>()) {
    out += std::to_string(std::get<int64_t>(v.v));
  } else if (v.is<double>()) {
    const double d = std::get<double>(v.v);
    out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d < 0 ? "-Infinity" : "Infinity") : float_repr(d);
  } else if (const std::string* s = v.str()) {
    json_string(*s, f.ensure_ascii, out);
  } else if (const List* l = v.list()) {
    if (l->items.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < l->items.size(); ++i) {
      if (i > 0) out += f.item_separator;
      newline(level + 1);
      dump_json(l->items[i], f, level + 1, out);
    }
    newline(level);
    out += ']';
  } else if (const Dict* d = v.dict()) {
    if (d->items.empty()) {
      out += "{}";
      return;
    }
    std::vector<const std::pair<std::string, Value>*> items;
    for (const auto& item : d->items) items.push_back(&item);
    if (f.sort_keys) {
      std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
    }
    out += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out += f.item_separator;
      newline(level + 1);
      json_string(items[i]->first, f.ensure_ascii, out);
      out += f.key_separator;
      dump_json(items[i]->second, f, level + 1, out);
    }
    newline(level);
    out += '}';
  } else {
    fail("Object of type " + type_name(v) + " is not JSON serializable");
  }
}

// ---------------------------------------------------------------------------
// 3. Lexer

struct Location {
  int line, column;
};

// 1-based line and column (in code points) of a byte offset.
Location locate(std::string_view source, size_t pos) {
  pos = std::min(pos, source.size());
  Location loc{1, 1};
  size_t line_start = 0;
  for (size_t i = 0; i < pos; ++i) {
    if (source[i] == '\n') {
      ++loc.line;
      line_start = i + 1;
    }
  }
  loc.column = static_cast<int>(char_count(source.substr(line_start, pos - line_start))) + 1;
  return loc;
}

template <class E>
E error_at(std::string_view source, size_t pos, const std::string& message) {
  const Location loc = locate(source, pos);
  return E("line " + std::to_string(loc.line) + ", column " + std::to_string(loc.column) + ": " + message,
           message, loc.line, loc.column);
}

enum class Tok : uint8_t {
  text, print_begin, print_end, block_begin, block_end, name, string, integer, floating, op, eof
};

struct Token {
  Tok kind;
  size_t pos;        // byte offset in the normalized source
  std::string text;  // text data, name, decoded string literal or operator
  int64_t int_value = 0;
  double float_value = 0;
};

// Jinja reads "\r\n" and "\r" as "\n" and drops one trailing newline
// (keep_trailing_newline=False).
std::string normalize_newlines(std::string_view src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out += src[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Splits the source into text and tags, applying whitespace control exactly as
// Jinja's lexer does with trim_blocks and lstrip_blocks.
class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {}

  std::vector<Token> run() {
    size_t pos = 0;
    while (pos < src_.size()) {
      const size_t open = find_tag(pos);
      if (open == std::string_view::npos) {
        out_.push_back({Tok::text, pos, std::string(src_.substr(pos))});
        break;
      }
      const char kind = src_[open + 1];
      size_t p = open + 2;
      char sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      const std::string_view text = src_.substr(pos, open - pos);
      if (kind == '%') {
        if (const size_t body = match_raw_begin(p); body != std::string_view::npos) {
          push_text(pos, text, sign, true);
          line_starting_ = body > 0 && src_[body - 1] == '\n';
          pos = lex_raw(body, open);
          continue;
        }
      }
      push_text(pos, text, sign, kind != '{');  // lstrip_blocks spares {{ }}
      pos = kind == '#' ? lex_comment(p, open) : lex_tag(p, open, kind == '%');
    }
    out_.push_back({Tok::eof, src_.size(), {}});
    return std::move(out_);
  }

 private:
  [[noreturn]] void error(size_t pos, const std::string& message) const {
    throw error_at<SyntaxError>(src_, pos, message);
  }
  bool at(size_t pos, std::string_view s) const { return src_.substr(std::min(pos, src_.size())).starts_with(s); }
  size_t skip_space(size_t pos) const {
    while (pos < src_.size()) {
      size_t next = pos;
      if (!is_space(decode(src_, next))) break;
      pos = next;
    }
    return pos;
  }

  size_t find_tag(size_t pos) const {
    for (size_t i = src_.find('{', pos); i != std::string_view::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string_view::npos;
  }

  // Text before a tag: "{%-" strips all whitespace before it; otherwise
  // lstrip_blocks removes the indentation of a block or comment tag that
  // starts its line; "{%+" keeps everything.
  void push_text(size_t pos, std::string_view text, char sign, bool lstrip) {
    if (sign == '-') {
      text = strip(text, nullptr, false, true);
    } else if (sign != '+' && lstrip) {
      const size_t line_start = text.rfind('\n') + 1;  // npos + 1 == 0
      if ((line_start > 0 || line_starting_) && line_start < text.size() &&
          all_space(text.substr(line_start))) {
        text = text.substr(0, line_start);
      }
    }
    if (!text.empty()) out_.push_back({Tok::text, pos, std::string(text)});
  }

  // Whitespace after a closing delimiter ending at `pos`: "-" eats all of it,
  // trim_blocks removes one newline after a block or comment, "+" keeps it.
  size_t finish_tag(size_t pos, char sign, bool trim_newline) {
    size_t end = pos;
    if (sign == '-') {
      end = skip_space(pos);
    } else if (sign != '+' && trim_newline && at(pos, "\n")) {
      end = pos + 1;
    }
    line_starting_ = end > pos && src_[end - 1] == '\n';
    return end;
  }

  size_t lex_comment(size_t p, size_t open) {
    if (p == src_.size()) return p;  // Jinja ignores a "{#" that ends the template
    const size_t close = src_.find("#}", p);
    if (close == std::string_view::npos) error(open, "missing end of comment tag '#}'");
    const char sign = close > p && (src_[close - 1] == '-' || src_[close - 1] == '+') ? src_[close - 1] : 0;
    return finish_tag(close + 2, sign, true);
  }

  // After "{%" and its sign: the end of "raw %}", or npos if this is not a raw tag.
  size_t match_raw_begin(size_t p) const {
    p = skip_space(p);
    if (!at(p, "raw")) return std::string_view::npos;
    p = skip_space(p + 3);
    if (at(p, "-%}")) return skip_space(p + 3);
    if (at(p, "%}")) return p + 2;
    return std::string_view::npos;
  }

  size_t lex_raw(size_t body, size_t open) {
    for (size_t s = src_.find("{%", body); s != std::string_view::npos; s = src_.find("{%", s + 1)) {
      size_t p = s + 2;
      char sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      p = skip_space(p);
      if (!at(p, "endraw")) continue;
      p = skip_space(p + 6);
      char end_sign = 0;
      if (at(p, "-%}") || at(p, "+%}")) end_sign = src_[p++];
      if (!at(p, "%}")) continue;
      push_text(body, src_.substr(body, s - body), sign, true);
      return finish_tag(p + 2, end_sign, true);
    }
    error(open, "missing {% endraw %} for this raw block");
  }

  size_t lex_tag(size_t p, size_t open, bool block) {
    out_.push_back({block ? Tok::block_begin : Tok::print_begin, open, {}});
    std::string closers;  // brackets still open; the closing delimiter only counts outside them
    while (true) {
      p = skip_space(p);
      if (p >= src_.size())
        error(open, block ? "missing '%}' to close this tag" : "missing '}}' to close this tag");
      if (closers.empty()) {
        size_t q = p;
        char sign = 0;
        if (src_[q] == '-' || (block && src_[q] == '+')) sign = src_[q++];
        if (at(q, block ? "%}" : "}}")) {
          out_.push_back({block ? Tok::block_end : Tok::print_end, p, {}});
          return finish_tag(q + 2, sign, block);
        }
      }
      p = lex_token(p, closers);
    }
  }

  static bool is_digit(char c) { return c >= '0' && c <= '9'; }
  static bool is_name_char(char c) {
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }

  // Python identifiers: ASCII or Unicode letters, digits, marks and connectors.
  size_t name_end(size_t p) const {
    while (p < src_.size()) {
      if (is_name_char(src_[p])) {
        ++p;
        continue;
      }
      size_t next = p;
      bool valid = false;
      const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(decode(src_, next, &valid)));
      if (!valid || static_cast<unsigned char>(src_[p]) < 0x80 ||
          !((cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_MC) || cat == UTF8PROC_CATEGORY_ND ||
            cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_PC)) {
        break;
      }
      p = next;
    }
    return p;
  }

  size_t lex_token(size_t p, std::string& closers) {
    const char c = src_[p];
    if (is_digit(c)) return lex_number(p);
    if (const size_t q = name_end(p); q > p) {
      out_.push_back({Tok::name, p, std::string(src_.substr(p, q - p))});
      return q;
    }
    if (c == '\'' || c == '"') return lex_string(p);
    static constexpr std::string_view kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%",
                                                "~",  "[",  "]",  "(",  ")",  "{",  "}", "<", ">", "=", ".",
                                                ":",  "|",  ",",  ";"};
    for (std::string_view op : kOps) {
      if (!at(p, op)) continue;
      if (op == "(" || op == "[" || op == "{") {
        closers += op == "(" ? ')' : op == "[" ? ']' : '}';
      } else if (op == ")" || op == "]" || op == "}") {
        if (closers.empty()) error(p, "unexpected '" + std::string(op) + "'");
        if (closers.back() != op[0]) {
          error(p, "unexpected '" + std::string(op) + "', expected '" + closers.back() + "'");
        }
        closers.pop_back();
      }
      out_.push_back({Tok::op, p, std::string(op)});
      return p + op.size();
    }
    error(p, "unexpected character '" + std::string(1, c) + "'");
  }

  size_t lex_number(size_t p) {
    auto digits = [&](size_t q) {  // digits with single '_' separators
      while (q < src_.size() &&
             (is_digit(src_[q]) || (src_[q] == '_' && q + 1 < src_.size() && is_digit(src_[q + 1]))))
        ++q;
      return q;
    };
    size_t q = digits(p);
    bool is_float = false;
    // After a '.', digits are an item index (x.0.1), never a float.
    const bool after_dot = p > 0 && src_[p - 1] == '.';
    if (!after_dot && q + 1 < src_.size() && src_[q] == '.' && is_digit(src_[q + 1])) {
      q = digits(q + 1);
      is_float = true;
    }
    if (!after_dot && q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
      size_t r = q + 1;
      if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
      if (r < src_.size() && is_digit(src_[r])) {
        q = digits(r);
        is_float = true;
      }
    }
    std::string text;
    for (char ch : src_.substr(p, q - p)) {
      if (ch != '_') text += ch;
    }
    Token tok{is_float ? Tok::floating : Tok::integer, p, text};
    const char* end = text.data() + text.size();
    if (is_float) {
      std::from_chars(text.data(), end, tok.float_value);
    } else if (std::from_chars(text.data(), end, tok.int_value).ec != std::errc()) {
      error(p, "integer literal too large");
    }
    out_.push_back(std::move(tok));
    return q;
  }

  size_t lex_string(size_t p) {
    const char quote = src_[p];
    size_t q = p + 1;
    while (q < src_.size() && src_[q] != quote) q += src_[q] == '\\' ? 2 : 1;
    if (q >= src_.size()) error(p, "unterminated string literal");
    out_.push_back({Tok::string, p, unescape(src_.substr(p + 1, q - p - 1), p)});
    return q + 1;
  }

  // Python's "unicode-escape" decoding, which Jinja applies to string literals.
  std::string unescape(std::string_view body, size_t pos) const {
    std::string out;
    for (size_t i = 0; i < body.size(); ++i) {
      if (body[i] != '\\') {
        out += body[i];
        continue;
      }
      const char e = body[++i];
      auto hex = [&](size_t n) {
        char32_t cp = 0;
        for (size_t k = 0; k < n; ++k) {
          const char h = i + 1 < body.size() ? body[++i] : 'x';
          const int d = is_digit(h)              ? h - '0'
                        : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                        : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                                 : -1;
          if (d < 0) error(pos, std::string("truncated \\") + e + " escape in string literal");
          cp = cp * 16 + static_cast<char32_t>(d);
        }
        return cp;
      };
      char32_t cp = 0;
      switch (e) {
        case '\n': continue;  // line continuation
        case '\\': case '\'': case '"': out += e; continue;
        case 'a': out += '\a'; continue;
        case 'b': out += '\b'; continue;
        case 'f': out += '\f'; continue;
        case 'n': out += '\n'; continue;
        case 'r': out += '\r'; continue;
        case 't': out += '\t'; continue;
        case 'v': out += '\v'; continue;
        case 'x': cp = hex(2); break;
        case 'u': cp = hex(4); break;
        case 'U': cp = hex(8); break;
        case 'N': error(pos, "\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            cp = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k) {
              cp = cp * 8 + static_cast<char32_t>(body[++i] - '0');
            }
            break;
          }
          out += '\\';  // Python keeps unknown escapes as written
          out += e;
          continue;
      }
      if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) error(pos, "invalid code point in string escape");
      encode(out, cp);
    }
    return out;
  }

  std::string_view src_;
  std::vector<Token> out_;
  bool line_starting_ = true;  // the last thing consumed ended a line
};

// ---------------------------------------------------------------------------
// 4. AST and parser

enum class Op : uint8_t {
  add, sub, mul, div, floordiv, mod, pow, concat, eq, ne, lt, le, gt, ge, in, not_in, and_, or_, not_, neg, pos
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

// One expression node; the fields used depend on the kind:
//   literal: value                    name: name
//   list, tuple: args = items         dict: args = key0, value0, key1, value1, ...
//   attr: args[0] = object, name      item: args = object, key
//   slice: args = object, start, stop, step (null when omitted)
//   call: args = callee, positional arguments, then keyword arguments (named by keywords)
//   filter, test: args = operand, then arguments as for call; name; builtin
//                 (null if unknown: an error only if evaluated); negated for "is not"
//   unary: op, args[0]                binary: op, args = left, right
//   compare: args = operands, ops (a < b <= c)
//   cond: args = condition, value, else value (null when omitted)
struct Expr {
  enum class Kind : uint8_t {
    literal, name, list, tuple, dict, attr, item, slice, call, filter, test, unary, binary, compare, cond
  };
  Kind kind = Kind::literal;
  size_t pos = 0;
  Op op = Op::add;
  bool negated = false;
  int height = 1;
  std::string name;
  Value value;
  std::vector<ExprPtr> args;
  std::vector<std::string> keywords;
  std::vector<Op> ops;
  const Builtin* builtin = nullptr;
};

// One statement; the fields used depend on the kind:
//   text: text                        output: expr
//   if_: branches (condition, body), else_body
//   for_: targets, expr = iterable, filter (inline "if"), body, else_body
//   set: targets (several: tuple unpacking) and expr; or targets[0] = namespace, attr
//   set_block: targets[0], body       macro: text = name, params, body
//   break_, continue_
struct Stmt {
  enum class Kind : uint8_t { text, output, if_, for_, set, set_block, macro, break_, continue_ };
  Kind kind = Kind::text;
  size_t pos = 0;
  std::string text, attr;
  std::vector<std::string> targets;
  ExprPtr expr, filter;
  std::vector<std::pair<ExprPtr, std::vector<Stmt>>> branches;
  std::vector<Stmt> body, else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default null when none
};

const Builtin* find_filter(std::string_view name);
const Builtin* find_test(std::string_view name);

class Parser {
 public:
  Parser(std::string_view src, std::vector<Token> tokens) : src_(src), toks_(std::move(tokens)) {}

  std::vector<Stmt> parse_template() {
    std::vector<Stmt> body;
    parse_body(body, {}, "", 0);
    return body;
  }

  // "filter 'x'" / "test 'y'" for each name the template uses that no builtin
  // provides: an error only when evaluated, as in Jinja, but worth a warning.
  const std::vector<std::string>& unknown_names() const { return unknown_; }

 private:
  class NestGuard {
   public:
    NestGuard(Parser& p, size_t pos) : p_(p) {
      if (p_.depth_ >= kMaxNesting) p_.error(pos, "template nested too deeply");
      ++p_.depth_;
    }
    ~NestGuard() { --p_.depth_; }
    NestGuard(const NestGuard&) = delete;
    NestGuard& operator=(const NestGuard&) = delete;

   private:
    Parser& p_;
  };

  [[noreturn]] void error(size_t pos, const std::string& message) const {
    throw error_at<SyntaxError>(src_, pos, message);
  }
  const Token& peek(size_t ahead = 0) const { return toks_[std::min(i_ + ahead, toks_.size() - 1)]; }
  const Token& next() { return toks_[std::min(i_++, toks_.size() - 1)]; }
  bool at_op(std::string_view op, size_t ahead = 0) const {
    return peek(ahead).kind == Tok::op && peek(ahead).text == op;
  }
  bool at_name(std::string_view name, size_t ahead = 0) const {
    return peek(ahead).kind == Tok::name && peek(ahead).text == name;
  }
  bool skip_op(std::string_view op) { return at_op(op) && (next(), true); }
  bool skip_name(std::string_view name) { return at_name(name) && (next(), true); }

  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Tok::eof: return "end of template";
      case Tok::text: return "template text";
      case Tok::print_begin: return "'{{'";
      case Tok::print_end: return "'}}'";
      case Tok::block_begin: return "'{%'";
      case Tok::block_end: return "'%}'";
      case Tok::string: return "a string";
      case Tok::integer: case Tok::floating: return "a number";
      default: return "'" + t.text + "'";
    }
  }
  [[noreturn]] void unexpected(const std::string& expected) const {
    error(peek().pos, "expected " + expected + ", got " + describe(peek()));
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) unexpected("'" + std::string(op) + "'");
  }
  std::string expect_name() {
    if (peek().kind != Tok::name) unexpected("a name");
    return next().text;
  }
  void expect_block_end() {
    if (peek().kind != Tok::block_end) unexpected("'%}'");
    next();
  }

  // Statements up to a block tag named in `ends`; returns that name (consumed)
  // or "" at the end of input, which only the top level may reach.
  std::string parse_body(std::vector<Stmt>& out, std::initializer_list<std::string_view> ends,
                         std::string_view block, size_t block_pos) {
    NestGuard guard(*this, block_pos);
    while (true) {
      const Token& t = peek();
      if (t.kind == Tok::eof) {
        if (ends.size() == 0) return "";
        error(block_pos, "'" + std::string(block) + "' block is never closed (expected '" +
                             std::string(*(ends.end() - 1)) + "')");
      }
      if (t.kind == Tok::text) {
        Stmt& st = out.emplace_back();
        st.pos = t.pos;
        st.text = next().text;
      } else if (t.kind == Tok::print_begin) {
        next();
        Stmt& st = out.emplace_back();
        st.kind = Stmt::Kind::output;
        st.pos = peek().pos;
        st.expr = parse_tuple(true);
        if (peek().kind != Tok::print_end) unexpected("'}}'");
        next();
      } else if (t.kind == Tok::block_begin) {
        next();
        if (peek().kind != Tok::name) unexpected("a statement name");
        const Token& tag = peek();
        if (std::find(ends.begin(), ends.end(), tag.text) != ends.end()) return next().text;
        if (tag.text.starts_with("end") || tag.text == "elif" || tag.text == "else") {
          error(tag.pos, "unexpected '" + tag.text + "'" +
                             (ends.size() > 0 ? ", expected '" + std::string(*(ends.end() - 1)) + "'" : ""));
        }
        parse_statement(out);
      } else {
        unexpected("template text or a tag");
      }
    }
  }

  void parse_statement(std::vector<Stmt>& out) {
    const size_t pos = peek().pos;
    const std::string tag = next().text;
    if (tag == "if") {
      out.push_back(parse_if(pos));
    } else if (tag == "for") {
      out.push_back(parse_for(pos));
    } else if (tag == "set") {
      out.push_back(parse_set(pos));
    } else if (tag == "macro") {
      out.push_back(parse_macro(pos));
    } else if (tag == "generation") {  // transformers' assistant-mask marker: just the body
      expect_block_end();
      parse_body(out, {"endgeneration"}, tag, pos);
      expect_block_end();
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) error(pos, "'" + tag + "' outside of a for loop");
      Stmt& st = out.emplace_back();
      st.kind = tag == "break" ? Stmt::Kind::break_ : Stmt::Kind::continue_;
      st.pos = pos;
      expect_block_end();
    } else if (tag == "extends" || tag == "block" || tag == "include" || tag == "import" || tag == "from" ||
               tag == "call" || tag == "filter" || tag == "with" || tag == "autoescape" || tag == "do" ||
               tag == "trans") {
      error(pos, "'" + tag + "' tags are not supported");
    } else {
      error(pos, "unknown tag '" + tag + "'");
    }
  }

  Stmt parse_if(size_t pos) {
    Stmt st;
    st.kind = Stmt::Kind::if_;
    st.pos = pos;
    std::string end = "elif";
    while (end == "elif") {
      auto& [cond, body] = st.branches.emplace_back();
      cond = parse_tuple(false);
      expect_block_end();
      end = parse_body(body, {"elif", "else", "endif"}, "if", pos);
    }
    if (end == "else") {
      expect_block_end();
      parse_body(st.else_body, {"endif"}, "if", pos);
    }
    expect_block_end();
    return st;
  }

  std::vector<std::string> parse_targets() {
    const bool parens = skip_op("(");
    std::vector<std::string> names{expect_name()};
    while (skip_op(",")) {
      if (peek().kind != Tok::name || at_name("in")) break;
      names.push_back(expect_name());
    }
    if (parens) expect_op(")");
    return names;
  }

  Stmt parse_for(size_t pos) {
    Stmt st;
    st.kind = Stmt::Kind::for_;
    st.pos = pos;
    st.targets = parse_targets();
    if (!skip_name("in")) unexpected("'in'");
    st.expr = parse_tuple(false);
    if (skip_name("if")) st.filter = parse_expression(true);
    if (at_name("recursive")) error(peek().pos, "recursive loops are not supported");
    expect_block_end();
    ++loop_depth_;
    const std::string end = parse_body(st.body, {"else", "endfor"}, "for", pos);
    --loop_depth_;
    if (end == "else") {
      expect_block_end();
      parse_body(st.else_body, {"endfor"}, "for", pos);
    }
    expect_block_end();
    return st;
  }

  Stmt parse_set(size_t pos) {
    Stmt st;
    st.kind = Stmt::Kind::set;
    st.pos = pos;
    st.targets = {expect_name()};
    if (skip_op(".")) {
      st.attr = expect_name();
    } else {
      while (skip_op(",")) {
        if (at_op("=")) break;
        st.targets.push_back(expect_name());
      }
      if (st.targets.size() == 1 && peek().kind == Tok::block_end) {  // {% set x %}...{% endset %}
        next();
        st.kind = Stmt::Kind::set_block;
        const int loops = std::exchange(loop_depth_, 0);
        parse_body(st.body, {"endset"}, "set", pos);
        loop_depth_ = loops;
        expect_block_end();
        return st;
      }
    }
    expect_op("=");
    st.expr = parse_tuple(true);
    expect_block_end();
    return st;
  }

  Stmt parse_macro(size_t pos) {
    Stmt st;
    st.kind = Stmt::Kind::macro;
    st.pos = pos;
    st.text = expect_name();
    expect_op("(");
    while (!skip_op(")")) {
      const size_t param_pos = peek().pos;
      auto& [name, def] = st.params.emplace_back(expect_name(), nullptr);
      if (skip_op("=")) {
        def = parse_expression(true);
      } else if (st.params.size() > 1 && st.params[st.params.size() - 2].second) {
        error(param_pos, "non-default parameter '" + name + "' follows a default parameter");
      }
      if (!at_op(")")) expect_op(",");
    }
    expect_block_end();
    const int loops = std::exchange(loop_depth_, 0);
    parse_body(st.body, {"endmacro"}, "macro", pos);
    loop_depth_ = loops;
    expect_block_end();
    return st;
  }

  // --- expressions, from loosest to tightest binding, as Jinja's parser.

  ExprPtr make(Expr::Kind kind, size_t pos) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }
  // Seals a node whose children are in place; bounds the tree height, which
  // sets the recursion depth of evaluation and destruction (1+1+1+... chains).
  ExprPtr done(ExprPtr e) {
    for (const ExprPtr& a : e->args) {
      if (a) e->height = std::max(e->height, a->height + 1);
    }
    if (e->height > kMaxExprHeight) error(e->pos, "expression too deeply nested");
    return e;
  }
  ExprPtr make_binary(Op op, ExprPtr left, ExprPtr right, size_t pos) {
    ExprPtr e = make(Expr::Kind::binary, pos);
    e->op = op;
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    return done(std::move(e));
  }

  bool at_tuple_end() const {
    const Tok k = peek().kind;
    return k == Tok::print_end || k == Tok::block_end || k == Tok::eof || at_op(")") || at_name("in");
  }

  // a, b, c (a tuple) or a single expression.
  ExprPtr parse_tuple(bool condexpr) {
    const size_t pos = peek().pos;
    ExprPtr first = parse_expression(condexpr);
    if (!at_op(",")) return first;
    ExprPtr t = make(Expr::Kind::tuple, pos);
    t->args.push_back(std::move(first));
    while (skip_op(",") && !at_tuple_end()) t->args.push_back(parse_expression(condexpr));
    return done(std::move(t));
  }

  ExprPtr parse_expression(bool condexpr) { return condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    NestGuard guard(*this, peek().pos);
    ExprPtr e = parse_or();
    while (at_name("if")) {
      ExprPtr c = make(Expr::Kind::cond, next().pos);
      c->args.push_back(parse_or());
      c->args.push_back(std::move(e));
      c->args.push_back(skip_name("else") ? parse_condexpr() : nullptr);
      e = done(std::move(c));
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (at_name("or")) {
      const size_t pos = next().pos;
      e = make_binary(Op::or_, std::move(e), parse_and(), pos);
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (at_name("and")) {
      const size_t pos = next().pos;
      e = make_binary(Op::and_, std::move(e), parse_not(), pos);
    }
    return e;
  }

  ExprPtr parse_not() {
    if (!at_name("not")) return parse_compare();
    NestGuard guard(*this, peek().pos);
    ExprPtr e = make(Expr::Kind::unary, next().pos);
    e->op = Op::not_;
    e->args.push_back(parse_not());
    return done(std::move(e));
  }

  ExprPtr parse_compare() {
    const size_t pos = peek().pos;
    ExprPtr first = parse_math1();
    ExprPtr cmp = make(Expr::Kind::compare, pos);
    cmp->args.push_back(std::move(first));
    while (true) {
      static constexpr std::pair<std::string_view, Op> kOps[] = {
          {"==", Op::eq}, {"!=", Op::ne}, {"<", Op::lt}, {"<=", Op::le}, {">", Op::gt}, {">=", Op::ge}};
      const auto it =
          std::find_if(std::begin(kOps), std::end(kOps), [&](const auto& o) { return at_op(o.first); });
      if (it != std::end(kOps)) {
        next();
        cmp->ops.push_back(it->second);
      } else if (skip_name("in")) {
        cmp->ops.push_back(Op::in);
      } else if (at_name("not") && at_name("in", 1)) {
        next();
        next();
        cmp->ops.push_back(Op::not_in);
      } else {
        break;
      }
      cmp->args.push_back(parse_math1());
    }
    if (cmp->ops.empty()) return std::move(cmp->args.front());
    return done(std::move(cmp));
  }

  template <class Next>
  ExprPtr parse_binary_level(std::initializer_list<std::pair<std::string_view, Op>> ops, Next next_level) {
    ExprPtr e = (this->*next_level)();
    while (true) {
      const auto it = std::find_if(ops.begin(), ops.end(), [&](const auto& o) { return at_op(o.first); });
      if (it == ops.end()) return e;
      const size_t pos = next().pos;
      e = make_binary(it->second, std::move(e), (this->*next_level)(), pos);
    }
  }
  ExprPtr parse_math1() { return parse_binary_level({{"+", Op::add}, {"-", Op::sub}}, &Parser::parse_concat); }
  ExprPtr parse_concat() { return parse_binary_level({{"~", Op::concat}}, &Parser::parse_math2); }
  ExprPtr parse_math2() {
    return parse_binary_level({{"*", Op::mul}, {"/", Op::div}, {"//", Op::floordiv}, {"%", Op::mod}},
                              &Parser::parse_pow);
  }
  ExprPtr parse_pow() { return parse_binary_level({{"**", Op::pow}}, &Parser::parse_filtered_unary); }
  ExprPtr parse_filtered_unary() { return parse_unary(true); }

  // "-x|f" filters the negation, as in Jinja.
  ExprPtr parse_unary(bool with_filter) {
    NestGuard guard(*this, peek().pos);
    ExprPtr e;
    if (at_op("-") || at_op("+")) {
      e = make(Expr::Kind::unary, peek().pos);
      e->op = next().text == "-" ? Op::neg : Op::pos;
      e->args.push_back(parse_unary(false));
      e = done(std::move(e));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    return with_filter ? parse_filter_expr(std::move(e)) : std::move(e);
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    ExprPtr e = make(Expr::Kind::literal, t.pos);
    switch (t.kind) {
      case Tok::name:
        if (t.text == "true" || t.text == "True") {
          e->value = true;
        } else if (t.text == "false" || t.text == "False") {
          e->value = false;
        } else if (t.text == "none" || t.text == "None") {
          e->value = nullptr;
        } else {
          e->kind = Expr::Kind::name;
          e->name = t.text;
        }
        next();
        return e;
      case Tok::string: {
        std::string s;
        while (peek().kind == Tok::string) s += next().text;  // "a" "b" concatenates
        e->value = std::move(s);
        return e;
      }
      case Tok::integer:
        e->value = t.int_value;
        next();
        return e;
      case Tok::floating:
        e->value = t.float_value;
        next();
        return e;
      default: break;
    }
    if (skip_op("(")) {
      if (skip_op(")")) {
        e->kind = Expr::Kind::tuple;
        return e;
      }
      ExprPtr inner = parse_tuple(true);
      expect_op(")");
      return inner;
    }
    if (skip_op("[")) {
      e->kind = Expr::Kind::list;
      while (!skip_op("]")) {
        e->args.push_back(parse_expression(true));
        if (!at_op("]")) expect_op(",");
      }
      return done(std::move(e));
    }
    if (skip_op("{")) {
      e->kind = Expr::Kind::dict;
      while (!skip_op("}")) {
        e->args.push_back(parse_expression(true));
        expect_op(":");
        e->args.push_back(parse_expression(true));
        if (!at_op("}")) expect_op(",");
      }
      return done(std::move(e));
    }
    unexpected("an expression");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (at_op(".")) {
        const size_t pos = next().pos;
        const Token& t = next();
        ExprPtr a = make(t.kind == Tok::integer ? Expr::Kind::item : Expr::Kind::attr, pos);
        a->args.push_back(std::move(e));
        if (t.kind == Tok::name) {
          a->name = t.text;
        } else if (t.kind == Tok::integer) {  // x.0 is x[0]
          ExprPtr index = make(Expr::Kind::literal, t.pos);
          index->value = t.int_value;
          a->args.push_back(std::move(index));
        } else {
          error(t.pos, "expected an attribute name after '.', got " + describe(t));
        }
        e = done(std::move(a));
      } else if (at_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (at_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr object) {
    const size_t pos = next().pos;
    ExprPtr start, stop, step;
    if (!at_op(":")) start = parse_expression(true);
    ExprPtr e = make(Expr::Kind::item, pos);
    if (skip_op(":")) {
      e->kind = Expr::Kind::slice;
      if (!at_op("]") && !at_op(":")) stop = parse_expression(true);
      if (skip_op(":") && !at_op("]")) step = parse_expression(true);
    }
    expect_op("]");
    e->args.push_back(std::move(object));
    e->args.push_back(std::move(start));
    if (e->kind == Expr::Kind::slice) {
      e->args.push_back(std::move(stop));
      e->args.push_back(std::move(step));
    }
    return done(std::move(e));
  }

  // (positional..., name=keyword...) appended to e->args.
  void parse_call_args(Expr& e) {
    expect_op("(");
    while (!skip_op(")")) {
      if (at_op("*") || at_op("**")) error(peek().pos, "*args and **kwargs in calls are not supported");
      if (peek().kind == Tok::name && at_op("=", 1)) {
        e.keywords.push_back(next().text);
        next();
      } else if (!e.keywords.empty()) {
        error(peek().pos, "positional argument follows keyword argument");
      }
      e.args.push_back(parse_expression(true));
      if (!at_op(")")) expect_op(",");
    }
  }

  ExprPtr parse_call(ExprPtr callee) {
    ExprPtr e = make(Expr::Kind::call, peek().pos);
    e->args.push_back(std::move(callee));
    parse_call_args(*e);
    return done(std::move(e));
  }

  std::string parse_dotted_name() {
    std::string name = expect_name();
    while (skip_op(".")) name += "." + expect_name();
    return name;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (skip_op("|")) {
        ExprPtr f = make(Expr::Kind::filter, peek().pos);
        f->name = parse_dotted_name();
        f->builtin = find_filter(f->name);
        if (f->builtin == nullptr) note_unknown("filter '" + f->name + "'");
        f->args.push_back(std::move(e));
        if (at_op("(")) parse_call_args(*f);
        e = done(std::move(f));
      } else if (at_name("is")) {
        e = parse_test(std::move(e));
      } else if (at_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  // "x is name", "x is not name(args)", or "x is name arg" with one bare argument.
  ExprPtr parse_test(ExprPtr operand) {
    ExprPtr t = make(Expr::Kind::test, next().pos);
    t->negated = skip_name("not");
    t->name = parse_dotted_name();
    t->builtin = find_test(t->name);
    if (t->builtin == nullptr) note_unknown("test '" + t->name + "'");
    t->args.push_back(std::move(operand));
    const Tok k = peek().kind;
    if (at_op("(")) {
      parse_call_args(*t);
    } else if ((k == Tok::name || k == Tok::string || k == Tok::integer || k == Tok::floating || at_op("[") ||
                at_op("{")) &&
               !at_name("else") && !at_name("or") && !at_name("and")) {
      if (at_name("is")) error(peek().pos, "tests cannot be chained with 'is'");
      t->args.push_back(parse_postfix(parse_primary()));
    }
    return done(std::move(t));
  }

  void note_unknown(std::string name) {
    if (std::find(unknown_.begin(), unknown_.end(), name) == unknown_.end()) unknown_.push_back(std::move(name));
  }

  std::string_view src_;
  std::vector<Token> toks_;
  std::vector<std::string> unknown_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

// ---------------------------------------------------------------------------
// 5. Renderer

// Builtins see `self` (the filtered value, the method's object, or undefined
// for globals) and their arguments bound to `params` like a Python signature;
// a parameter "*name" collects extra positional arguments into a list and
// "**name" extra keyword arguments into a dict.
class Renderer;
using BuiltinFn = Value (*)(Renderer&, const Value& self, std::vector<Value>& args);
struct Builtin {
  std::string_view name;
  std::vector<std::string_view> params;
  BuiltinFn fn;
};

const Builtin* find_method(const Value& self, std::string_view name);
const std::vector<Builtin>& global_functions();

struct Scope {
  const Scope* parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* find(std::string_view name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent) {
      for (const auto& [k, v] : s->vars) {
        if (k == name) return &v;
      }
    }
    return nullptr;
  }
  bool has_local(std::string_view name) const {
    return std::any_of(vars.begin(), vars.end(), [&](const auto& kv) { return kv.first == name; });
  }
  void set(std::string name, Value value) {
    for (auto& [k, v] : vars) {
      if (k == name) {
        v = std::move(value);
        return;
      }
    }
    vars.emplace_back(std::move(name), std::move(value));
  }
};

enum class Flow : uint8_t { normal, break_, continue_ };

class Renderer {
 public:
  Renderer(std::string_view source, const RenderOptions& options) : source_(source), opts_(options) {}

  std::string run(const std::vector<Stmt>& body, Scope& scope) {
    root_ = &scope;
    std::string out;
    exec(body, scope, out);
    return out;
  }

  const RenderOptions& options() const { return opts_; }

  // Constructors of containers and strings that enforce the resource limits.
  Value make_list(std::vector<Value> items, bool tuple = false) const {
    if (items.size() > opts_.max_items) fail("list exceeds " + std::to_string(opts_.max_items) + " items");
    auto l = std::make_shared<List>();
    for (const Value& v : items) l->depth = std::max(l->depth, value_depth(v) + 1);
    check_depth(l->depth);
    l->items = std::move(items);
    l->is_tuple = tuple;
    return std::shared_ptr<const List>(std::move(l));
  }
  Value make_dict(Dict d) const {
    for (const auto& [k, v] : d.items) d.depth = std::max(d.depth, value_depth(v) + 1);
    check_depth(d.depth);
    return std::make_shared<const Dict>(std::move(d));
  }
  void check_size(size_t bytes) const {
    if (bytes > opts_.max_output_bytes) fail_size(opts_.max_output_bytes);
  }
  std::string str(const Value& v) const { return to_str(v, opts_.max_output_bytes); }
  Namespace* make_namespace() { return &namespaces_.emplace_back(); }

  template <class Json>
  Value from_json(const Json& j, int depth = 0) const {
    check_depth(depth + 1);
    switch (j.type()) {
      case nlohmann::json::value_t::null: return nullptr;
      case nlohmann::json::value_t::boolean: return j.template get<bool>();
      case nlohmann::json::value_t::number_integer: return j.template get<int64_t>();
      case nlohmann::json::value_t::number_unsigned: {
        const auto u = j.template get<uint64_t>();
        return u <= static_cast<uint64_t>(INT64_MAX) ? Value(static_cast<int64_t>(u))
                                                     : Value(static_cast<double>(u));
      }
      case nlohmann::json::value_t::number_float: return j.template get<double>();
      case nlohmann::json::value_t::string: return j.template get<std::string>();
      case nlohmann::json::value_t::array: {
        std::vector<Value> items;
        items.reserve(j.size());
        for (const auto& e : j) items.push_back(from_json(e, depth + 1));
        return make_list(std::move(items));
      }
      case nlohmann::json::value_t::object: {
        Dict d;
        d.items.reserve(j.size());
        for (const auto& [k, v] : j.items()) d.items.emplace_back(k, from_json(v, depth + 1));
        return make_dict(std::move(d));
      }
      default: fail("unsupported JSON value (binary or discarded)");
    }
  }

  // Python iteration: list items, dict keys, string characters; undefined is empty.
  std::vector<Value> iterate(const Value& v) const {
    if (const List* l = v.list()) return l->items;
    std::vector<Value> out;
    if (const Dict* d = v.dict()) {
      for (const auto& kv : d->items) out.emplace_back(kv.first);
    } else if (const std::string* s = v.str()) {
      const auto offsets = char_offsets(*s);
      for (size_t i = 0; i + 1 < offsets.size(); ++i)
        out.emplace_back(s->substr(offsets[i], offsets[i + 1] - offsets[i]));
    } else if (!v.is<Undefined>()) {
      fail("'" + type_name(v) + "' object is not iterable");
    }
    return out;
  }

  Value get_attr(const Value& obj, const std::string& name) {
    if (const Undefined* u = obj.undefined()) fail_undefined(*u);
    if (const Builtin* m = find_method(obj, name)) {  // Jinja tries attributes before items
      check_depth(value_depth(obj) + 1);
      auto f = std::make_shared<Function>();
      f->name = name;
      f->builtin = m;
      f->self = obj;
      return std::shared_ptr<const Function>(std::move(f));
    }
    const Value* found = nullptr;
    if (const Dict* d = obj.dict()) found = d->find(name);
    if (Namespace* ns = obj.ns()) found = ns->attrs.find(name);
    if (found != nullptr) return *found;
    return Undefined{"'" + type_name(obj) + " object' has no attribute '" + name + "'"};
  }

  Value get_item(const Value& obj, const Value& key) {
    if (const Undefined* u = obj.undefined()) fail_undefined(*u);
    if (const std::string* k = key.str()) {
      if (const Dict* d = obj.dict()) {
        if (const Value* v = d->find(*k)) return *v;
      }
      return get_attr(obj, *k);
    }
    if (is_integral(key) && (obj.list() != nullptr || obj.str() != nullptr)) {
      int64_t i = as_int(key);
      if (const List* l = obj.list()) {
        const auto n = static_cast<int64_t>(l->items.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return l->items[static_cast<size_t>(i)];
      } else {
        const auto offsets = char_offsets(*obj.str());
        const auto n = static_cast<int64_t>(offsets.size()) - 1;
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
          const auto at = static_cast<size_t>(i);
          return obj.str()->substr(offsets[at], offsets[at + 1] - offsets[at]);
        }
      }
      return Undefined{type_name(obj) + " object has no element " + std::to_string(as_int(key))};
    }
    return Undefined{"'" + type_name(obj) + " object' has no element of type '" + type_name(key) + "'"};
  }

  Value call(const Value& callee, Args args) {
    if (const Undefined* u = callee.undefined()) fail_undefined(*u);
    const Function* f = callee.function();
    if (f == nullptr) fail("'" + type_name(callee) + "' object is not callable");
    tick();
    if (f->macro != nullptr) return call_macro(*f->macro, callee, std::move(args));
    return invoke(*f->builtin, f->self, std::move(args));
  }

  Value invoke(const Builtin& b, const Value& self, Args args) {
    std::vector<Value> bound = bind(b, std::move(args));
    return b.fn(*this, self, bound);
  }

  bool apply_test(const Value& name, const Value& v, Args args) {
    const std::string* s = name.str();
    const Builtin* test = s != nullptr ? find_test(*s) : nullptr;
    if (test == nullptr) fail(s != nullptr ? "unknown test '" + *s + "'" : "a test name must be a string");
    return truthy(invoke(*test, v, std::move(args)));
  }

 private:
  class DepthGuard {
   public:
    explicit DepthGuard(Renderer& r) : r_(r) {
      if (r_.depth_ >= r_.opts_.max_depth) {
        fail("recursion deeper than " + std::to_string(r_.opts_.max_depth) + " levels");
      }
      ++r_.depth_;
    }
    ~DepthGuard() { --r_.depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;

   private:
    Renderer& r_;
  };

  static int value_depth(const Value& v) {
    if (const List* l = v.list()) return l->depth;
    if (const Dict* d = v.dict()) return d->depth;
    if (const Function* f = v.function()) return value_depth(f->self) + 1;  // a bound method holds its object
    return 0;
  }
  void check_depth(int depth) const {
    if (depth > opts_.max_depth) fail("value nested deeper than " + std::to_string(opts_.max_depth) + " levels");
  }
  void tick() {
    if (++steps_ > opts_.max_steps) {
      fail("template exceeded " + std::to_string(opts_.max_steps) + " steps (statements, iterations, calls)");
    }
  }
  void append(std::string& out, std::string_view s) const {
    check_size(out.size() + s.size());
    out += s;
  }

  // Adds the location of the innermost construct to a failure.
  [[noreturn]] void rethrow_at(const Failure& f, size_t pos) const {
    if (f.raised) {
      const Location loc = locate(source_, pos);
      throw RaisedError(f.message, f.message, loc.line, loc.column);
    }
    throw error_at<RenderError>(source_, pos, f.message);
  }

  std::vector<Value> bind(const Builtin& b, Args args) {
    std::vector<Value> bound(b.params.size());
    size_t n_named = 0;
    std::optional<size_t> rest, rest_keywords;
    for (size_t i = 0; i < b.params.size(); ++i) {
      if (b.params[i].starts_with("**")) {
        rest_keywords = i;
      } else if (b.params[i].starts_with("*")) {
        rest = i;
      } else {
        ++n_named;
      }
    }
    std::vector<Value> extra;
    for (size_t i = 0; i < args.positional.size(); ++i) {
      if (i < n_named) {
        bound[i] = std::move(args.positional[i]);
      } else if (rest) {
        extra.push_back(std::move(args.positional[i]));
      } else {
        fail(std::string(b.name) + "() takes at most " + std::to_string(n_named) + " argument(s), " +
             std::to_string(args.positional.size()) + " given");
      }
    }
    Dict extra_keywords;
    for (auto& [k, v] : args.keywords) {
      const auto it = std::find(b.params.begin(), b.params.begin() + static_cast<ptrdiff_t>(n_named), k);
      const auto i = static_cast<size_t>(it - b.params.begin());
      if (i < n_named) {
        if (i < args.positional.size())
          fail(std::string(b.name) + "() got multiple values for argument '" + k + "'");
        bound[i] = std::move(v);
      } else if (rest_keywords) {
        extra_keywords.set(k, std::move(v));
      } else {
        fail(std::string(b.name) + "() got an unexpected keyword argument '" + k + "'");
      }
    }
    if (rest) bound[*rest] = make_list(std::move(extra));
    if (rest_keywords) bound[*rest_keywords] = make_dict(std::move(extra_keywords));
    return bound;
  }

  Flow exec(const std::vector<Stmt>& body, Scope& scope, std::string& out) {
    for (const Stmt& st : body) {
      if (const Flow flow = exec_stmt(st, scope, out); flow != Flow::normal) return flow;
    }
    return Flow::normal;
  }

  Flow exec_stmt(const Stmt& st, Scope& scope, std::string& out) {
    try {
      DepthGuard guard(*this);
      tick();
      switch (st.kind) {
        case Stmt::Kind::text: append(out, st.text); break;
        case Stmt::Kind::output: append(out, str(eval(*st.expr, scope))); break;
        case Stmt::Kind::if_:
          for (const auto& [cond, body] : st.branches) {
            if (truthy(eval(*cond, scope))) return exec(body, scope, out);
          }
          return exec(st.else_body, scope, out);
        case Stmt::Kind::for_: return exec_for(st, scope, out);
        case Stmt::Kind::set: {
          Value v = eval(*st.expr, scope);
          if (st.attr.empty()) {
            assign(st.targets, std::move(v), scope);
            break;
          }
          const Value* target = scope.find(st.targets[0]);
          if (target == nullptr || target->ns() == nullptr) {
            fail("cannot set attribute '" + st.attr + "' of '" + st.targets[0] + "': it is not a namespace()");
          }
          target->ns()->attrs.set(st.attr, std::move(v));
          break;
        }
        case Stmt::Kind::set_block: {
          Scope inner{&scope, {}};
          std::string captured;
          exec(st.body, inner, captured);
          scope.set(st.targets[0], std::move(captured));
          break;
        }
        case Stmt::Kind::macro: {
          auto f = std::make_shared<Function>();
          f->name = st.text;
          f->macro = &st;
          scope.set(st.text, std::shared_ptr<const Function>(std::move(f)));
          break;
        }
        case Stmt::Kind::break_: return Flow::break_;
        case Stmt::Kind::continue_: return Flow::continue_;
      }
      return Flow::normal;
    } catch (const Failure& f) {
      rethrow_at(f, st.pos);
    }
  }

  // Binds loop or set targets, unpacking when there are several.
  void assign(const std::vector<std::string>& targets, Value v, Scope& scope) {
    if (targets.size() == 1) {
      scope.set(targets[0], std::move(v));
      return;
    }
    const List* l = v.list();
    if (l == nullptr || l->items.size() != targets.size()) {
      fail("cannot unpack " +
           (l != nullptr ? std::to_string(l->items.size()) + " values" : "'" + type_name(v) + "'") + " into " +
           std::to_string(targets.size()) + " names");
    }
    for (size_t i = 0; i < targets.size(); ++i) scope.set(targets[i], l->items[i]);
  }

  Flow exec_for(const Stmt& st, Scope& scope, std::string& out) {
    std::vector<Value> items = iterate(eval(*st.expr, scope));
    if (st.filter) {
      std::vector<Value> kept;
      for (Value& item : items) {
        tick();
        Scope s{&scope, {}};
        assign(st.targets, item, s);
        if (truthy(eval(*st.filter, s))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(st.else_body, scope, out);
    const size_t n = items.size();
    for (size_t i = 0; i < n; ++i) {
      tick();
      // A fresh scope per iteration: Jinja's {% set %} inside a loop neither
      // leaks out of it nor carries over to the next iteration.
      Scope s{&scope, {}};
      Dict loop;
      loop.items = {{"index", Value(i + 1)},      {"index0", Value(i)},         {"revindex", Value(n - i)},
                    {"revindex0", Value(n - i - 1)}, {"first", Value(i == 0)},     {"last", Value(i + 1 == n)},
                    {"length", Value(n)},          {"depth", Value(1)},          {"depth0", Value(0)}};
      if (i > 0) loop.items.emplace_back("previtem", items[i - 1]);
      if (i + 1 < n) loop.items.emplace_back("nextitem", items[i + 1]);
      s.set("loop", make_dict(std::move(loop)));
      assign(st.targets, items[i], s);
      if (exec(st.body, s, out) == Flow::break_) break;
    }
    return Flow::normal;
  }

  Value call_macro(const Stmt& macro, const Value& self, Args args) {
    // Macros see the template's top-level variables and themselves, not their caller's locals.
    Scope s{root_, {}};
    const auto& params = macro.params;
    std::vector<Value> extra;
    for (size_t i = 0; i < args.positional.size(); ++i) {
      if (i < params.size()) {
        s.set(params[i].first, std::move(args.positional[i]));
      } else {
        extra.push_back(std::move(args.positional[i]));
      }
    }
    Dict extra_keywords;
    for (auto& [k, v] : args.keywords) {
      const bool is_param = std::any_of(params.begin(), params.end(), [&](const auto& p) { return p.first == k; });
      if (is_param && s.has_local(k))
        fail("macro '" + macro.text + "' got multiple values for argument '" + k + "'");
      if (is_param) {
        s.set(k, std::move(v));
      } else {
        extra_keywords.set(k, std::move(v));
      }
    }
    for (const auto& [name, def] : params) {
      if (s.has_local(name)) continue;
      s.set(name,
            def ? eval(*def, s) : Value(Undefined{"'" + name + "' is undefined (macro argument not given)"}));
    }
    if (!s.has_local(macro.text)) s.set(macro.text, self);
    s.set("varargs", make_list(std::move(extra), true));
    s.set("kwargs", make_dict(std::move(extra_keywords)));
    std::string out;
    exec(macro.body, s, out);
    return out;
  }

  Args eval_args(const Expr& e, Scope& scope) {
    Args args;
    const size_t n_positional = e.args.size() - 1 - e.keywords.size();
    for (size_t i = 1; i < e.args.size(); ++i) {
      Value v = eval(*e.args[i], scope);
      if (i <= n_positional) {
        args.positional.push_back(std::move(v));
      } else {
        args.keywords.emplace_back(e.keywords[i - 1 - n_positional], std::move(v));
      }
    }
    return args;
  }

  Value eval(const Expr& e, Scope& scope) {
    try {
      DepthGuard guard(*this);
      return eval_node(e, scope);
    } catch (const Failure& f) {
      rethrow_at(f, e.pos);
    }
  }

  Value eval_node(const Expr& e, Scope& scope) {
    using K = Expr::Kind;
    switch (e.kind) {
      case K::literal: return e.value;
      case K::name:
        if (const Value* v = scope.find(e.name)) return *v;
        return Undefined{"'" + e.name + "' is undefined"};
      case K::list:
      case K::tuple: {
        std::vector<Value> items;
        for (const ExprPtr& a : e.args) items.push_back(eval(*a, scope));
        return make_list(std::move(items), e.kind == K::tuple);
      }
      case K::dict: {
        Dict d;
        for (size_t i = 0; i < e.args.size(); i += 2) {
          Value key = eval(*e.args[i], scope);
          if (key.str() == nullptr) fail("dict keys must be strings, not '" + type_name(key) + "'");
          d.set(*key.str(), eval(*e.args[i + 1], scope));
        }
        return make_dict(std::move(d));
      }
      case K::attr: return get_attr(eval(*e.args[0], scope), e.name);
      case K::item: return get_item(eval(*e.args[0], scope), eval(*e.args[1], scope));
      case K::slice: return slice(e, scope);
      case K::call: {
        Value callee = eval(*e.args[0], scope);
        return call(callee, eval_args(e, scope));
      }
      case K::filter: {
        if (e.builtin == nullptr) fail("unknown filter '" + e.name + "'");
        Value operand = eval(*e.args[0], scope);
        return invoke(*e.builtin, operand, eval_args(e, scope));
      }
      case K::test: {
        if (e.builtin == nullptr) fail("unknown test '" + e.name + "'");
        Value operand = eval(*e.args[0], scope);
        return truthy(invoke(*e.builtin, operand, eval_args(e, scope))) != e.negated;
      }
      case K::unary: {
        Value v = eval(*e.args[0], scope);
        if (e.op == Op::not_) return !truthy(v);
        if (const Undefined* u = v.undefined()) fail_undefined(*u);
        if (!is_number(v))
          fail("bad operand type for unary " + std::string(e.op == Op::neg ? "-" : "+") + ": '" + type_name(v) +
               "'");
        if (e.op == Op::pos) return v.is<bool>() ? Value(as_int(v)) : v;
        if (v.is<double>()) return -std::get<double>(v.v);
        if (as_int(v) == INT64_MIN) fail("integer overflow");
        return -as_int(v);
      }
      case K::binary: {
        Value left = eval(*e.args[0], scope);
        if (e.op == Op::and_) return truthy(left) ? eval(*e.args[1], scope) : left;
        if (e.op == Op::or_) return truthy(left) ? left : eval(*e.args[1], scope);
        return arithmetic(e.op, left, eval(*e.args[1], scope));
      }
      case K::compare: {
        Value left = eval(*e.args[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1], scope);
          if (!compare(e.ops[i], left, right)) return false;
          left = std::move(right);
        }
        return true;
      }
      case K::cond:
        if (truthy(eval(*e.args[0], scope))) return eval(*e.args[1], scope);
        return e.args[2] ? eval(*e.args[2], scope)
                         : Value(Undefined{"the condition was false and there is no else"});
    }
    fail("unhandled expression");
  }

  // Python slicing of lists, tuples and strings (by code point).
  Value slice(const Expr& e, Scope& scope) {
    Value obj = eval(*e.args[0], scope);
    int64_t bounds[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int k = 0; k < 3; ++k) {
      if (!e.args[k + 1]) continue;
      Value v = eval(*e.args[k + 1], scope);
      if (v.is<std::nullptr_t>() || v.is<Undefined>()) continue;
      if (!is_integral(v)) fail("slice indices must be integers or None, not '" + type_name(v) + "'");
      bounds[k] = as_int(v);
      given[k] = true;
    }
    const int64_t step = bounds[2];
    if (step == 0) fail("slice step cannot be zero");
    const std::string* s = obj.str();
    const List* l = obj.list();
    if (s == nullptr && l == nullptr) {
      if (const Undefined* u = obj.undefined()) fail_undefined(*u);
      fail("'" + type_name(obj) + "' object is not subscriptable");
    }
    const std::vector<size_t> offsets = s != nullptr ? char_offsets(*s) : std::vector<size_t>{};
    const int64_t n =
        s != nullptr ? static_cast<int64_t>(offsets.size()) - 1 : static_cast<int64_t>(l->items.size());
    auto adjust = [&](int64_t i, bool present, int64_t if_absent) {
      if (!present) return if_absent;
      if (i < 0) i += n;
      const int64_t lo = step > 0 ? 0 : -1, hi = step > 0 ? n : n - 1;
      return std::clamp(i, lo, hi);
    };
    const int64_t start = adjust(bounds[0], given[0], step > 0 ? 0 : n - 1);
    const int64_t stop = adjust(bounds[1], given[1], step > 0 ? n : -1);
    std::string out_str;
    std::vector<Value> out_items;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      const auto at = static_cast<size_t>(i);
      if (s != nullptr) {
        out_str.append(*s, offsets[at], offsets[at + 1] - offsets[at]);
      } else {
        out_items.push_back(l->items[at]);
      }
    }
    if (s != nullptr) return out_str;
    return make_list(std::move(out_items), l->is_tuple);
  }

 public:
  bool contains(const Value& container, const Value& needle) const {
    if (const std::string* s = container.str()) {
      if (needle.str() == nullptr) fail("'in <string>' requires string as left operand, not " + type_name(needle));
      return s->find(*needle.str()) != std::string::npos;
    }
    if (const List* l = container.list()) {
      return std::any_of(l->items.begin(), l->items.end(), [&](const Value& v) { return equal(v, needle); });
    }
    if (const Dict* d = container.dict()) return needle.str() != nullptr && d->find(*needle.str()) != nullptr;
    if (container.is<Undefined>()) return false;
    fail("argument of type '" + type_name(container) + "' is not iterable");
  }

  bool compare(Op op, const Value& a, const Value& b) const {
    switch (op) {
      case Op::eq: return equal(a, b);
      case Op::ne: return !equal(a, b);
      case Op::lt: return less(a, b);
      case Op::gt: return less(b, a);
      case Op::le: return less(a, b) || equal(a, b);
      case Op::ge: return less(b, a) || equal(a, b);
      case Op::in: return contains(b, a);
      case Op::not_in: return !contains(b, a);
      default: fail("not a comparison");
    }
  }

  Value arithmetic(Op op, const Value& a, const Value& b) const {
    if (op == Op::concat) {
      std::string s = str(a);
      std::string t = str(b);
      check_size(s.size() + t.size());
      return s + t;
    }
    if (const Undefined* u = a.undefined()) fail_undefined(*u);
    if (const Undefined* u = b.undefined()) fail_undefined(*u);
    if (is_number(a) && is_number(b)) return number_arithmetic(op, a, b);
    const std::string* sa = a.str();
    const std::string* sb = b.str();
    const List* la = a.list();
    const List* lb = b.list();
    if (op == Op::add && sa != nullptr && sb != nullptr) {
      check_size(sa->size() + sb->size());
      return *sa + *sb;
    }
    if (op == Op::add && la != nullptr && lb != nullptr && la->is_tuple == lb->is_tuple) {
      std::vector<Value> items = la->items;
      items.insert(items.end(), lb->items.begin(), lb->items.end());
      return make_list(std::move(items), la->is_tuple);
    }
    if (op == Op::mul && (is_integral(a) || is_integral(b))) {  // sequence repetition
      const Value& seq = is_integral(a) ? b : a;
      const int64_t times = std::max<int64_t>(0, as_int(is_integral(a) ? a : b));
      if (const std::string* s = seq.str()) {
        if (!s->empty())
          check_size(static_cast<size_t>(std::min<int64_t>(times, INT64_MAX / static_cast<int64_t>(s->size()))) *
                     s->size());
        std::string out;
        for (int64_t i = 0; i < times && !s->empty(); ++i) out += *s;
        return out;
      }
      if (const List* l = seq.list()) {
        if (!l->items.empty() && static_cast<uint64_t>(times) > opts_.max_items / l->items.size()) {
          fail("list exceeds " + std::to_string(opts_.max_items) + " items");
        }
        std::vector<Value> items;
        for (int64_t i = 0; i < times; ++i) items.insert(items.end(), l->items.begin(), l->items.end());
        return make_list(std::move(items), l->is_tuple);
      }
    }
    if (op == Op::mod && sa != nullptr) fail("'%' string formatting is not supported");
    static constexpr const char* kSymbols[] = {"+", "-", "*", "/", "//", "%", "**"};
    fail(std::string("unsupported operand type(s) for ") + kSymbols[static_cast<int>(op)] + ": '" + type_name(a) +
         "' and '" + type_name(b) + "'");
  }

  static Value number_arithmetic(Op op, const Value& a, const Value& b) {
    if (is_integral(a) && is_integral(b)) {
      const int64_t x = as_int(a), y = as_int(b);
      int64_t r = 0;
      bool overflow = false;
      switch (op) {
        case Op::add: overflow = __builtin_add_overflow(x, y, &r); break;
        case Op::sub: overflow = __builtin_sub_overflow(x, y, &r); break;
        case Op::mul: overflow = __builtin_mul_overflow(x, y, &r); break;
        case Op::div:
          if (y == 0) fail("division by zero");
          return static_cast<double>(x) / static_cast<double>(y);
        case Op::floordiv:
        case Op::mod: {
          if (y == 0) fail("integer division or modulo by zero");
          if (y == -1) {  // avoids INT64_MIN / -1
            if (op == Op::mod) return int64_t{0};
            overflow = __builtin_sub_overflow(int64_t{0}, x, &r);
            break;
          }
          int64_t q = x / y, m = x % y;
          if (m != 0 && ((m < 0) != (y < 0))) {  // Python rounds toward negative infinity
            --q;
            m += y;
          }
          return op == Op::floordiv ? q : m;
        }
        case Op::pow: {
          if (y < 0) {
            if (x == 0) fail("0 cannot be raised to a negative power");
            return std::pow(static_cast<double>(x), static_cast<double>(y));
          }
          r = 1;
          for (int64_t base = x, e = y; e > 0 && !overflow; e >>= 1) {
            if ((e & 1) != 0) overflow = __builtin_mul_overflow(r, base, &r);
            if (e > 1 && !overflow) overflow = __builtin_mul_overflow(base, base, &base);
          }
          break;
        }
        default: fail("not an arithmetic operator");
      }
      if (overflow) fail("integer overflow (Python integers are unbounded, these are 64-bit)");
      return r;
    }
    const double x = as_double(a), y = as_double(b);
    switch (op) {
      case Op::add: return x + y;
      case Op::sub: return x - y;
      case Op::mul: return x * y;
      case Op::div:
        if (y == 0) fail("float division by zero");
        return x / y;
      case Op::floordiv:
      case Op::mod: {
        if (y == 0) fail("float modulo by zero");
        double mod = std::fmod(x, y);  // Python's float_divmod
        double div = (x - mod) / y;
        if (mod != 0 && ((y < 0) != (mod < 0))) {
          mod += y;
          div -= 1.0;
        }
        if (op == Op::mod) return mod != 0 ? mod : std::copysign(0.0, y);
        if (div == 0) return std::copysign(0.0, x / y);
        double floor_div = std::floor(div);
        if (div - floor_div > 0.5) floor_div += 1.0;
        return floor_div;
      }
      case Op::pow:
        if (x == 0 && y < 0) fail("0.0 cannot be raised to a negative power");
        if (x < 0 && y != std::floor(y)) fail("negative number cannot be raised to a fractional power");
        if (const double r = std::pow(x, y); std::isfinite(r) || !std::isfinite(x) || !std::isfinite(y)) return r;
        fail("numerical result out of range");
      default: fail("not an arithmetic operator");
    }
  }

 private:
  std::string_view source_;
  const RenderOptions& opts_;
  const Scope* root_ = nullptr;
  std::deque<Namespace> namespaces_;  // stable addresses; die with the render
  size_t steps_ = 0;
  int depth_ = 0;
};

// ---------------------------------------------------------------------------
// 6. Builtins

bool given(const Value& v) { return !v.is<Undefined>(); }
Value or_default(const Value& v, Value def) { return given(v) ? v : std::move(def); }

int64_t int_arg(const Value& v, std::string_view what) {
  if (!is_integral(v)) fail(std::string(what) + " must be an integer, not '" + type_name(v) + "'");
  return as_int(v);
}
const std::string& str_arg(const Value& v, std::string_view what) {
  if (v.str() == nullptr) fail(std::string(what) + " must be a string, not '" + type_name(v) + "'");
  return *v.str();
}
const std::string* opt_str_arg(const Value& v, std::string_view what) {
  return given(v) && !v.is<std::nullptr_t>() ? &str_arg(v, what) : nullptr;
}
const std::string& self_str(const Value& self) { return str_arg(self, "the object"); }

// "a.b.0": attribute/item path as Jinja's attribute= arguments take it.
Value get_path(Renderer& r, Value v, const std::string& path) {
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot - start);
    int64_t index = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), index);
    const bool is_index = !part.empty() && ec == std::errc() && end == part.data() + part.size() && part[0] != '-';
    v = r.get_item(v, is_index ? Value(index) : Value(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

Value length(Renderer&, const Value& self, std::vector<Value>&) {
  if (const std::string* s = self.str()) return char_count(*s);
  if (const List* l = self.list()) return l->items.size();
  if (const Dict* d = self.dict()) return d->items.size();
  if (self.is<Undefined>()) return 0;
  fail("object of type '" + type_name(self) + "' has no len()");
}

Value default_filter(Renderer&, const Value& self, std::vector<Value>& a) {
  if (self.is<Undefined>() || (truthy(a[1]) && !truthy(self))) return or_default(a[0], "");
  return self;
}

std::string replace(std::string_view s, std::string_view old, std::string_view replacement, int64_t count,
                    size_t max_bytes) {
  std::string out;
  if (old.empty()) {  // Python inserts the replacement around every character
    const auto offsets = char_offsets(s);
    for (size_t i = 0; i < offsets.size(); ++i) {
      if (count < 0 || static_cast<int64_t>(i) < count) out += replacement;
      if (i + 1 < offsets.size()) out.append(s.substr(offsets[i], offsets[i + 1] - offsets[i]));
      if (out.size() > max_bytes) fail_size(max_bytes);
    }
    return out;
  }
  size_t pos = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t hit = s.find(old, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(replacement);
    if (out.size() > max_bytes) fail_size(max_bytes);
    pos = hit + old.size();
  }
  out.append(s.substr(pos));
  return out;
}

Value replace_impl(Renderer& r, const std::string& s, const std::vector<Value>& a) {
  const int64_t count = given(a[2]) && !a[2].is<std::nullptr_t>() ? int_arg(a[2], "count") : -1;
  return replace(s, str_arg(a[0], "old"), str_arg(a[1], "new"), count, r.options().max_output_bytes);
}

// Python's str.split / Jinja's split semantics: whitespace runs when sep is None.
Value split(Renderer& r, const std::string& s, const std::string* sep, int64_t max_split) {
  std::vector<Value> parts;
  if (sep == nullptr) {
    size_t i = 0;
    while (true) {
      while (i < s.size()) {
        size_t next = i;
        if (!is_space(decode(s, next))) break;
        i = next;
      }
      if (i >= s.size()) break;
      if (max_split >= 0 && static_cast<int64_t>(parts.size()) == max_split) {
        parts.emplace_back(s.substr(i));
        break;
      }
      size_t end = i;
      while (end < s.size()) {
        size_t next = end;
        if (is_space(decode(s, next))) break;
        end = next;
      }
      parts.emplace_back(s.substr(i, end - i));
      i = end;
    }
  } else {
    if (sep->empty()) fail("empty separator");
    size_t pos = 0;
    for (size_t hit; (max_split < 0 || static_cast<int64_t>(parts.size()) < max_split) &&
                     (hit = s.find(*sep, pos)) != std::string::npos;
         pos = hit + sep->size()) {
      parts.emplace_back(s.substr(pos, hit - pos));
    }
    parts.emplace_back(s.substr(pos));
  }
  return r.make_list(std::move(parts));
}

Value capitalize(const std::string& s) {
  return map_chars(s, [first = true](char32_t c) mutable {
    const bool was_first = std::exchange(first, false);
    return was_first ? static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c))) : to_lower(c);
  });
}

// Filters and tests that take an item test (select, selectattr...): args are
// (test name, test arguments...) and no name means truthiness.
Value select(Renderer& r, const Value& self, const std::vector<Value>& a, bool by_attribute, bool keep) {
  if (!truthy(self)) return r.make_list({});  // Jinja filters nothing out of none/undefined
  const List& rest = *a[0].list();
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (rest.items.empty()) fail("selectattr/rejectattr need an attribute name");
    attribute = str_arg(rest.items[next++], "attribute");
  }
  const Value test_name = next < rest.items.size() ? rest.items[next++] : Value();
  std::vector<Value> out;
  for (Value& item : r.iterate(self)) {
    const Value subject = by_attribute ? get_path(r, item, attribute) : item;
    bool passed = false;
    if (given(test_name)) {
      Args args;
      args.positional.assign(rest.items.begin() + static_cast<ptrdiff_t>(next), rest.items.end());
      passed = r.apply_test(test_name, subject, std::move(args));
    } else {
      passed = truthy(subject);
    }
    if (passed == keep) out.push_back(std::move(item));
  }
  return r.make_list(std::move(out));
}

Value round_filter(Renderer&, const Value& self, std::vector<Value>& a) {
  if (!is_number(self)) fail("round() needs a number, not '" + type_name(self) + "'");
  const int64_t precision = given(a[0]) ? int_arg(a[0], "precision") : 0;
  const std::string method = given(a[1]) ? str_arg(a[1], "method") : "common";
  if (method != "common" && method != "ceil" && method != "floor")
    fail("method must be 'common', 'ceil' or 'floor'");
  if (is_integral(self) && method == "common") return as_int(self);  // Python's round(int) is the int
  const double x = as_double(self);
  if (!std::isfinite(x)) return x;
  const double scale = std::pow(10.0, static_cast<double>(precision));
  if (method == "ceil") return std::ceil(x * scale) / scale;
  if (method == "floor") return std::floor(x * scale) / scale;
  if (precision < 0) return std::nearbyint(x * scale) / scale;
  // Python rounds the exact binary value half to even, which is what printf does.
  char buf[1024];  // room for 309 integer digits and 300 decimals
  std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::min<int64_t>(precision, 300)), x);
  double rounded = 0;
  std::from_chars(buf, buf + std::strlen(buf), rounded);
  return rounded;
}

// An indentation given as a string or as a number of spaces.
std::string indentation(const Renderer& r, const Value& v, int64_t default_width) {
  if (const std::string* s = v.str()) return *s;
  const int64_t width = std::max<int64_t>(0, given(v) ? int_arg(v, "indent width") : default_width);
  r.check_size(static_cast<size_t>(width));
  return std::string(static_cast<size_t>(width), ' ');
}

Value tojson(Renderer& r, const Value& self, std::vector<Value>& a) {
  // transformers' signature: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  JsonFormat f;
  f.ensure_ascii = truthy(a[0]);
  if (given(a[1]) && !a[1].is<std::nullptr_t>()) {
    f.indent = indentation(r, a[1], 0);
    f.item_separator = ",";
  }
  if (given(a[2]) && !a[2].is<std::nullptr_t>()) {
    const List* l = a[2].list();
    if (l == nullptr || l->items.size() != 2) fail("separators must be an (item, key) pair");
    f.item_separator = str_arg(l->items[0], "separator");
    f.key_separator = str_arg(l->items[1], "separator");
  }
  f.sort_keys = truthy(a[3]);
  f.max_bytes = r.options().max_output_bytes;
  std::string out;
  dump_json(self, f, 0, out);
  r.check_size(out.size());
  return out;
}

Value indent(Renderer& r, const Value& self, std::vector<Value>& a) {
  const std::string ind = indentation(r, a[0], 4);
  const std::string s = self_str(self) + "\n";  // Jinja's quirk, so that a trailing newline survives splitlines
  const auto lines = split_lines(s);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += '\n';
    if (i > 0 && (truthy(a[2]) || !lines[i].empty())) out += ind;
    out += lines[i];
    r.check_size(out.size());
  }
  if (truthy(a[1])) out = ind + out;
  r.check_size(out.size());
  return out;
}

Value int_filter(Renderer&, const Value& self, std::vector<Value>& a) {
  if (const Undefined* u = self.undefined()) fail_undefined(*u);
  const Value def = or_default(a[0], 0);
  if (is_integral(self)) return as_int(self);
  double d = 0;
  if (self.is<double>()) {
    d = std::get<double>(self.v);
  } else if (const std::string* s = self.str()) {
    const std::string_view t = strip(*s, nullptr, true, true);
    const int base = given(a[1]) ? static_cast<int>(int_arg(a[1], "base")) : 10;
    int64_t i = 0;
    const char* begin = t.data() + (t.starts_with('+') ? 1 : 0);
    const auto res = std::from_chars(begin, t.data() + t.size(), i, base);
    if (res.ec == std::errc() && res.ptr == t.data() + t.size() && begin != res.ptr) return i;
    const auto fres = std::from_chars(begin, t.data() + t.size(), d);  // "42.23"|int is 42
    if (fres.ec != std::errc() || fres.ptr != t.data() + t.size()) return def;
  } else {
    return def;
  }
  if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return def;
  return static_cast<int64_t>(d);
}

Value float_filter(Renderer&, const Value& self, std::vector<Value>& a) {
  if (const Undefined* u = self.undefined()) fail_undefined(*u);
  if (is_number(self)) return as_double(self);
  if (const std::string* s = self.str()) {
    const std::string_view t = strip(*s, nullptr, true, true);
    const char* begin = t.data() + (t.starts_with('+') ? 1 : 0);
    double d = 0;
    const auto res = std::from_chars(begin, t.data() + t.size(), d);
    if (res.ec == std::errc() && res.ptr == t.data() + t.size() && begin != res.ptr) return d;
  }
  return or_default(a[0], 0.0);
}

Value title_filter(Renderer& r, const Value& self, std::vector<Value>&) {
  // Jinja's title: words start after whitespace, '-', '(', '{', '[' or '<'.
  return map_chars(r.str(self), [word_start = true](char32_t c) mutable {
    const bool starts =
        std::exchange(word_start, is_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<');
    return starts ? to_upper(c) : to_lower(c);
  });
}

Value map_filter(Renderer& r, const Value& self, std::vector<Value>& a) {
  const List& positional = *a[0].list();
  const Dict& keywords = *a[1].dict();
  std::vector<Value> out;
  if (!truthy(self)) return r.make_list({});  // as select()
  if (const Value* attribute = keywords.find("attribute")) {
    const Value* def = keywords.find("default");
    for (const Value& item : r.iterate(self)) {
      Value v = get_path(r, item, str_arg(*attribute, "attribute"));
      out.push_back(v.is<Undefined>() && def != nullptr ? *def : std::move(v));
    }
    return r.make_list(std::move(out));
  }
  if (positional.items.empty()) fail("map() needs a filter name or attribute=");
  const std::string& name = str_arg(positional.items[0], "filter name");
  const Builtin* filter = find_filter(name);
  if (filter == nullptr) fail("unknown filter '" + name + "'");
  for (const Value& item : r.iterate(self)) {
    Args args;
    args.positional.assign(positional.items.begin() + 1, positional.items.end());
    args.keywords = keywords.items;
    out.push_back(r.invoke(*filter, item, std::move(args)));
  }
  return r.make_list(std::move(out));
}

Value join(Renderer& r, const Value& self, std::vector<Value>& a) {
  const std::string sep = given(a[0]) ? r.str(a[0]) : "";
  const std::string* attribute = opt_str_arg(a[1], "attribute");
  std::string out;
  bool first = true;
  for (const Value& item : r.iterate(self)) {
    if (!std::exchange(first, false)) out += sep;
    out += r.str(attribute != nullptr ? get_path(r, item, *attribute) : item);
    r.check_size(out.size());
  }
  return out;
}

Value items(Renderer& r, const Value& self) {
  std::vector<Value> out;
  if (const Dict* d = self.dict()) {
    for (const auto& [k, v] : d->items) out.push_back(r.make_list({Value(k), v}, true));
  } else if (Namespace* ns = self.ns()) {
    for (const auto& [k, v] : ns->attrs.items) out.push_back(r.make_list({Value(k), v}, true));
  } else if (!self.is<Undefined>()) {
    fail("items() needs a mapping, not '" + type_name(self) + "'");
  }
  return r.make_list(std::move(out));
}

const std::vector<Builtin>& filters() {
  using V = std::vector<Value>;
  static const std::vector<Builtin> table = {
      {"abs",
       {},
       [](Renderer&, const Value& v, V&) -> Value {
         if (v.is<double>()) return std::fabs(std::get<double>(v.v));
         if (!is_integral(v)) fail("bad operand type for abs(): '" + type_name(v) + "'");
         if (as_int(v) == INT64_MIN) fail("integer overflow");
         return std::abs(as_int(v));
       }},
      {"capitalize", {}, [](Renderer& r, const Value& v, V&) { return capitalize(r.str(v)); }},
      {"count", {}, length},
      {"d", {"default_value", "boolean"}, default_filter},
      {"default", {"default_value", "boolean"}, default_filter},
      {"first",
       {},
       [](Renderer& r, const Value& v, V&) -> Value {
         auto all = r.iterate(v);
         return all.empty() ? Value(Undefined{"no first item, sequence was empty"}) : all.front();
       }},
      {"float", {"default"}, float_filter},
      {"indent", {"width", "first", "blank"}, indent},
      {"int", {"default", "base"}, int_filter},
      {"items", {}, [](Renderer& r, const Value& v, V&) { return items(r, v); }},
      {"join", {"d", "attribute"}, join},
      {"last",
       {},
       [](Renderer& r, const Value& v, V&) -> Value {
         auto all = r.iterate(v);
         return all.empty() ? Value(Undefined{"no last item, sequence was empty"}) : all.back();
       }},
      {"length", {}, length},
      {"list", {}, [](Renderer& r, const Value& v, V&) { return r.make_list(r.iterate(v)); }},
      {"lower", {}, [](Renderer& r, const Value& v, V&) { return Value(lower(r.str(v))); }},
      {"map", {"*args", "**kwargs"}, map_filter},
      {"reject", {"*args"}, [](Renderer& r, const Value& v, V& a) { return select(r, v, a, false, false); }},
      {"rejectattr", {"*args"}, [](Renderer& r, const Value& v, V& a) { return select(r, v, a, true, false); }},
      {"replace",
       {"old", "new", "count"},
       [](Renderer& r, const Value& v, V& a) { return replace_impl(r, r.str(v), a); }},
      {"reverse",
       {},
       [](Renderer& r, const Value& v, V&) -> Value {
         auto all = r.iterate(v);
         std::reverse(all.begin(), all.end());
         if (v.str() == nullptr) return r.make_list(std::move(all));
         std::string out;
         for (const Value& c : all) out += *c.str();
         return out;
       }},
      {"round", {"precision", "method"}, round_filter},
      {"safe", {}, [](Renderer&, const Value& v, V&) { return v; }},
      {"select", {"*args"}, [](Renderer& r, const Value& v, V& a) { return select(r, v, a, false, true); }},
      {"selectattr", {"*args"}, [](Renderer& r, const Value& v, V& a) { return select(r, v, a, true, true); }},
      {"string", {}, [](Renderer& r, const Value& v, V&) { return Value(r.str(v)); }},
      {"title", {}, title_filter},
      {"tojson", {"ensure_ascii", "indent", "separators", "sort_keys"}, tojson},
      {"trim",
       {"chars"},
       [](Renderer& r, const Value& v, V& a) {
         return Value(strip(r.str(v), opt_str_arg(a[0], "chars"), true, true));
       }},
      {"upper", {}, [](Renderer& r, const Value& v, V&) { return Value(upper(r.str(v))); }},
  };
  return table;
}

// Python's value % n == remainder, as Jinja's odd/even/divisibleby tests compute it.
bool has_remainder(const Value& v, int64_t n, int64_t remainder) {
  if (const Undefined* u = v.undefined()) fail_undefined(*u);
  if (!is_number(v)) fail("'" + type_name(v) + "' is not a number");
  return equal(Renderer::number_arithmetic(Op::mod, v, n), remainder);
}

const std::vector<Builtin>& tests() {
  using V = std::vector<Value>;
  auto eq = [](Renderer&, const Value& v, V& a) { return Value(equal(v, a[0])); };
  auto ne = [](Renderer&, const Value& v, V& a) { return Value(!equal(v, a[0])); };
  auto lt = [](Renderer&, const Value& v, V& a) { return Value(less(v, a[0])); };
  auto le = [](Renderer&, const Value& v, V& a) { return Value(less(v, a[0]) || equal(v, a[0])); };
  auto gt = [](Renderer&, const Value& v, V& a) { return Value(less(a[0], v)); };
  auto ge = [](Renderer&, const Value& v, V& a) { return Value(less(a[0], v) || equal(v, a[0])); };
  auto iterable = [](Renderer&, const Value& v, V&) {
    return Value(v.str() != nullptr || v.list() != nullptr || v.dict() != nullptr || v.is<Undefined>());
  };
  static const std::vector<Builtin> table = {
      {"!=", {"other"}, ne},
      {"<", {"other"}, lt},
      {"<=", {"other"}, le},
      {"==", {"other"}, eq},
      {">", {"other"}, gt},
      {">=", {"other"}, ge},
      {"boolean", {}, [](Renderer&, const Value& v, V&) { return Value(v.is<bool>()); }},
      {"defined", {}, [](Renderer&, const Value& v, V&) { return Value(!v.is<Undefined>()); }},
      {"divisibleby", {"num"}, [](Renderer&, const Value& v, V& a) {
         const int64_t n = int_arg(a[0], "num");
         if (n == 0) fail("division by zero");
         return Value(has_remainder(v, n, 0));
       }},
      {"eq", {"other"}, eq},
      {"equalto", {"other"}, eq},
      {"even", {}, [](Renderer&, const Value& v, V&) { return Value(has_remainder(v, 2, 0)); }},
      {"false", {}, [](Renderer&, const Value& v, V&) { return Value(v.is<bool>() && !std::get<bool>(v.v)); }},
      {"float", {}, [](Renderer&, const Value& v, V&) { return Value(v.is<double>()); }},
      {"ge", {"other"}, ge},
      {"greaterthan", {"other"}, gt},
      {"gt", {"other"}, gt},
      {"in", {"seq"}, [](Renderer& r, const Value& v, V& a) { return Value(r.contains(a[0], v)); }},
      {"integer", {}, [](Renderer&, const Value& v, V&) { return Value(v.is<int64_t>()); }},
      {"iterable", {}, iterable},
      {"le", {"other"}, le},
      {"lessthan", {"other"}, lt},
      {"lt", {"other"}, lt},
      {"mapping", {}, [](Renderer&, const Value& v, V&) { return Value(v.dict() != nullptr); }},
      {"ne", {"other"}, ne},
      {"none", {}, [](Renderer&, const Value& v, V&) { return Value(v.is<std::nullptr_t>()); }},
      {"number", {}, [](Renderer&, const Value& v, V&) { return Value(is_number(v)); }},
      {"odd", {}, [](Renderer&, const Value& v, V&) { return Value(has_remainder(v, 2, 1)); }},
      {"sequence", {}, iterable},
      {"string", {}, [](Renderer&, const Value& v, V&) { return Value(v.str() != nullptr); }},
      {"true", {}, [](Renderer&, const Value& v, V&) { return Value(v.is<bool>() && std::get<bool>(v.v)); }},
      {"undefined", {}, [](Renderer&, const Value& v, V&) { return Value(v.is<Undefined>()); }},
  };
  return table;
}

bool starts_or_ends_with(const Value& self, const Value& affix, bool start) {
  const std::string_view s = self_str(self);
  auto one = [&](const Value& a) {
    const std::string& x = str_arg(a, "prefix");
    return start ? s.starts_with(x) : s.ends_with(x);
  };
  if (const List* l = affix.list()) return std::any_of(l->items.begin(), l->items.end(), one);
  return one(affix);
}

const std::vector<Builtin>& string_methods() {
  using V = std::vector<Value>;
  static const std::vector<Builtin> table = {
      {"capitalize", {}, [](Renderer&, const Value& v, V&) { return capitalize(self_str(v)); }},
      {"endswith",
       {"suffix"},
       [](Renderer&, const Value& v, V& a) { return Value(starts_or_ends_with(v, a[0], false)); }},
      {"join",
       {"iterable"},
       [](Renderer& r, const Value& v, V& a) -> Value {
         std::string out;
         bool first = true;
         for (const Value& item : r.iterate(a[0])) {
           if (!std::exchange(first, false)) out += self_str(v);
           out += str_arg(item, "sequence item");
           r.check_size(out.size());
         }
         return out;
       }},
      {"lower", {}, [](Renderer&, const Value& v, V&) { return Value(lower(self_str(v))); }},
      {"lstrip",
       {"chars"},
       [](Renderer&, const Value& v, V& a) {
         return Value(strip(self_str(v), opt_str_arg(a[0], "chars"), true, false));
       }},
      {"replace",
       {"old", "new", "count"},
       [](Renderer& r, const Value& v, V& a) { return replace_impl(r, self_str(v), a); }},
      {"rstrip",
       {"chars"},
       [](Renderer&, const Value& v, V& a) {
         return Value(strip(self_str(v), opt_str_arg(a[0], "chars"), false, true));
       }},
      {"split",
       {"sep", "maxsplit"},
       [](Renderer& r, const Value& v, V& a) {
         return split(r, self_str(v), opt_str_arg(a[0], "sep"), given(a[1]) ? int_arg(a[1], "maxsplit") : -1);
       }},
      {"startswith",
       {"prefix"},
       [](Renderer&, const Value& v, V& a) { return Value(starts_or_ends_with(v, a[0], true)); }},
      {"strip",
       {"chars"},
       [](Renderer&, const Value& v, V& a) {
         return Value(strip(self_str(v), opt_str_arg(a[0], "chars"), true, true));
       }},
      {"title",
       {},
       [](Renderer&, const Value& v, V&) {
         // Python's str.title: a letter after an uncased character starts a word.
         return Value(map_chars(self_str(v), [prev_cased = false](char32_t c) mutable {
           const bool after_cased = std::exchange(prev_cased, is_cased(c));
           return after_cased ? to_lower(c) : to_upper(c);
         }));
       }},
      {"upper", {}, [](Renderer&, const Value& v, V&) { return Value(upper(self_str(v))); }},
  };
  return table;
}

const std::vector<Builtin>& dict_methods() {
  using V = std::vector<Value>;
  static const std::vector<Builtin> table = {
      {"get", {"key", "default"}, [](Renderer&, const Value& v, V& a) -> Value {
         const Value* found = v.dict()->find(str_arg(a[0], "key"));
         return found != nullptr ? *found : or_default(a[1], nullptr);
       }},
      {"items", {}, [](Renderer& r, const Value& v, V&) { return items(r, v); }},
      {"keys", {}, [](Renderer& r, const Value& v, V&) { return r.make_list(r.iterate(v)); }},
      {"values", {}, [](Renderer& r, const Value& v, V&) {
         std::vector<Value> out;
         for (const auto& kv : v.dict()->items) out.push_back(kv.second);
         return r.make_list(std::move(out));
       }},
  };
  return table;
}

std::string strftime_now(const RenderOptions& opts, const std::string& format) {
  const std::time_t now = opts.now.value_or(std::time(nullptr));
  std::tm tm{};
  localtime_r(&now, &tm);
  if (format.empty()) return "";
  // strftime reports a too-small buffer and an empty result alike; grow a bounded number of times.
  for (size_t size = 256; size <= 65536; size *= 4) {
    std::string buf(size, '\0');
    const size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &tm);
    if (n > 0) return buf.substr(0, n);
  }
  return "";
}

const std::vector<Builtin>& global_functions() {
  using V = std::vector<Value>;
  static const std::vector<Builtin> table = {
      {"dict", {"**kwargs"}, [](Renderer&, const Value&, V& a) { return a[0]; }},
      {"namespace", {"*args", "**kwargs"}, [](Renderer& r, const Value&, V& a) {
         Namespace* ns = r.make_namespace();
         for (const Value& init : a[0].list()->items) {
           const Dict* d = init.dict();
           if (d == nullptr) fail("namespace() takes dicts and keyword arguments");
           for (const auto& [k, v] : d->items) ns->attrs.set(k, v);
         }
         for (const auto& [k, v] : a[1].dict()->items) ns->attrs.set(k, v);
         return Value(ns);
       }},
      {"raise_exception", {"message"}, [](Renderer& r, const Value&, V& a) -> Value {
         throw Failure{r.str(a[0]), true};
       }},
      {"range", {"*args"}, [](Renderer& r, const Value&, V& a) {
         const auto& args = a[0].list()->items;
         if (args.empty() || args.size() > 3) fail("range() takes 1 to 3 integer arguments");
         int64_t start = 0, stop = 0, step = 1;
         if (args.size() == 1) {
           stop = int_arg(args[0], "range() argument");
         } else {
           start = int_arg(args[0], "range() argument");
           stop = int_arg(args[1], "range() argument");
           if (args.size() == 3) step = int_arg(args[2], "range() argument");
         }
         if (step == 0) fail("range() step must not be zero");
         const double n = std::max(
             0.0, std::ceil((static_cast<double>(stop) - static_cast<double>(start)) / static_cast<double>(step)));
         if (n > static_cast<double>(r.options().max_items))
           fail("range() of more than " + std::to_string(r.options().max_items) + " items");
         std::vector<Value> items;
         for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) items.emplace_back(i);
         return r.make_list(std::move(items));
       }},
      {"strftime_now", {"format"}, [](Renderer& r, const Value&, V& a) {
         return Value(strftime_now(r.options(), str_arg(a[0], "format")));
       }},
  };
  return table;
}

const Builtin* find_in(const std::vector<Builtin>& table, std::string_view name) {
  const auto it = std::find_if(table.begin(), table.end(), [&](const Builtin& b) { return b.name == name; });
  return it != table.end() ? &*it : nullptr;
}
const Builtin* find_filter(std::string_view name) { return find_in(filters(), name); }
const Builtin* find_test(std::string_view name) { return find_in(tests(), name); }
const Builtin* find_method(const Value& self, std::string_view name) {
  if (self.str() != nullptr) return find_in(string_methods(), name);
  if (self.dict() != nullptr) return find_in(dict_methods(), name);
  return nullptr;
}

}  // namespace

// ---------------------------------------------------------------------------
// Template

struct Template::Program {
  std::string source;  // normalized; error locations refer to it
  std::vector<Stmt> body;
  std::vector<std::string> unknown_names;
};

Template::Template(std::string_view source) {
  auto program = std::make_unique<Program>();
  program->source = normalize_newlines(source);
  Parser parser(program->source, Lexer(program->source).run());
  program->body = parser.parse_template();
  program->unknown_names = parser.unknown_names();
  program_ = std::move(program);
}

const std::vector<std::string>& Template::unknown_names() const { return program_->unknown_names; }

Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;
Template::~Template() = default;

namespace {

template <class Json>
std::string render_program(const std::string& source, const std::vector<Stmt>& body, const Json& context,
                           const RenderOptions& options) {
  auto error = [](const std::string& message) { return RenderError(message, message, 0, 0); };
  if (!context.is_object()) throw error("the template context must be a JSON object");
  Renderer renderer(source, options);
  Scope globals;
  for (const Builtin& b : global_functions()) {
    auto f = std::make_shared<Function>();
    f->name = b.name;
    f->builtin = &b;
    globals.set(std::string(b.name), std::shared_ptr<const Function>(std::move(f)));
  }
  Scope vars{&globals, {}};
  try {
    for (const auto& [k, v] : context.items()) vars.set(k, renderer.from_json(v));
  } catch (const Failure& f) {
    throw error("context: " + f.message);
  }
  return renderer.run(body, vars);
}

}  // namespace

std::string Template::render(const nlohmann::json& context, const RenderOptions& options) const {
  return render_program(program_->source, program_->body, context, options);
}

std::string Template::render(const nlohmann::ordered_json& context, const RenderOptions& options) const {
  return render_program(program_->source, program_->body, context, options);
}

}  // namespace llm::weights::jinja
