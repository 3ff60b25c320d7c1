#pragma once
// A Jinja2 subset interpreter for chat templates: lexer, parser to an AST, and a
// tree-walking evaluator.
//
// The environment mirrors the one Hugging Face transformers renders chat
// templates with, so that prompts come out byte for byte the same:
// ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) plus the
// loopcontrols extension ({% break %}, {% continue %}), {% generation %} blocks,
// the globals raise_exception(msg) and strftime_now(fmt), and a tojson filter
// that is Python's json.dumps (", " and ": " separators, non-ASCII kept).
// Newlines are normalized to "\n" and one trailing newline is dropped, as
// Jinja does by default.
//
// Supported: literals, arithmetic, comparisons, and/or/not, in, conditional
// expressions, attribute/subscript/slice access, calls; if/elif/else, for
// (loop.index/index0/revindex/revindex0/first/last/length/previtem/nextitem,
// unpacking, inline "if" filter, else), set (plain, tuple, namespace
// attribute, block), macros with defaults, raw, comments, whitespace control.
//   filters: abs capitalize count d default first float indent int items join
//     last length list lower map reject rejectattr replace reverse round safe
//     select selectattr string title tojson trim upper
//   tests: defined undefined none boolean true false integer float number
//     string mapping iterable sequence odd even divisibleby in eq equalto ne
//     lt le gt ge (and ==, !=, <, <=, >, >=, lessthan, greaterthan)
//   str methods: strip lstrip rstrip split startswith endswith upper lower
//     title capitalize replace join; dict methods: get items keys values
//   globals: range dict namespace raise_exception strftime_now
// Not supported, reported as a SyntaxError or RenderError naming the construct:
// extends/block/include/import, call and filter blocks, with, recursive loops,
// '%' formatting and str.format, other filters/tests/methods. Integers are
// 64-bit (overflow is an error, Python's are unbounded); `safe` does not make
// Markup, so "x"|safe + y does not HTML-escape y as Jinja would.
//
// A compiled Template is immutable; render() may run concurrently.
#include <cstddef>
#include <ctime>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace llm::weights::jinja {

// Every error carries the 1-based line and column of the construct at fault
// (0 when there is none, e.g. a context that is not an object).
class Error : public std::runtime_error {
 public:
  Error(const std::string& what, std::string message, int line, int column)
      : std::runtime_error(what), message_(std::move(message)), line_(line), column_(column) {}
  // The message without the location prefix that what() carries.
  const std::string& message() const { return message_; }
  int line() const { return line_; }
  int column() const { return column_; }

 private:
  std::string message_;
  int line_, column_;
};

// The source is malformed or uses a construct the interpreter does not support.
class SyntaxError : public Error {
  using Error::Error;
};
// Rendering failed: a type error, access to an attribute of an undefined value,
// an unknown filter, a resource limit...
class RenderError : public Error {
  using Error::Error;
};
// The template called raise_exception(message); what() is the message alone,
// as the template author wrote it for the end user.
class RaisedError : public RenderError {
  using RenderError::RenderError;
};

// Bounds that keep a hostile or buggy template from exhausting the server.
struct RenderOptions {
  size_t max_output_bytes = size_t{32} << 20;  // also bounds any single string built
  size_t max_steps = 1'000'000;                // statements + loop iterations + calls
  size_t max_items = size_t{1} << 20;          // elements of one list (range(), '*', '+')
  int max_depth = 256;  // nesting of expression evaluation, macro calls and values
  // The clock strftime_now() reads; the current time when unset.
  std::optional<std::time_t> now;
};

class Template {
 public:
  // Throws SyntaxError with line and column.
  explicit Template(std::string_view source);
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;
  ~Template();

  // context must be a JSON object; its keys are the template's variables.
  // ordered_json keeps the key order of objects (tojson prints keys in that
  // order, as Python dicts do); plain json objects iterate sorted.
  // Throws RenderError (or RaisedError).
  std::string render(const nlohmann::json& context, const RenderOptions& options = {}) const;
  std::string render(const nlohmann::ordered_json& context,
                     const RenderOptions& options = {}) const;

  // Filters and tests the template names but the interpreter lacks, e.g.
  // "filter 'wordcount'". As in Jinja they fail only if rendering reaches them,
  // so a template can still serve the paths that avoid them.
  const std::vector<std::string>& unknown_names() const;

 private:
  struct Program;
  std::unique_ptr<const Program> program_;
};

}  // namespace llm::weights::jinja
