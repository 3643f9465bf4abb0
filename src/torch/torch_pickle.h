// The restricted unpickler behind TorchCheckpoint (private).
//
// It decodes the pickle opcodes that state dicts use (protocols 2 to 5) into a
// small value tree, resolves only the globals PyTorch's weights-only
// unpickler allows, and never executes anything: "calling" an allowed
// rebuild function builds a tensor record. Memory is bounded by the input
// (every value comes from at least one opcode byte) plus fixed caps on the
// memo, the mark stack and the nesting depth of the result.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "weightlift/dtype.h"
#include "weightlift/status.h"
#include "weightlift/tensor.h"

namespace wl::pickle {

enum class Kind : uint8_t {
  kNone,
  kBool,
  kInt,
  kFloat,
  kStr,
  kBytes,
  kTuple,
  kList,
  kDict,
  kSet,
  kGlobal,   // an allowed class or function
  kStorage,  // a persistent_load result
  kTensor,
  kDtype,
  kOther,  // an allowed, inert value (layout, device, OrderedDict state)
};

enum class Global : uint8_t {
  kOrderedDict,
  kSize,
  kParameter,
  kTensorClass,
  kStorageClass,
  kGetLayout,
  kDevice,
  kCodecsEncode,
  kRebuildTensor,
  kRebuildTensorV2,
  kRebuildParameter,
  kRebuildParameterWithState,
  kRebuildFromTypeV2,
  kRebuildUnsupported,  // allowed by PyTorch but not supported here (sparse, quantized, meta, nested)
};

struct Value {
  Kind kind = Kind::kNone;
  bool ordered = false;        // kDict: an OrderedDict
  Global global{};             // kGlobal
  std::optional<DType> dtype;  // kGlobal storage class / kDtype
  int64_t i = 0;               // kInt, kBool, kStorage/kTensor index
  double f = 0;
  std::string s;              // kStr, kBytes, kGlobal full name
  std::vector<Value*> items;  // kTuple, kList, kSet; kDict: key, value, key, value...
  std::unordered_map<std::string, size_t>* str_index = nullptr;  // kDict: str key -> position in items
};

struct TensorRec {
  size_t storage = 0;
  uint64_t offset = 0;
  Shape sizes;
  std::vector<int64_t> strides;
  bool requires_grad = false;
  bool is_parameter = false;
};

// persistent_load(('storage', storage class, key, location, numel[, view metadata])):
// returns the index of the storage record. dtype is nullopt for an untyped storage.
struct StorageRequest {
  std::string key;
  std::optional<DType> dtype;
  std::string storage_class;
  uint64_t numel = 0;
  // Legacy view metadata: (view_key, offset, size).
  bool has_view = false;
  std::string view_key;
  uint64_t view_offset = 0;
  uint64_t view_size = 0;
};
using PersistentLoad = std::function<Result<size_t>(const StorageRequest&)>;

class Unpickler {
 public:
  // `file` names errors; `persistent_load` may be empty (a pickle without storages).
  Unpickler(std::string_view file, PersistentLoad persistent_load)
      : file_(file), persistent_load_(std::move(persistent_load)) {}
  Unpickler(const Unpickler&) = delete;
  ~Unpickler();

  // Decodes one pickle from the start of `data` up to its STOP opcode. The
  // returned value lives as long as this Unpickler. *consumed gets the bytes used.
  Result<Value*> load(std::string_view data, size_t* consumed = nullptr);

  const std::vector<TensorRec>& tensors() const { return tensors_; }

 private:
  struct Machine;  // one load(): its stack, marks and memo, and a handler per opcode

  Value* make(Kind k);
  Status error(std::string what) const;
  Result<Value*> call(Value* func, Value* args);
  Result<Value*> rebuild_tensor(Value* args, bool v2);
  Result<Value*> find_global(std::string_view module, std::string_view name);
  Result<Value*> load_persistent(Value* pid);

  std::string file_;
  PersistentLoad persistent_load_;
  std::deque<Value> arena_;
  std::deque<std::unordered_map<std::string, size_t>> indexes_;
  std::vector<TensorRec> tensors_;
  size_t pos_ = 0;  // opcode offset, for messages
};

// Flattens the tensors of a loaded object into (name, tensor index) pairs, in
// pickle order: dict keys (nested dicts/lists joined with "."). Non-tensor
// values are skipped. Fails on nesting deeper than 64 levels.
Status flatten_tensors(const Value* root, std::vector<std::pair<std::string, size_t>>* out, std::string_view file);

}  // namespace wl::pickle
