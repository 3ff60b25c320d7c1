#include "weights/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace llm::weights {

namespace {

constexpr uint64_t k_max_header_bytes = 100u << 20;  // the format's own limit

[[noreturn]] void fail(const std::filesystem::path& p, const std::string& what) {
  throw std::runtime_error(p.string() + ": invalid safetensors file: " + what);
}

std::optional<DType> dtype_from_safetensors(std::string_view s) {
  if (s == "F32") return DType::f32;
  if (s == "F16") return DType::f16;
  if (s == "BF16") return DType::bf16;
  return std::nullopt;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : file_(path) {
  if (file_.size() < 8) fail(path, "shorter than its 8-byte header length");
  uint64_t header_len;
  std::memcpy(&header_len, file_.data(), 8);
  if (header_len > k_max_header_bytes) fail(path, "header length " + std::to_string(header_len) + " is too large");
  if (header_len > file_.size() - 8) fail(path, "header length " + std::to_string(header_len) + " exceeds the file (truncated?)");

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(reinterpret_cast<const char*>(file_.data()) + 8,
                                   reinterpret_cast<const char*>(file_.data()) + 8 + header_len);
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) fail(path, "header is not a JSON object");

  const std::byte* data = file_.data() + 8 + header_len;
  const uint64_t data_size = file_.size() - 8 - header_len;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(path, "__metadata__ is not an object");
      for (const auto& [k, v] : entry.items()) {
        if (v.is_string()) metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!entry.is_object()) fail(path, where + " is not an object");
    const auto dt = entry.find("dtype");
    const auto sh = entry.find("shape");
    const auto off = entry.find("data_offsets");
    if (dt == entry.end() || !dt->is_string()) fail(path, where + " has no dtype");
    if (sh == entry.end() || !sh->is_array()) fail(path, where + " has no shape");
    if (off == entry.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned()) {
      fail(path, where + " has no valid data_offsets");
    }
    const auto dtype = dtype_from_safetensors(dt->get<std::string>());
    if (!dtype) fail(path, where + " has dtype " + dt->get<std::string>() + ", which is not supported (F32, F16, BF16)");

    TensorView t;
    t.name = name;
    t.dtype = *dtype;
    uint64_t n_elements = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned()) fail(path, where + " has a non-integer dimension");
      const uint64_t v = d.get<uint64_t>();
      if (v != 0 && n_elements > (uint64_t{1} << 50) / v) fail(path, where + " is absurdly large");
      n_elements *= v;
      t.shape.push_back(static_cast<int64_t>(v));
    }
    const uint64_t begin = (*off)[0].get<uint64_t>();
    const uint64_t end = (*off)[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      fail(path, where + " data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                     ") lie outside the data section of " + std::to_string(data_size) + " bytes (truncated?)");
    }
    const uint64_t expected = n_elements * dtype_info(*dtype).block_bytes;
    if (end - begin != expected) {
      fail(path, where + " occupies " + std::to_string(end - begin) + " bytes but " + dt->get<std::string>() + " " +
                     shape_string(t.shape) + " needs " + std::to_string(expected));
    }
    t.data = data + begin;
    t.n_bytes = static_cast<size_t>(expected);
    if (expected > 0) ranges.emplace_back(begin, end);
    tensors_.push_back(std::move(t));
  }

  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      fail(path, "tensor data ranges overlap at byte " + std::to_string(ranges[i].first));
    }
  }
}

bool SafetensorsModel::present(const std::filesystem::path& dir) {
  return std::filesystem::is_regular_file(dir / "model.safetensors") ||
         std::filesystem::is_regular_file(dir / "model.safetensors.index.json");
}

SafetensorsModel::SafetensorsModel(const std::filesystem::path& dir) {
  const auto index_path = dir / "model.safetensors.index.json";
  if (std::filesystem::is_regular_file(index_path)) {
    nlohmann::json index;
    try {
      std::ifstream in(index_path);
      index = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(index_path.string() + ": not valid JSON: " + e.what());
    }
    const auto wm = index.find("weight_map");
    if (wm == index.end() || !wm->is_object()) throw std::runtime_error(index_path.string() + ": no weight_map object");
    // Open each shard once, in a stable order.
    std::map<std::string, SafetensorsFile*> shards;
    for (const auto& [tensor, shard] : wm->items()) {
      if (!shard.is_string()) throw std::runtime_error(index_path.string() + ": weight_map entry '" + tensor + "' is not a file name");
      const std::string file = shard.get<std::string>();
      if (file.find('/') != std::string::npos || file == "..") {
        throw std::runtime_error(index_path.string() + ": shard name '" + file + "' must be a plain file name");
      }
      if (!shards.count(file)) {
        files_.push_back(std::make_unique<SafetensorsFile>(dir / file));
        shards[file] = files_.back().get();
      }
    }
    for (const auto& file : files_) {
      for (const TensorView& t : file->tensors()) {
        if (!by_name_.emplace(t.name, &t).second) {
          throw std::runtime_error(file->path().string() + ": tensor '" + t.name + "' appears in two shards");
        }
      }
    }
    for (const auto& [tensor, shard] : wm->items()) {
      const TensorView* t = find(tensor);
      if (t == nullptr) {
        throw std::runtime_error(index_path.string() + ": tensor '" + tensor + "' is listed in shard '" +
                                 shard.get<std::string>() + "' but that file does not contain it");
      }
    }
  } else {
    files_.push_back(std::make_unique<SafetensorsFile>(dir / "model.safetensors"));
    for (const TensorView& t : files_.back()->tensors()) by_name_.emplace(t.name, &t);
  }
}

const TensorView* SafetensorsModel::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

}  // namespace llm::weights
