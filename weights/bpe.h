#pragma once
// The two BPE merge loops: rank-based (Hugging Face "BPE" models and GGUF
// "gpt2" vocabs: the merge list decides) and score-based (GGUF "llama"
// sentencepiece vocabs: the score of the joined piece decides, as llama.cpp does).
// Both keep the symbols in a linked list and the candidate pairs in a heap, so
// a word of n symbols costs O(n log n) however long it is.
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace llm::weights {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

// Token text -> id for a vocab whose strings the caller stores (texts[id]).
// Open addressing over (hash tag, id) slots: the strings are not copied, and a
// lookup touches the slot array and the one candidate string.
class TokenIndex {
 public:
  void reserve(size_t n_tokens, const std::vector<std::string>& texts);
  // Indexes texts[id]. When another id already has that text, the first one
  // is kept unless `replace`.
  void insert(int32_t id, const std::vector<std::string>& texts, bool replace);
  int32_t find(std::string_view text, const std::vector<std::string>& texts) const;  // -1: absent

 private:
  struct Slot {
    uint32_t tag = 0;  // low hash bits: most mismatches never touch the string
    int32_t id = -1;   // -1: empty
  };
  void rehash(size_t capacity, const std::vector<std::string>& texts);
  size_t start_of(size_t hash) const { return (hash * 0x9E3779B97F4A7C15ULL) >> shift_; }

  std::vector<Slot> slots_;
  size_t size_ = 0;
  int shift_ = 64;
};

// Merge rules keyed by the ids of the two tokens they join: one flat
// open-addressing table, so a lookup is a multiply and usually one cache line.
class MergeTable {
 public:
  struct Merge {
    int32_t rank = 0;
    int32_t result = 0;  // id of the joined token
  };

  void reserve(size_t n_merges);
  // The first rule for a pair wins (later duplicates are ignored, returning false).
  bool insert(int32_t left, int32_t right, Merge merge);
  const Merge* find(int32_t left, int32_t right) const;
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // ids are never negative
  struct Slot {
    uint64_t key = kEmpty;
    Merge merge;
  };
  static uint64_t key_of(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  size_t slot_of(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ULL) >> shift_; }
  void rehash(size_t capacity);

  std::vector<Slot> slots_;
  size_t size_ = 0;
  int shift_ = 64;
};

// Reusable buffers for one encode call (not shared between threads).
struct BpeWork {
  struct RankCandidate {
    int32_t rank, left, right, left_id, right_id, result;
  };
  struct ScoreCandidate {
    float score;
    int32_t left, right, size, id;
  };
  struct Symbol {
    uint32_t begin, size;
    int32_t prev, next, id;
  };
  std::vector<int32_t> prev, next;
  std::vector<RankCandidate> rank_heap;
  std::vector<ScoreCandidate> score_heap;
  std::vector<Symbol> symbols;
};

class RankBpe {
 public:
  void reserve(size_t n_merges) { merges_.reserve(n_merges); }
  // Ranks follow the order of the calls. Returns false for a duplicate pair.
  bool add_merge(int32_t left, int32_t right, int32_t result);
  size_t n_merges() const { return merges_.size(); }

  // Replaces the token ids in `symbols` by their merged form: repeatedly the
  // adjacent pair with the lowest rank, the leftmost among equals.
  void apply(std::vector<int32_t>& symbols, BpeWork& work) const;

 private:
  MergeTable merges_;
  int32_t n_added_ = 0;
};

class ScoreBpe {
 public:
  // A piece merges may produce; only normal (and user-defined) tokens are
  // given, so text can never turn into a control or byte token.
  void add_piece(std::string_view text, int32_t id, float score);

  // Splits text into characters, joins the adjacent pair whose concatenation
  // is the piece with the highest score (leftmost among equals) until no pair
  // is a piece, then appends the ids. A character that is not a piece becomes
  // its byte tokens (byte_ids[b], when all exist), else unk_id (if >= 0).
  void encode(std::string_view text, const std::array<int32_t, 256>& byte_ids, int32_t unk_id,
              std::vector<int32_t>& out, BpeWork& work) const;

 private:
  struct Piece {
    int32_t id;
    float score;
  };
  std::unordered_map<std::string, Piece, StringHash, std::equal_to<>> pieces_;
};

}  // namespace llm::weights
