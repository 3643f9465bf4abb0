#include "weightlift/synth.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "weightlift/io.h"
#include "weightlift/safetensors.h"
#include "weightlift/tensor.h"

namespace wl {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// BF16 values in roughly [-0.03, 0.03], like trained projection weights.
void fill_bf16(std::byte* out, uint64_t n, uint64_t seed) {
  auto* p = reinterpret_cast<uint16_t*>(out);
  for (uint64_t i = 0; i < n; i += 4) {
    uint64_t r = splitmix64(seed + i);
    for (uint64_t k = 0; k < 4 && i + k < n; ++k) {
      uint16_t bits = static_cast<uint16_t>(r >> (16 * k));
      // sign | exponent in [117, 121] (~2^-10 .. 2^-6) | 7 random mantissa bits
      uint16_t sign = bits & 0x8000;
      uint16_t exp = static_cast<uint16_t>(117 + ((bits >> 7) % 5));
      p[i + k] = static_cast<uint16_t>(sign | (exp << 7) | (bits & 0x7F));
    }
  }
}

void fill_f32_norm(std::byte* out, uint64_t n, uint64_t seed) {
  for (uint64_t i = 0; i < n; ++i) {
    float v = 1.0f + static_cast<float>(static_cast<int64_t>(splitmix64(seed + i) % 2001) - 1000) * 1e-4f;
    std::memcpy(out + 4 * i, &v, 4);
  }
}

struct Spec {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t nbytes() const { return shape_numel(shape) * static_cast<uint64_t>(dtype_size(dtype)); }
};

}  // namespace

Result<uint64_t> parse_size(std::string_view text) {
  std::string t;
  for (char c : text) t += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (t == "TINY") return uint64_t{4} << 20;
  if (t == "SMALL") return uint64_t{64} << 20;
  if (t == "MEDIUM") return uint64_t{512} << 20;
  size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) ++i;
  if (i == 0) return Status::InvalidArgument(fmt::format("invalid size '{}'", text));
  double v = 0;
  try {
    v = std::stod(t.substr(0, i));
  } catch (...) {
    return Status::InvalidArgument(fmt::format("invalid size '{}'", text));
  }
  std::string unit = t.substr(i);
  double mul = 1;
  if (unit.empty() || unit == "B")
    mul = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB")
    mul = 1024.0;
  else if (unit == "M" || unit == "MB" || unit == "MIB")
    mul = 1024.0 * 1024;
  else if (unit == "G" || unit == "GB" || unit == "GIB")
    mul = 1024.0 * 1024 * 1024;
  else
    return Status::InvalidArgument(fmt::format("invalid size unit in '{}'", text));
  double bytes = v * mul;
  if (!(bytes >= 1024) || bytes > 1e13)
    return Status::InvalidArgument(fmt::format("size '{}' out of range (1 KiB .. 10 TB)", text));
  return static_cast<uint64_t>(bytes);
}

Result<SynthResult> synth_model(const std::string& dir, const SynthOptions& o) {
  // Pick a width that suits the size, then as many layers as fit.
  struct Dims {
    int hidden, inter, heads, kv, vocab;
  };
  const Dims table[] = {{64, 176, 4, 2, 1024},      {256, 688, 8, 4, 4096},     {512, 1376, 8, 4, 8192},
                        {1024, 2816, 16, 8, 16000}, {2048, 5632, 16, 8, 32000}, {4096, 11008, 32, 8, 32000}};
  Dims d = table[0];
  for (const auto& c : table) {
    uint64_t per_layer = uint64_t(2) * (2ull * c.hidden * c.hidden + 2ull * c.hidden * (c.hidden / c.heads * c.kv) +
                                        3ull * c.hidden * c.inter);
    uint64_t embed = uint64_t(2) * 2 * c.vocab * c.hidden;
    if (embed + 4 * per_layer <= o.target_bytes) d = c;
  }
  const int head_dim = d.hidden / d.heads;
  const int kv_dim = head_dim * d.kv;
  std::vector<Spec> specs;
  specs.push_back({"model.embed_tokens.weight", DType::BF16, {d.vocab, d.hidden}});
  uint64_t fixed = 2ull * 2 * d.vocab * d.hidden + 4ull * d.hidden;
  uint64_t per_layer =
      2ull * (2ull * d.hidden * d.hidden + 2ull * d.hidden * kv_dim + 3ull * d.hidden * d.inter) + 2 * 4ull * d.hidden;
  int layers = static_cast<int>(std::max<int64_t>(
      1, (static_cast<int64_t>(o.target_bytes) - static_cast<int64_t>(fixed)) / static_cast<int64_t>(per_layer)));
  for (int l = 0; l < layers; ++l) {
    std::string p = fmt::format("model.layers.{}.", l);
    specs.push_back({p + "input_layernorm.weight", DType::F32, {d.hidden}});
    specs.push_back({p + "self_attn.q_proj.weight", DType::BF16, {d.hidden, d.hidden}});
    specs.push_back({p + "self_attn.k_proj.weight", DType::BF16, {kv_dim, d.hidden}});
    specs.push_back({p + "self_attn.v_proj.weight", DType::BF16, {kv_dim, d.hidden}});
    specs.push_back({p + "self_attn.o_proj.weight", DType::BF16, {d.hidden, d.hidden}});
    specs.push_back({p + "post_attention_layernorm.weight", DType::F32, {d.hidden}});
    specs.push_back({p + "mlp.gate_proj.weight", DType::BF16, {d.inter, d.hidden}});
    specs.push_back({p + "mlp.up_proj.weight", DType::BF16, {d.inter, d.hidden}});
    specs.push_back({p + "mlp.down_proj.weight", DType::BF16, {d.hidden, d.inter}});
  }
  specs.push_back({"model.norm.weight", DType::F32, {d.hidden}});
  specs.push_back({"lm_head.weight", DType::BF16, {d.vocab, d.hidden}});

  uint64_t total = 0;
  for (auto& s : specs) total += s.nbytes();
  // Shards as transformers makes them: fill in order up to a size limit.
  const int min_shards = std::max(1, o.min_shards);
  uint64_t n_shards = std::max<uint64_t>(min_shards, (total + (uint64_t{2} << 30) - 1) / (uint64_t{2} << 30));
  uint64_t limit = (total + n_shards - 1) / n_shards;
  std::vector<std::vector<size_t>> shards(1);
  uint64_t cur = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (cur > 0 && cur + specs[i].nbytes() > limit) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(i);
    cur += specs[i].nbytes();
  }
  WL_RETURN_IF_ERROR(Env::Default()->create_dirs(dir));

  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  Buffer scratch;
  for (size_t s = 0; s < shards.size(); ++s) {
    std::string fname = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    std::vector<NamedTensor> planned;
    for (size_t i : shards[s]) {
      // Planning needs names, dtypes, shapes and sizes only.
      planned.push_back(
          {specs[i].name,
           TensorView(specs[i].dtype, specs[i].shape,
                      std::span<const std::byte>(static_cast<const std::byte*>(nullptr), specs[i].nbytes()), nullptr)});
      weight_map[specs[i].name] = fname;
    }
    WL_ASSIGN_OR_RETURN(SafetensorsLayout L, plan_safetensors(planned, {{"format", "pt"}}));
    std::string path = dir + "/" + fname;
    WL_ASSIGN_OR_RETURN(AtomicFile out, AtomicFile::create(path));
    WL_RETURN_IF_ERROR(out.append(L.prefix));
    for (size_t k : L.order) {
      const Spec& sp = specs[shards[s][k]];
      uint64_t nb = sp.nbytes();
      if (scratch.size() < nb) {
        WL_ASSIGN_OR_RETURN(scratch, Buffer::allocate(nb));
      }
      uint64_t seed = splitmix64(o.seed ^ fnv1a(sp.name));
      if (sp.dtype == DType::BF16)
        fill_bf16(scratch.data(), nb / 2, seed);
      else
        fill_f32_norm(scratch.data(), nb / 4, seed);
      WL_RETURN_IF_ERROR(out.append(std::span<const std::byte>(scratch.data(), nb)));
    }
    WL_RETURN_IF_ERROR(out.commit());
  }
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = weight_map;
  WL_RETURN_IF_ERROR(write_file_atomic(dir + "/model.safetensors.index.json", index.dump(2) + "\n"));

  nlohmann::ordered_json config = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_size", d.hidden},
      {"intermediate_size", d.inter},
      {"num_hidden_layers", layers},
      {"num_attention_heads", d.heads},
      {"num_key_value_heads", d.kv},
      {"vocab_size", d.vocab},
      {"max_position_embeddings", 4096},
      {"rms_norm_eps", 1e-5},
      {"rope_theta", 10000.0},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", false},
      {"torch_dtype", "bfloat16"},
  };
  WL_RETURN_IF_ERROR(write_file_atomic(dir + "/config.json", config.dump(2) + "\n"));

  SynthResult r;
  r.tensors = specs.size();
  r.bytes = total;
  r.shards = static_cast<int>(shards.size());
  r.layers = layers;
  r.hidden = d.hidden;
  return r;
}

}  // namespace wl
