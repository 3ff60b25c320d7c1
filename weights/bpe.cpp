#include "weights/bpe.h"

#include <algorithm>
#include <bit>

#include "weights/pretokenize.h"

namespace llm::weights {

// ---- TokenIndex ----------------------------------------------------------------

void TokenIndex::reserve(size_t n_tokens, const std::vector<std::string>& texts) {
  const size_t want = std::bit_ceil(std::max<size_t>(16, n_tokens + n_tokens / 3 + 1));
  if (want > slots_.size()) rehash(want, texts);
}

void TokenIndex::rehash(size_t capacity, const std::vector<std::string>& texts) {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity, Slot{});
  shift_ = 64 - std::countr_zero(capacity);
  for (const Slot& s : old) {
    if (s.id < 0) continue;
    size_t i = start_of(StringHash{}(texts[s.id]));
    while (slots_[i].id >= 0) i = (i + 1) & (slots_.size() - 1);
    slots_[i] = s;
  }
}

void TokenIndex::insert(int32_t id, const std::vector<std::string>& texts, bool replace) {
  if ((size_ + 1) * 4 > slots_.size() * 3) reserve(std::max<size_t>(size_ * 2, 16), texts);
  const std::string& text = texts[id];
  const size_t hash = StringHash{}(text);
  const auto tag = static_cast<uint32_t>(hash);
  size_t i = start_of(hash);
  for (; slots_[i].id >= 0; i = (i + 1) & (slots_.size() - 1)) {
    if (slots_[i].tag == tag && texts[slots_[i].id] == text) {
      if (replace) slots_[i].id = id;
      return;
    }
  }
  slots_[i] = {tag, id};
  ++size_;
}

int32_t TokenIndex::find(std::string_view text, const std::vector<std::string>& texts) const {
  if (slots_.empty()) return -1;
  const size_t hash = StringHash{}(text);
  const auto tag = static_cast<uint32_t>(hash);
  for (size_t i = start_of(hash);; i = (i + 1) & (slots_.size() - 1)) {
    const Slot& s = slots_[i];
    if (s.id < 0) return -1;
    if (s.tag == tag && texts[s.id] == text) return s.id;
  }
}

// ---- MergeTable ----------------------------------------------------------------

void MergeTable::reserve(size_t n_merges) {
  // Keep the load factor under 3/4 so linear probes stay short.
  const size_t want = std::bit_ceil(std::max<size_t>(16, n_merges + n_merges / 3 + 1));
  if (want > slots_.size()) rehash(want);
}

void MergeTable::rehash(size_t capacity) {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity, Slot{});
  shift_ = 64 - std::countr_zero(capacity);
  for (const Slot& s : old) {
    if (s.key == kEmpty) continue;
    size_t i = slot_of(s.key);
    while (slots_[i].key != kEmpty) i = (i + 1) & (slots_.size() - 1);
    slots_[i] = s;
  }
}

bool MergeTable::insert(int32_t left, int32_t right, Merge merge) {
  if ((size_ + 1) * 4 > slots_.size() * 3) reserve(std::max<size_t>(size_ * 2, 16));
  const uint64_t key = key_of(left, right);
  size_t i = slot_of(key);
  while (slots_[i].key != kEmpty) {
    if (slots_[i].key == key) return false;
    i = (i + 1) & (slots_.size() - 1);
  }
  slots_[i] = {key, merge};
  ++size_;
  return true;
}

const MergeTable::Merge* MergeTable::find(int32_t left, int32_t right) const {
  if (slots_.empty()) return nullptr;
  const uint64_t key = key_of(left, right);
  for (size_t i = slot_of(key);; i = (i + 1) & (slots_.size() - 1)) {
    if (slots_[i].key == key) return &slots_[i].merge;
    if (slots_[i].key == kEmpty) return nullptr;
  }
}

// ---- RankBpe -------------------------------------------------------------------

bool RankBpe::add_merge(int32_t left, int32_t right, int32_t result) {
  if (!merges_.insert(left, right, {n_added_, result})) return false;
  ++n_added_;
  return true;
}

void RankBpe::apply(std::vector<int32_t>& symbols, BpeWork& work) const {
  const auto n = static_cast<int32_t>(symbols.size());
  if (n < 2 || merges_.size() == 0) return;

  auto& prev = work.prev;
  auto& next = work.next;
  auto& heap = work.rank_heap;
  prev.resize(n);
  next.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1;  // n marks the end
  }
  // A min-heap on (rank, left position): std::*_heap build max-heaps, so the
  // comparison is reversed.
  const auto later = [](const BpeWork::RankCandidate& a, const BpeWork::RankCandidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  };
  heap.clear();
  const auto consider = [&](int32_t left, int32_t right) {
    if (const MergeTable::Merge* m = merges_.find(symbols[left], symbols[right])) {
      heap.push_back({m->rank, left, right, symbols[left], symbols[right], m->result});
      return true;
    }
    return false;
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i, i + 1);
  std::make_heap(heap.begin(), heap.end(), later);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const BpeWork::RankCandidate c = heap.back();
    heap.pop_back();
    // Stale if either side has merged since the candidate was queued: ids
    // only ever grow into longer tokens, so an id match means untouched.
    if (symbols[c.left] != c.left_id || next[c.left] != c.right || symbols[c.right] != c.right_id) {
      continue;
    }
    symbols[c.left] = c.result;
    symbols[c.right] = -1;
    next[c.left] = next[c.right];
    if (next[c.left] < n) prev[next[c.left]] = c.left;
    if (prev[c.left] >= 0 && consider(prev[c.left], c.left)) {
      std::push_heap(heap.begin(), heap.end(), later);
    }
    if (next[c.left] < n && consider(c.left, next[c.left])) {
      std::push_heap(heap.begin(), heap.end(), later);
    }
  }
  std::erase(symbols, -1);
}

// ---- ScoreBpe ------------------------------------------------------------------

void ScoreBpe::add_piece(std::string_view text, int32_t id, float score) {
  pieces_.try_emplace(std::string(text), Piece{id, score});
}

void ScoreBpe::encode(std::string_view text, const std::array<int32_t, 256>& byte_ids,
                      int32_t unk_id, std::vector<int32_t>& out, BpeWork& work) const {
  if (text.empty()) return;
  auto& syms = work.symbols;
  auto& heap = work.score_heap;
  syms.clear();
  heap.clear();

  const auto lookup = [&](size_t begin, size_t size) -> const Piece* {
    const auto it = pieces_.find(text.substr(begin, size));
    return it == pieces_.end() ? nullptr : &it->second;
  };
  for (size_t pos = 0; pos < text.size();) {
    const size_t len = std::min(utf8_lead_length(static_cast<unsigned char>(text[pos])), text.size() - pos);
    const Piece* p = lookup(pos, len);
    const auto index = static_cast<int32_t>(syms.size());
    syms.push_back({static_cast<uint32_t>(pos), static_cast<uint32_t>(len), index - 1, index + 1,
                    p != nullptr ? p->id : -1});
    pos += len;
  }
  const auto n = static_cast<int32_t>(syms.size());
  syms.back().next = -1;

  // Highest score first, then the leftmost (a max-heap, as std::*_heap build).
  const auto lower = [](const BpeWork::ScoreCandidate& a, const BpeWork::ScoreCandidate& b) {
    return a.score != b.score ? a.score < b.score : a.left > b.left;
  };
  const auto consider = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return false;
    const uint32_t size = syms[left].size + syms[right].size;
    const Piece* p = lookup(syms[left].begin, size);
    if (p == nullptr) return false;
    heap.push_back({p->score, left, right, static_cast<int32_t>(size), p->id});
    return true;
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i, i + 1);
  std::make_heap(heap.begin(), heap.end(), lower);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), lower);
    const BpeWork::ScoreCandidate c = heap.back();
    heap.pop_back();
    auto& l = syms[c.left];
    auto& r = syms[c.right];
    // Stale if either side has been merged since the pair was queued.
    if (l.size == 0 || r.size == 0 || static_cast<int32_t>(l.size + r.size) != c.size) continue;
    l.size += r.size;
    l.id = c.id;
    r.size = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    if (consider(l.prev, c.left)) std::push_heap(heap.begin(), heap.end(), lower);
    if (consider(c.left, l.next)) std::push_heap(heap.begin(), heap.end(), lower);
  }

  for (int32_t i = 0; i >= 0; i = syms[i].next) {
    const auto& s = syms[i];
    if (s.id >= 0) {
      out.push_back(s.id);
      continue;
    }
    // Only single characters lack an id: every merge produced a piece.
    const std::string_view chars = text.substr(s.begin, s.size);
    const bool all_bytes = std::all_of(chars.begin(), chars.end(), [&](char b) {
      return byte_ids[static_cast<unsigned char>(b)] >= 0;
    });
    if (all_bytes) {
      for (char b : chars) out.push_back(byte_ids[static_cast<unsigned char>(b)]);
    } else if (unk_id >= 0) {
      out.push_back(unk_id);
    }
  }
}

}  // namespace llm::weights
