#include "weightlift/convert.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "weightlift/safetensors.h"
#include "weightlift/torch.h"
#include "weightlift/weight_files.h"

namespace wl {
namespace {

namespace fs = std::filesystem;

struct Converted {
  std::vector<std::pair<std::string, uint64_t>> names;  // written names and their byte sizes
};

Result<Converted> convert_one(const std::string& input, const std::string& output, const ConvertOptions& o, Env* env,
                              ConvertResult* res) {
  WL_ASSIGN_OR_RETURN(auto ck, TorchCheckpoint::open(input, env, {.unwrap_state_dict = true}));
  const auto& infos = ck->tensors();
  const auto& strided = ck->strided();
  // Tied weights: the same storage and the same first byte (the reference's data_ptr()).
  std::set<std::pair<std::string, uint64_t>> seen;
  std::vector<NamedTensor> named;
  std::vector<size_t> source;
  for (size_t i = 0; i < infos.size(); ++i) {
    const TorchTensor& t = strided[i];
    const TorchStorage& s = ck->storages()[t.storage];
    if (infos[i].nbytes > 0 &&
        !seen.emplace(s.key, s.file_offset + t.storage_offset * static_cast<uint64_t>(dtype_size(t.dtype))).second) {
      res->dropped.push_back(t.name);
      continue;
    }
    if (!dtype_in_safetensors(t.dtype))
      return Status::Unimplemented(fmt::format("dtype {} cannot be stored in safetensors", dtype_name(t.dtype)))
          .with_file(input)
          .with_tensor(t.name);
    WL_ASSIGN_OR_RETURN(TensorView v, ck->view(i));
    named.push_back({t.name, std::move(v)});
    source.push_back(i);
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  WL_ASSIGN_OR_RETURN(auto plan, plan_safetensors(named, metadata), .file = input);
  const uint64_t in_size = ck->file_->size();
  if (in_size > 0 && static_cast<double>(plan.total_size) > static_cast<double>(in_size) * (1.0 + o.max_size_growth))
    return Status::Internal(fmt::format("the safetensors output would be {} bytes, more than {:.0f}% above the input's "
                                        "{} bytes; refusing to write it",
                                        plan.total_size, o.max_size_growth * 100, in_size))
        .with_file(input);
  if (Status s = env->create_dirs(parent_dir(output)); !s.ok())
    return Status(s.code(), "cannot create folder " + parent_dir(output) + ": " + s.message()).with_file(output);
  WL_ASSIGN_OR_RETURN(AtomicFile out, AtomicFile::create(output, 0644, env));
  WL_RETURN_IF_ERROR(out.append(plan.prefix));
  for (size_t idx : plan.order) WL_RETURN_IF_ERROR(out.append(named[idx].view.bytes()));
  if (o.verify) {
    // Read the temporary file back (its header through the safetensors parser, its data with
    // large preads) and compare every tensor byte for byte with what was meant to be written.
    auto fail = [&](std::string what) { return Status::Internal("read-back verification: " + what).with_file(output); };
    auto back = env->open(out.temp_path(), {.mode = FileMode::kPread});
    if (!back.ok()) return fail(back.status().to_string());
    auto header = read_safetensors_header(**back);
    if (!header.ok()) return fail(header.status().to_string());
    if (header->tensors.size() != named.size())
      return fail(fmt::format("found {} tensors, wrote {}", header->tensors.size(), named.size()));
    std::unordered_map<std::string_view, const NamedTensor*> by_name;
    for (auto& n : named) by_name.emplace(n.name, &n);
    constexpr size_t kChunk = size_t{16} << 20;
    std::vector<std::byte> buf(kChunk);
    for (const TensorInfo& ti : header->tensors) {
      auto it = by_name.find(ti.name);
      if (it == by_name.end()) return fail(fmt::format("unexpected tensor '{}'", ti.name));
      const TensorView& want = it->second->view;
      if (ti.dtype != want.dtype() || ti.shape != want.shape() || ti.nbytes != want.nbytes())
        return Status::Internal("read-back verification: dtype, shape or size differs")
            .with_file(output)
            .with_tensor(ti.name);
      for (uint64_t done = 0; done < ti.nbytes;) {
        size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, ti.nbytes - done));
        WL_RETURN_IF_ERROR((*back)->read_at(ti.offset + done, std::span(buf.data(), n)));
        if (std::memcmp(buf.data(), want.data() + done, n) != 0)
          return Status::Internal("read-back verification: the written bytes differ from the input")
              .with_file(output)
              .with_tensor(ti.name);
        done += n;
      }
    }
  }
  WL_RETURN_IF_ERROR(out.commit());
  res->outputs.push_back(output);
  res->tensors += named.size();
  res->input_bytes += in_size;
  res->output_bytes += plan.total_size;
  Converted c;
  for (auto& n : named) c.names.emplace_back(n.name, n.view.nbytes());
  return c;
}

}  // namespace

std::string safetensors_name_for(const std::string& name) {
  std::string base = name;
  auto dot = base.rfind('.');
  if (dot != std::string::npos) base.resize(dot);
  if (base.rfind("pytorch_model", 0) == 0) base = "model" + base.substr(std::string_view("pytorch_model").size());
  return base + ".safetensors";
}

Result<ConvertResult> convert_pytorch_to_safetensors(const std::string& input, const std::string& output,
                                                     const ConvertOptions& options, Env* env) {
  ConvertResult res;
  WL_ASSIGN_OR_RETURN(Converted c, convert_one(input, output, options, env, &res));
  (void)c;
  return res;
}

Result<ConvertResult> convert_pytorch_folder(const std::string& folder, const std::string& output_folder,
                                             const ConvertOptions& options, Env* env) {
  WL_ASSIGN_OR_RETURN(WeightFiles wf, find_weight_files(folder, env));
  if (wf.format != WeightFormat::kPytorch)
    return Status::InvalidArgument("the folder holds no PyTorch .bin/.pt weights to convert (safetensors already?)")
        .with_file(folder);
  ConvertResult res;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  std::map<std::string, std::string> owner;
  uint64_t total = 0;
  for (auto& f : wf.files) {
    std::string shard = safetensors_name_for(fs::path(f).filename().string());
    WL_ASSIGN_OR_RETURN(Converted c, convert_one(f, (fs::path(output_folder) / shard).string(), options, env, &res));
    for (auto& [name, nbytes] : c.names) {
      auto [it, fresh] = owner.emplace(name, shard);
      if (!fresh)
        return Status::Corrupt(fmt::format("tensor appears in two shards: {} and {}", it->second, shard))
            .with_file(f)
            .with_tensor(name);
      total += nbytes;
    }
  }
  for (auto& [name, shard] : owner) weight_map[name] = shard;
  nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  std::string index_path = (fs::path(output_folder) / kSafetensorsIndexName).string();
  WL_RETURN_IF_ERROR(write_file_atomic(index_path, index.dump(2) + "\n", env));
  res.outputs.push_back(index_path);
  return res;
}

}  // namespace wl
