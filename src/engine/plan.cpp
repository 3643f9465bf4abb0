#include "engine/plan.h"

#include <algorithm>

#include <fmt/format.h>

#include "weightlift/expert_filter.h"
#include "weightlift/hash.h"

namespace wl::engine {

namespace {

// Opens of one path insist on one version: a checkpoint reader that opens the
// file itself (any format) then reads the planned version or fails.
class PinnedVersionEnv final : public EnvWrapper {
 public:
  PinnedVersionEnv(Env* target, std::string path, std::string version)
      : EnvWrapper(target), path_(std::move(path)), version_(std::move(version)) {}
  Result<std::shared_ptr<RandomAccessFile>> open(const std::string& path, const OpenOptions& o) override {
    if (path != path_ || version_.empty()) return EnvWrapper::open(path, o);
    OpenOptions pinned = o;
    pinned.expect_version = version_;
    return EnvWrapper::open(path, pinned);
  }

 private:
  std::string path_, version_;
};

std::string header_digest(const CheckpointReader& r) {
  Sha256 h;
  h.update(r.format_name());
  for (const CheckpointTensor& t : r.tensors()) {
    h.update(fmt::format("\n{}\t{}\t{}\t{}\t{}", t.name, dtype_name(t.dtype), shape_to_string(t.shape), t.nbytes,
                         t.file_offset ? std::to_string(*t.file_offset) : std::string("-")));
  }
  return h.hex_digest();
}

// The bytes of `ct` this load reads into `t`: a row selection
// (LoadOptions::rows) or this rank's shard (a shard rule); else the whole tensor.
Status select_bytes(PlannedTensor& t, const CheckpointTensor& ct, const LoadOptions& o, const std::string& file) {
  const ShardRule* rule = o.tp_size > 1 || !o.shard_rules.empty() ? find_shard_rule(o.shard_rules, ct.name) : nullptr;
  const auto rows = o.rows.find(ct.name);
  if (rows == o.rows.end() && !rule) return Status();
  Result<ShardLayout> l = Status::Internal("no layout");
  if (rows == o.rows.end()) {
    l = shard_layout(ct.dtype, ct.shape, rule->dim, o.tp_rank, o.tp_size);
  } else if (rule) {
    l = Status::InvalidArgument(
        fmt::format("a row selection and the shard rule '{}:{}' both apply", rule->pattern, rule->dim));
  } else if (ct.shape.empty()) {
    l = Status::InvalidArgument("a row selection of a 0-d tensor");
  } else {
    l = slice_layout(ct.dtype, ct.shape, 0, rows->second.begin, rows->second.end - rows->second.begin);
  }
  if (!l.ok()) return std::move(l).status().with_tensor(ct.name).with_file(file);
  t.shape = l->shape;
  t.nbytes = l->nbytes;
  t.shard = std::move(*l);
  return Status();
}

}  // namespace

Result<Plan> make_plan(const std::vector<std::string>& files, const LoadOptions& o) {
  Plan plan;
  uint64_t next_ordinal = 0;
  for (size_t fi = 0; fi < files.size(); ++fi) {
    PlanFile pf;
    pf.path = files[fi];
    WL_ASSIGN_OR_RETURN(pf.reader, open_checkpoint(files[fi], o.env));
    pf.version = pf.reader->version();
    const auto& ts = pf.reader->tensors();
    pf.digest = header_digest(*pf.reader);
    for (size_t i = 0; i < ts.size(); ++i) {
      const CheckpointTensor& ct = ts[i];
      if (should_skip_weight(ct.name, o.local_experts)) {
        plan.skipped++;
        continue;
      }
      if (o.select && !o.select(ct.name)) continue;
      PlannedTensor t;
      static_cast<TensorMeta&>(t) = ct;  // whole, until a shard rule says otherwise
      t.file = fi;
      t.index = i;
      t.full_shape = ct.shape;
      t.full_nbytes = ct.nbytes;
      t.file_offset = ct.file_offset;
      WL_RETURN_IF_ERROR(select_bytes(t, ct, o, files[fi]));
      plan.bytes_total += t.nbytes;
      pf.tensors.push_back(plan.tensors.size());
      plan.tensors.push_back(std::move(t));
    }
    switch (o.order) {
      case LoadOptions::Order::kOffset:
        std::stable_sort(pf.tensors.begin(), pf.tensors.end(), [&](size_t a, size_t b) {
          return plan.tensors[a].file_offset.value_or(0) < plan.tensors[b].file_offset.value_or(0);
        });
        break;
      case LoadOptions::Order::kName:
        std::stable_sort(pf.tensors.begin(), pf.tensors.end(),
                         [&](size_t a, size_t b) { return plan.tensors[a].name < plan.tensors[b].name; });
        break;
      case LoadOptions::Order::kListed: break;  // already in the reader's order
    }
    for (size_t k : pf.tensors) plan.tensors[k].ordinal = next_ordinal++;
    if (fi >= kKeepOpen) pf.reader.reset();
    plan.files.push_back(std::move(pf));
  }
  return plan;
}

Result<CheckpointReader*> reader_of(const PlanFile& pf, Env* env) {
  if (!pf.reader) {
    PinnedVersionEnv pinned(env, pf.path, pf.version);
    WL_ASSIGN_OR_RETURN(pf.reader, open_checkpoint(pf.path, &pinned));
  }
  return pf.reader.get();
}

Result<std::shared_ptr<RandomAccessFile>> open_data(const PlanFile& pf, Env* env, FileMode mode) {
  return env->open(pf.path, {.mode = mode, .expect_version = pf.version});
}

}  // namespace wl::engine
