#pragma once
// Text handling in front of BPE: UTF-8 validation and repair, the byte-level
// byte<->unicode mapping, PCRE2 regex splitting, Unicode normalisation
// (utf8proc), and the splitting of a text around added/special tokens.
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace llm::weights {

// ---- UTF-8 -----------------------------------------------------------------

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed UTF-8 sequence at the start of s (1..4), or 0 when
// s does not start with one. Strict: no overlongs, surrogates or > U+10FFFF.
size_t utf8_valid_length(std::string_view s);
// Length of the character starting with this lead byte, clamped to 1 for
// bytes that cannot start a character (how sentencepiece steps through text).
size_t utf8_lead_length(unsigned char lead);
bool is_valid_utf8(std::string_view s);
// Replaces each maximal ill-formed subsequence with U+FFFD, like Python's
// errors="replace" and Rust's from_utf8_lossy (so it matches HF decode).
std::string to_valid_utf8(std::string_view s);
// Size of the trailing bytes of s that are a proper prefix of a well-formed
// sequence, i.e. could still become a character when more bytes arrive
// (0..3). Bytes that can never become valid are not counted.
size_t utf8_incomplete_tail(std::string_view s);
// Decodes the code point of a well-formed sequence (precondition: valid).
char32_t utf8_decode(std::string_view s, size_t len);
void utf8_append(std::string& out, char32_t cp);
bool is_unicode_whitespace(char32_t cp);

// ---- Byte-level (GPT-2) alphabet -------------------------------------------

// The printable character GPT-2's bytes_to_unicode() assigns to a byte.
const std::string& byte_to_unicode(uint8_t byte);
// Inverse mapping of a whole token; nullopt when a character is outside the
// alphabet (Hugging Face's ByteLevel decoder then keeps the token's raw text).
std::optional<std::string> unicode_to_bytes(std::string_view token);

// ---- Regex -----------------------------------------------------------------

// Pre-tokenizer patterns of the model families we know.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Span {
  size_t begin = 0;
  size_t size = 0;
  size_t end() const { return begin + size; }
};

// A compiled PCRE2 pattern (UTF + UCP, JIT when available). Immutable after
// construction, so one instance can be shared by concurrent encodes.
class Regex {
 public:
  // Throws std::invalid_argument with PCRE2's message on a bad pattern.
  explicit Regex(std::string_view pattern, bool literal = false);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // Appends the non-empty matches inside text[span] (matched as a subject of
  // its own, so anchors and lookarounds see the span's edges). text must be
  // valid UTF-8.
  void find_all(std::string_view text, Span span, std::vector<Span>& out) const;

 private:
  struct Code;
  std::unique_ptr<Code> code_;
};

// ---- Normalizer --------------------------------------------------------------

enum class UnicodeForm { nfc, nfd, nfkc, nfkd };
std::string unicode_normalize(std::string_view text, UnicodeForm form);

// Hugging Face normalizers we support, applied in order to each stretch of
// text between added tokens.
class Normalizer {
 public:
  enum class PrependScheme { always, first, never };

  void add_unicode(UnicodeForm form);
  // HF Prepend: prefix every non-empty stretch.
  void add_prepend(std::string prefix);
  void add_replace(std::string_view pattern, std::string content, bool regex);
  // HF Metaspace's prefix: only when the stretch does not already start with
  // it, and with scheme "first" only for the stretch at the start of the input.
  void add_metaspace_prefix(std::string prefix, PrependScheme scheme);

  bool empty() const { return steps_.empty(); }
  std::string apply(std::string_view text, bool at_input_start) const;

 private:
  struct Unicode { UnicodeForm form; };
  struct Prepend { std::string prefix; };
  struct Replace { std::string pattern; std::shared_ptr<const Regex> regex; std::string content; };
  struct MetaspacePrefix { std::string prefix; PrependScheme scheme; };
  std::vector<std::variant<Unicode, Prepend, Replace, MetaspacePrefix>> steps_;
};

// ---- Pre-tokenizer -----------------------------------------------------------

// HF SplitDelimiterBehavior.
enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

// A sequence of splitting steps; each step refines the pieces of the previous.
class PreTokenizer {
 public:
  void add_split(std::string_view pattern, bool literal, SplitBehavior behavior, bool invert);
  // HF ByteLevel's add_prefix_space: prefix a space unless the text starts
  // with one. Only valid before any split step (checked by the caller).
  void set_prefix_space(bool on) { prefix_space_ = on; }
  bool prefix_space() const { return prefix_space_; }
  bool has_steps() const { return !steps_.empty(); }

  // Splits text into pieces (spans of text). An empty text gives no pieces.
  void split(std::string_view text, std::vector<Span>& pieces) const;

 private:
  struct Step {
    std::shared_ptr<const Regex> regex;
    SplitBehavior behavior;
    bool invert;
  };
  std::vector<Step> steps_;
  bool prefix_space_ = false;
};

// ---- Added / special tokens ----------------------------------------------------

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;  // matched only when parse_special is on
  bool lstrip = false;   // absorbs whitespace on its left
  bool rstrip = false;   // absorbs whitespace on its right
  bool single_word = false;
};

// A piece of the input: either an added token or a stretch of plain text.
struct Fragment {
  int32_t token = -1;  // -1: plain text
  Span text;
};

// Finds added tokens in a text, leftmost first and longest at each position
// (Hugging Face's leftmost-longest matching).
class AddedTokenMatcher {
 public:
  void add(AddedToken token);
  bool empty() const { return tokens_.empty(); }
  void split(std::string_view text, bool parse_special, std::vector<Fragment>& out) const;

 private:
  std::vector<AddedToken> tokens_;
  // Token indices by first byte, longest first, so most positions are
  // rejected by a single table lookup.
  std::array<std::vector<uint32_t>, 256> by_first_byte_;
};

}  // namespace llm::weights
