#include "weights/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

namespace llm::weights {

// ---- UTF-8 -----------------------------------------------------------------

namespace {

struct SequenceCheck {
  size_t need = 0;  // length the lead byte announces; 0: not a lead byte
  size_t ok = 0;    // leading bytes consistent with a well-formed sequence
};

// Follows the Unicode "well-formed UTF-8" table (Table 3-7), whose per-lead
// ranges for the second byte exclude overlongs, surrogates and > U+10FFFF.
SequenceCheck check_sequence(std::string_view s) {
  const auto b0 = static_cast<unsigned char>(s[0]);
  if (b0 < 0x80) return {1, 1};
  size_t need = 0;
  unsigned char lo = 0x80;
  unsigned char hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {0, 0};
  }
  size_t ok = 1;
  while (ok < need && ok < s.size()) {
    const auto b = static_cast<unsigned char>(s[ok]);
    const bool fits = ok == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!fits) break;
    ++ok;
  }
  return {need, ok};
}

}  // namespace

size_t utf8_valid_length(std::string_view s) {
  if (s.empty()) return 0;
  const SequenceCheck c = check_sequence(s);
  return c.need != 0 && c.ok == c.need ? c.need : 0;
}

size_t utf8_lead_length(unsigned char lead) {
  static constexpr uint8_t kByHighNibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kByHighNibble[lead >> 4];
}

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    // ASCII runs dominate real text; skip them without the table walk.
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = utf8_valid_length(s.substr(i));
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const SequenceCheck c = check_sequence(s.substr(i));
    if (c.need != 0 && c.ok == c.need) {
      out.append(s.substr(i, c.need));
      i += c.need;
    } else {
      out.append(kReplacementChar);
      i += std::max<size_t>(c.ok, 1);
    }
  }
  return out;
}

size_t utf8_incomplete_tail(std::string_view s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    const size_t start = n - back;
    const auto b = static_cast<unsigned char>(s[start]);
    if (b >= 0x80 && b <= 0xBF) continue;  // continuation byte: look further back
    const SequenceCheck c = check_sequence(s.substr(start));
    return c.need > back && c.ok == back ? back : 0;
  }
  return 0;
}

char32_t utf8_decode(std::string_view s, size_t len) {
  const auto b = [&](size_t i) { return static_cast<char32_t>(static_cast<unsigned char>(s[i])); };
  switch (len) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_unicode_whitespace(char32_t cp) {
  // The White_Space property, which Rust's char::is_whitespace (and so HF's
  // lstrip/rstrip) uses.
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

// ---- Byte-level alphabet ------------------------------------------------------

namespace {

struct ByteAlphabet {
  std::array<std::string, 256> to_unicode;
  std::array<int16_t, 512> to_byte{};  // by code point; -1 outside the alphabet

  ByteAlphabet() {
    to_byte.fill(-1);
    // GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for
    // themselves, the others are moved to U+0100 onwards in byte order.
    const auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = printable(b) ? static_cast<char32_t>(b) : next++;
      utf8_append(to_unicode[b], cp);
      to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet alphabet;
  return alphabet;
}

}  // namespace

const std::string& byte_to_unicode(uint8_t byte) { return byte_alphabet().to_unicode[byte]; }

std::optional<std::string> unicode_to_bytes(std::string_view token) {
  const ByteAlphabet& a = byte_alphabet();
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    const size_t n = utf8_valid_length(token.substr(i));
    if (n == 0) return std::nullopt;
    const char32_t cp = utf8_decode(token.substr(i), n);
    if (cp >= a.to_byte.size() || a.to_byte[cp] < 0) return std::nullopt;
    out += static_cast<char>(a.to_byte[cp]);
    i += n;
  }
  return out;
}

// ---- Regex -------------------------------------------------------------------

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

namespace {

// Per-thread match state: match data and a JIT stack larger than the 32 KiB
// default, so long runs of one character class cannot exhaust it.
struct MatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);

  MatchState() {
    if (data == nullptr || context == nullptr) throw std::bad_alloc();
    if (jit_stack != nullptr) pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

Regex::Regex(std::string_view pattern, bool literal) : code_(std::make_unique<Code>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // PCRE2 rejects UCP together with LITERAL; a literal needs no classes anyway.
  const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                              &error, &offset, nullptr);
  if (code_->code == nullptr) {
    throw std::invalid_argument("bad regex '" + std::string(pattern) + "' at offset " +
                                std::to_string(offset) + ": " + pcre2_message(error));
  }
  // JIT is an optimisation; without it (unsupported CPU) the interpreter runs.
  pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE);
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

void Regex::find_all(std::string_view text, Span span, std::vector<Span>& out) const {
  MatchState& state = match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + span.begin);
  const size_t n = span.size;
  size_t pos = 0;
  while (pos < n) {
    // NO_UTF_CHECK: the text was validated once up front; checking again on
    // every call would make splitting quadratic in the piece length.
    const int rc = pcre2_match(code_->code, subject, n, pos, PCRE2_NO_UTF_CHECK, state.data,
                               state.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw std::runtime_error("regex match failed: " + pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state.data);
    const size_t begin = ov[0];
    const size_t end = ov[1];
    if (end > begin) {
      out.push_back({span.begin + begin, end - begin});
      pos = end;
    } else {
      // An empty match: step over one character so the scan progresses.
      pos = begin + utf8_lead_length(static_cast<unsigned char>(text[span.begin + begin]));
    }
  }
}

// ---- Normalizer ---------------------------------------------------------------

std::string unicode_normalize(std::string_view text, UnicodeForm form) {
  if (std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
    return std::string(text);  // ASCII is invariant under every form
  }
  int options = UTF8PROC_STABLE;
  switch (form) {
    case UnicodeForm::nfc: options |= UTF8PROC_COMPOSE; break;
    case UnicodeForm::nfd: options |= UTF8PROC_DECOMPOSE; break;
    case UnicodeForm::nfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case UnicodeForm::nfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* buf = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &buf,
                   static_cast<utf8proc_option_t>(options));
  if (n < 0) throw std::runtime_error(std::string("unicode normalization failed: ") + utf8proc_errmsg(n));
  std::string out(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
  std::free(buf);
  return out;
}

void Normalizer::add_unicode(UnicodeForm form) { steps_.emplace_back(Unicode{form}); }

void Normalizer::add_prepend(std::string prefix) { steps_.emplace_back(Prepend{std::move(prefix)}); }

void Normalizer::add_replace(std::string_view pattern, std::string content, bool regex) {
  Replace r;
  r.content = std::move(content);
  if (regex) {
    r.regex = std::make_shared<const Regex>(pattern);
  } else {
    if (pattern.empty()) throw std::invalid_argument("Replace with an empty pattern");
    r.pattern = pattern;
  }
  steps_.emplace_back(std::move(r));
}

void Normalizer::add_metaspace_prefix(std::string prefix, PrependScheme scheme) {
  steps_.emplace_back(MetaspacePrefix{std::move(prefix), scheme});
}

namespace {

std::string replace_all(const std::string& s, const std::string& pattern, const std::string& content) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  for (size_t hit; (hit = s.find(pattern, pos)) != std::string::npos; pos = hit + pattern.size()) {
    out.append(s, pos, hit - pos);
    out += content;
  }
  out.append(s, pos);
  return out;
}

}  // namespace

std::string Normalizer::apply(std::string_view text, bool at_input_start) const {
  std::string s(text);
  for (const auto& step : steps_) {
    if (const auto* u = std::get_if<Unicode>(&step)) {
      s = unicode_normalize(s, u->form);
    } else if (const auto* p = std::get_if<Prepend>(&step)) {
      if (!s.empty()) s.insert(0, p->prefix);
    } else if (const auto* r = std::get_if<Replace>(&step)) {
      if (!r->regex) {
        s = replace_all(s, r->pattern, r->content);
        continue;
      }
      std::vector<Span> hits;
      r->regex->find_all(s, {0, s.size()}, hits);
      std::string out;
      size_t pos = 0;
      for (const Span& h : hits) {
        out.append(s, pos, h.begin - pos);
        out += r->content;
        pos = h.end();
      }
      out.append(s, pos);
      s = std::move(out);
    } else if (const auto* m = std::get_if<MetaspacePrefix>(&step)) {
      const bool wanted = m->scheme == PrependScheme::always ||
                          (m->scheme == PrependScheme::first && at_input_start);
      if (wanted && !s.empty() && !s.starts_with(m->prefix)) s.insert(0, m->prefix);
    }
  }
  return s;
}

// ---- Pre-tokenizer -------------------------------------------------------------

void PreTokenizer::add_split(std::string_view pattern, bool literal, SplitBehavior behavior,
                             bool invert) {
  steps_.push_back({std::make_shared<const Regex>(pattern, literal), behavior, invert});
}

namespace {

struct Segment {
  Span span;
  bool delimiter;
};

// Hugging Face's split behaviours over the alternating gap/match segments.
void combine_segments(const std::vector<Segment>& segs, SplitBehavior behavior,
                      std::vector<Span>& out) {
  const size_t first = out.size();
  bool previous_delimiter = false;
  switch (behavior) {
    case SplitBehavior::removed:
      for (const Segment& s : segs) {
        if (!s.delimiter) out.push_back(s.span);
      }
      break;
    case SplitBehavior::isolated:
      for (const Segment& s : segs) out.push_back(s.span);
      break;
    case SplitBehavior::merged_with_previous:
      for (const Segment& s : segs) {
        if (s.delimiter && !previous_delimiter && out.size() > first) {
          out.back().size = s.span.end() - out.back().begin;
        } else {
          out.push_back(s.span);
        }
        previous_delimiter = s.delimiter;
      }
      break;
    case SplitBehavior::merged_with_next:
      // A delimiter joins the piece after it, unless that is a delimiter too.
      for (size_t i = 0; i < segs.size(); ++i) {
        const Segment& s = segs[i];
        if (s.delimiter && i + 1 < segs.size() && !segs[i + 1].delimiter) {
          out.push_back({s.span.begin, segs[i + 1].span.end() - s.span.begin});
          ++i;
        } else {
          out.push_back(s.span);
        }
      }
      break;
    case SplitBehavior::contiguous:
      for (const Segment& s : segs) {
        if (s.delimiter && previous_delimiter && out.size() > first) {
          out.back().size = s.span.end() - out.back().begin;
        } else {
          out.push_back(s.span);
        }
        previous_delimiter = s.delimiter;
      }
      break;
  }
}

}  // namespace

void PreTokenizer::split(std::string_view text, std::vector<Span>& pieces) const {
  pieces.clear();
  if (text.empty()) return;
  pieces.push_back({0, text.size()});
  std::vector<Span> next;
  std::vector<Span> matches;
  std::vector<Segment> segs;
  for (const Step& step : steps_) {
    next.clear();
    for (const Span& piece : pieces) {
      matches.clear();
      step.regex->find_all(text, piece, matches);
      segs.clear();
      size_t pos = piece.begin;
      for (const Span& m : matches) {
        if (m.begin > pos) segs.push_back({{pos, m.begin - pos}, step.invert});
        segs.push_back({m, !step.invert});
        pos = m.end();
      }
      if (pos < piece.end()) segs.push_back({{pos, piece.end() - pos}, step.invert});
      combine_segments(segs, step.behavior, next);
    }
    pieces.swap(next);
  }
}

// ---- Added tokens -------------------------------------------------------------

void AddedTokenMatcher::add(AddedToken token) {
  if (token.content.empty()) return;
  const auto first = static_cast<unsigned char>(token.content[0]);
  const auto index = static_cast<uint32_t>(tokens_.size());
  tokens_.push_back(std::move(token));
  auto& bucket = by_first_byte_[first];
  const size_t len = tokens_.back().content.size();
  // Longest first; among equal lengths the earlier token keeps precedence.
  const auto at = std::find_if(bucket.begin(), bucket.end(),
                               [&](uint32_t i) { return tokens_[i].content.size() < len; });
  bucket.insert(at, index);
}

namespace {

// Code point ending just before byte offset pos (text is valid UTF-8).
char32_t code_point_before(std::string_view text, size_t pos, size_t* len) {
  size_t start = pos - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  *len = pos - start;
  return utf8_decode(text.substr(start), *len);
}

char32_t code_point_at(std::string_view text, size_t pos, size_t* len) {
  *len = std::max<size_t>(utf8_valid_length(text.substr(pos)), 1);
  return utf8_decode(text.substr(pos), *len);
}

bool is_word_char(char32_t cp) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace

void AddedTokenMatcher::split(std::string_view text, bool parse_special,
                              std::vector<Fragment>& out) const {
  out.clear();
  size_t plain_start = 0;  // start of the plain text not yet emitted
  size_t pos = 0;
  while (pos < text.size()) {
    const AddedToken* hit = nullptr;
    for (uint32_t i : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
      const AddedToken& t = tokens_[i];
      if (t.special && !parse_special) continue;
      if (text.compare(pos, t.content.size(), t.content) != 0) continue;
      if (t.single_word) {
        size_t n = 0;
        const size_t end = pos + t.content.size();
        if (pos > 0 && is_word_char(code_point_before(text, pos, &n))) continue;
        if (end < text.size() && is_word_char(code_point_at(text, end, &n))) continue;
      }
      hit = &t;
      break;
    }
    if (hit == nullptr) {
      ++pos;
      continue;
    }
    size_t begin = pos;
    size_t end = pos + hit->content.size();
    size_t n = 0;
    if (hit->lstrip) {
      while (begin > plain_start && is_unicode_whitespace(code_point_before(text, begin, &n))) begin -= n;
    }
    if (hit->rstrip) {
      while (end < text.size() && is_unicode_whitespace(code_point_at(text, end, &n))) end += n;
    }
    if (begin > plain_start) out.push_back({-1, {plain_start, begin - plain_start}});
    out.push_back({hit->id, {begin, end - begin}});
    pos = plain_start = end;
  }
  if (plain_start < text.size()) out.push_back({-1, {plain_start, text.size() - plain_start}});
}

}  // namespace llm::weights
