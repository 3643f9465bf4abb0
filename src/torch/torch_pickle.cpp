#include "torch/torch_pickle.h"

#include <cstring>

#include <fmt/format.h>

#include "util/checked.h"

namespace wl::pickle {
namespace {

constexpr size_t kMaxMarks = 100'000;
constexpr size_t kMaxMemo = 50'000'000;
constexpr int kMaxDepth = 64;
constexpr int kMaxDims = 64;

struct StorageClass {
  const char* name;
  std::optional<DType> dtype;
};
// torch.<Name>Storage -> element type. Untyped storages are bytes.
const StorageClass kStorageClasses[] = {
    {"DoubleStorage", DType::F64},
    {"FloatStorage", DType::F32},
    {"HalfStorage", DType::F16},
    {"BFloat16Storage", DType::BF16},
    {"LongStorage", DType::I64},
    {"IntStorage", DType::I32},
    {"ShortStorage", DType::I16},
    {"CharStorage", DType::I8},
    {"ByteStorage", DType::U8},
    {"BoolStorage", DType::BOOL},
    {"ComplexFloatStorage", DType::C64},
    {"ComplexDoubleStorage", DType::C128},
    {"ComplexHalfStorage", DType::C32},
    {"UInt16Storage", DType::U16},
    {"UInt32Storage", DType::U32},
    {"UInt64Storage", DType::U64},
    {"Float8_e5m2Storage", DType::F8_E5M2},
    {"Float8_e4m3fnStorage", DType::F8_E4M3},
    {"Float8_e5m2fnuzStorage", DType::F8_E5M2FNUZ},
    {"Float8_e4m3fnuzStorage", DType::F8_E4M3FNUZ},
    {"Float8_e8m0fnuStorage", DType::F8_E8M0},
    {"UntypedStorage", DType::U8},
};
const char* const kQuantStorages[] = {"QUInt8Storage", "QInt8Storage", "QInt32Storage", "QUInt4x2Storage",
                                      "QUInt2x4Storage"};

struct DtypeName {
  const char* name;
  DType dtype;
};
const DtypeName kDtypes[] = {
    {"float64", DType::F64},
    {"double", DType::F64},
    {"float32", DType::F32},
    {"float", DType::F32},
    {"float16", DType::F16},
    {"half", DType::F16},
    {"bfloat16", DType::BF16},
    {"int64", DType::I64},
    {"long", DType::I64},
    {"int32", DType::I32},
    {"int", DType::I32},
    {"int16", DType::I16},
    {"short", DType::I16},
    {"int8", DType::I8},
    {"uint8", DType::U8},
    {"bool", DType::BOOL},
    {"complex32", DType::C32},
    {"chalf", DType::C32},
    {"complex64", DType::C64},
    {"cfloat", DType::C64},
    {"complex128", DType::C128},
    {"cdouble", DType::C128},
    {"uint16", DType::U16},
    {"uint32", DType::U32},
    {"uint64", DType::U64},
    {"float8_e5m2", DType::F8_E5M2},
    {"float8_e4m3fn", DType::F8_E4M3},
    {"float8_e5m2fnuz", DType::F8_E5M2FNUZ},
    {"float8_e4m3fnuz", DType::F8_E4M3FNUZ},
    {"float8_e8m0fnu", DType::F8_E8M0},
};

const char* const kTensorClasses[] = {"DoubleTensor", "FloatTensor", "HalfTensor",         "BFloat16Tensor",
                                      "LongTensor",   "IntTensor",   "ShortTensor",        "CharTensor",
                                      "ByteTensor",   "BoolTensor",  "ComplexFloatTensor", "ComplexDoubleTensor"};

std::string kind_name(Kind k) {
  switch (k) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kStr: return "str";
    case Kind::kBytes: return "bytes";
    case Kind::kTuple: return "tuple";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kSet: return "set";
    case Kind::kGlobal: return "global";
    case Kind::kStorage: return "storage";
    case Kind::kTensor: return "tensor";
    case Kind::kDtype: return "dtype";
    case Kind::kOther: return "object";
  }
  return "?";
}

}  // namespace

Unpickler::~Unpickler() = default;

Value* Unpickler::make(Kind k) {
  arena_.emplace_back();
  arena_.back().kind = k;
  return &arena_.back();
}

Status Unpickler::error(std::string what) const {
  return Status::Corrupt(fmt::format("data.pkl: {} (at pickle byte {})", what, pos_)).with_file(file_);
}

Result<Value*> Unpickler::find_global(std::string_view module, std::string_view name) {
  std::string full = fmt::format("{}.{}", module, name);
  auto g = [&](Global which) {
    Value* v = make(Kind::kGlobal);
    v->global = which;
    v->s = full;
    return v;
  };
  if (full == "collections.OrderedDict") return g(Global::kOrderedDict);
  if (full == "torch.Size") return g(Global::kSize);
  if (full == "torch.nn.parameter.Parameter") return g(Global::kParameter);
  if (full == "torch.Tensor") return g(Global::kTensorClass);
  if (full == "torch.serialization._get_layout") return g(Global::kGetLayout);
  if (full == "torch.device") return g(Global::kDevice);
  if (full == "_codecs.encode") return g(Global::kCodecsEncode);
  if (full == "torch._utils._rebuild_tensor") return g(Global::kRebuildTensor);
  if (full == "torch._utils._rebuild_tensor_v2") return g(Global::kRebuildTensorV2);
  if (full == "torch._utils._rebuild_parameter") return g(Global::kRebuildParameter);
  if (full == "torch._utils._rebuild_parameter_with_state") return g(Global::kRebuildParameterWithState);
  if (full == "torch._tensor._rebuild_from_type_v2") return g(Global::kRebuildFromTypeV2);
  if (full == "torch._utils._rebuild_sparse_tensor" || full == "torch._utils._rebuild_meta_tensor_no_storage" ||
      full == "torch._utils._rebuild_sparse_csr_tensor" || full == "torch._utils._rebuild_qtensor" ||
      full == "torch._utils._rebuild_nested_tensor")
    return g(Global::kRebuildUnsupported);
  if (module == "torch" || module == "torch.storage" || module == "torch.cuda") {
    for (auto& sc : kStorageClasses) {
      if (name == sc.name && (module != "torch.storage" || name == "UntypedStorage")) {
        Value* v = g(Global::kStorageClass);
        v->dtype = sc.dtype;
        return v;
      }
    }
    if (module == "torch.storage" && name == "TypedStorage") return g(Global::kStorageClass);
    for (auto* q : kQuantStorages)
      if (name == q) return g(Global::kStorageClass);  // dtype unset: refused when used
    for (auto* t : kTensorClasses)
      if (name == t) return g(Global::kTensorClass);
  }
  if (module == "torch") {
    for (auto& d : kDtypes) {
      if (name == d.name) {
        Value* v = make(Kind::kDtype);
        v->dtype = d.dtype;
        v->s = full;
        return v;
      }
    }
  }
  return Status::PermissionDenied(
             fmt::format(
                 "data.pkl: refusing global '{}': it is not in PyTorch's weights-only allowlist (nothing was executed)",
                 full))
      .with_file(file_);
}

Result<Value*> Unpickler::load_persistent(Value* pid) {
  if (pid->kind != Kind::kTuple || pid->items.empty() || pid->items[0]->kind != Kind::kStr ||
      pid->items[0]->s != "storage")
    return error("persistent_load id is not a ('storage', ...) tuple; only storages may be loaded");
  auto& it = pid->items;
  if (it.size() != 5 && it.size() != 6)
    return error(fmt::format("storage id has {} fields, expected 5 or 6", it.size()));
  if (it[1]->kind != Kind::kGlobal || it[1]->global != Global::kStorageClass)
    return error("storage id does not name a storage class");
  if (!it[1]->dtype)
    return Status::Unimplemented(
               fmt::format("data.pkl: storage class '{}' (quantized or typed) is not supported", it[1]->s))
        .with_file(file_);
  if (it[2]->kind != Kind::kStr && it[2]->kind != Kind::kInt) return error("storage key is not a string");
  if (it[4]->kind != Kind::kInt || it[4]->i < 0) return error("storage size is not a non-negative integer");
  StorageRequest req;
  req.key = it[2]->kind == Kind::kStr ? it[2]->s : std::to_string(it[2]->i);
  req.dtype = it[1]->dtype;
  req.storage_class = it[1]->s;
  req.numel = static_cast<uint64_t>(it[4]->i);
  if (it.size() == 6 && it[5]->kind != Kind::kNone) {
    Value* vm = it[5];
    if (vm->kind != Kind::kTuple || vm->items.size() != 3 || vm->items[0]->kind != Kind::kStr ||
        vm->items[1]->kind != Kind::kInt || vm->items[2]->kind != Kind::kInt || vm->items[1]->i < 0 ||
        vm->items[2]->i < 0)
      return error("malformed storage view metadata");
    req.has_view = true;
    req.view_key = vm->items[0]->s;
    req.view_offset = static_cast<uint64_t>(vm->items[1]->i);
    req.view_size = static_cast<uint64_t>(vm->items[2]->i);
  }
  if (!persistent_load_) return error("a storage reference appears where none is allowed");
  WL_ASSIGN_OR_RETURN(size_t idx, persistent_load_(req));
  Value* v = make(Kind::kStorage);
  v->i = static_cast<int64_t>(idx);
  return v;
}

static Status int_list(const Value* v, std::vector<int64_t>* out) {
  if (v->kind != Kind::kTuple && v->kind != Kind::kList) return Status::Corrupt("expected a tuple of integers");
  if (v->items.size() > kMaxDims) return Status::Corrupt(fmt::format("{} dimensions is too many", v->items.size()));
  out->clear();
  for (auto* x : v->items) {
    if (x->kind != Kind::kInt) return Status::Corrupt("expected a tuple of integers");
    if (x->i < 0) return Status::Corrupt(fmt::format("negative size or stride {}", x->i));
    out->push_back(x->i);
  }
  return Status();
}

Result<Value*> Unpickler::rebuild_tensor(Value* args, bool v2) {
  auto& a = args->items;
  if (a.size() < 4) return error(fmt::format("tensor rebuild takes at least 4 arguments, got {}", a.size()));
  if (a[0]->kind != Kind::kStorage) return error("tensor rebuild: the first argument is not a storage");
  if (a[1]->kind != Kind::kInt || a[1]->i < 0) return error("tensor rebuild: bad storage offset");
  TensorRec t;
  t.storage = static_cast<size_t>(a[0]->i);
  t.offset = static_cast<uint64_t>(a[1]->i);
  if (Status s = int_list(a[2], &t.sizes); !s.ok()) return error("tensor sizes: " + s.message());
  if (Status s = int_list(a[3], &t.strides); !s.ok()) return error("tensor strides: " + s.message());
  if (t.sizes.size() != t.strides.size())
    return error(fmt::format("tensor has {} sizes but {} strides", t.sizes.size(), t.strides.size()));
  if (v2 && a.size() > 4 && a[4]->kind == Kind::kBool) t.requires_grad = a[4]->i != 0;
  tensors_.push_back(std::move(t));
  Value* v = make(Kind::kTensor);
  v->i = static_cast<int64_t>(tensors_.size() - 1);
  return v;
}

Result<Value*> Unpickler::call(Value* func, Value* args) {
  if (func->kind != Kind::kGlobal) return error(fmt::format("cannot call a {}", kind_name(func->kind)));
  if (args->kind != Kind::kTuple) return error("call arguments are not a tuple");
  auto& a = args->items;
  switch (func->global) {
    case Global::kOrderedDict: {
      Value* d = make(Kind::kDict);
      d->ordered = true;
      if (!a.empty()) {
        if (a.size() != 1 || (a[0]->kind != Kind::kList && a[0]->kind != Kind::kTuple))
          return error("OrderedDict() takes one list of pairs");
        for (auto* p : a[0]->items) {
          if (p->kind != Kind::kTuple || p->items.size() != 2) return error("OrderedDict() item is not a pair");
          d->items.push_back(p->items[0]);
          d->items.push_back(p->items[1]);
        }
      }
      return d;
    }
    case Global::kSize: {
      if (a.size() != 1 || a[0]->kind != Kind::kTuple) return error("torch.Size() takes one tuple");
      return a[0];
    }
    case Global::kRebuildTensor: return rebuild_tensor(args, false);
    case Global::kRebuildTensorV2: return rebuild_tensor(args, true);
    case Global::kParameter:
    case Global::kRebuildParameter:
    case Global::kRebuildParameterWithState: {
      if (a.empty() || a[0]->kind != Kind::kTensor) return error("Parameter: the first argument is not a tensor");
      auto& t = tensors_[static_cast<size_t>(a[0]->i)];
      t.is_parameter = true;
      t.requires_grad = a.size() > 1 && a[1]->kind == Kind::kBool ? a[1]->i != 0 : true;
      return a[0];
    }
    case Global::kRebuildFromTypeV2: {
      // (func, new_type, args, state): the tensor is func(*args).
      if (a.size() != 4 || a[0]->kind != Kind::kGlobal || a[2]->kind != Kind::kTuple)
        return error("_rebuild_from_type_v2 takes (func, type, args, state)");
      if (a[1]->kind != Kind::kGlobal || (a[1]->global != Global::kTensorClass && a[1]->global != Global::kParameter))
        return error("_rebuild_from_type_v2: only torch.Tensor and Parameter types are allowed");
      return call(a[0], a[2]);
    }
    case Global::kGetLayout:
    case Global::kDevice: return make(Kind::kOther);
    case Global::kCodecsEncode: {
      if (a.size() != 2 || a[0]->kind != Kind::kStr) return error("_codecs.encode takes (str, encoding)");
      Value* b = make(Kind::kBytes);
      // latin1: each code point below 256 is one byte (the UTF-8 text is decoded).
      const std::string& s = a[0]->s;
      for (size_t i = 0; i < s.size();) {
        auto c = static_cast<unsigned char>(s[i]);
        if (c < 0x80) {
          b->s.push_back(static_cast<char>(c));
          i += 1;
        } else if ((c & 0xE0) == 0xC0 && i + 1 < s.size()) {
          b->s.push_back(static_cast<char>(((c & 0x1F) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3F)));
          i += 2;
        } else
          return error("_codecs.encode: text is not latin-1");
      }
      return b;
    }
    case Global::kRebuildUnsupported:
      return Status::Unimplemented(fmt::format("data.pkl: '{}' (sparse, quantized, meta or nested tensors) is not "
                                               "supported",
                                               func->s))
          .with_file(file_);
    case Global::kTensorClass:
    case Global::kStorageClass: return error(fmt::format("'{}' cannot be called", func->s));
  }
  return error("unknown global");
}

Result<Value*> Unpickler::load(std::string_view data, size_t* consumed) {
  std::vector<Value*> stack;
  std::vector<size_t> marks;
  std::unordered_map<uint64_t, Value*> memo;
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  const size_t n = data.size();
  size_t i = 0;

#define WL_NEED(k)                                                        \
  do {                                                                    \
    if (n - i < static_cast<size_t>(k)) return error("truncated pickle"); \
  } while (0)
#define WL_POP(var)                                                                                       \
  if (stack.empty() || (!marks.empty() && stack.size() <= marks.back())) return error("stack underflow"); \
  Value* var = stack.back();                                                                              \
  stack.pop_back()
#define WL_TOP(var)                                                                                       \
  if (stack.empty() || (!marks.empty() && stack.size() <= marks.back())) return error("stack underflow"); \
  Value*& var = stack.back()

  auto u16 = [&](size_t at) { return static_cast<uint32_t>(p[at] | (p[at + 1] << 8)); };
  auto u32 = [&](size_t at) {
    return uint32_t{p[at]} | (uint32_t{p[at + 1]} << 8) | (uint32_t{p[at + 2]} << 16) | (uint32_t{p[at + 3]} << 24);
  };
  auto u64 = [&](size_t at) { return uint64_t{u32(at)} | (uint64_t{u32(at + 4)} << 32); };
  auto pop_mark = [&](std::vector<Value*>* items) -> Status {
    if (marks.empty()) return error("no MARK on the stack");
    size_t m = marks.back();
    marks.pop_back();
    items->assign(stack.begin() + static_cast<ptrdiff_t>(m), stack.end());
    stack.resize(m);
    return Status();
  };
  auto dict_set = [&](Value* d, Value* k, Value* v) -> Status {
    if (d->kind != Kind::kDict) return error(fmt::format("cannot set an item on a {}", kind_name(d->kind)));
    if (k->kind == Kind::kStr) {
      if (!d->str_index) {
        indexes_.emplace_back();
        d->str_index = &indexes_.back();
        for (size_t j = 0; j + 1 < d->items.size(); j += 2)
          if (d->items[j]->kind == Kind::kStr) (*d->str_index)[d->items[j]->s] = j;
      }
      auto [it, fresh] = d->str_index->emplace(k->s, d->items.size());
      if (!fresh) {
        d->items[it->second + 1] = v;  // Python semantics: the later value wins
        return Status();
      }
    }
    d->items.push_back(k);
    d->items.push_back(v);
    return Status();
  };
  auto push_str = [&](Kind kind, uint64_t len, size_t hdr) -> Status {
    if (len > n - i - hdr) return error(fmt::format("string of {} bytes runs past the end of the pickle", len));
    Value* v = make(kind);
    v->s.assign(reinterpret_cast<const char*>(p + i + hdr), len);
    stack.push_back(v);
    i += hdr + len;
    return Status();
  };

  while (true) {
    pos_ = i;
    WL_NEED(1);
    unsigned char op = p[i++];
    switch (op) {
      case 0x80:  // PROTO
        WL_NEED(1);
        if (p[i] < 2 || p[i] > 5) return error(fmt::format("unsupported pickle protocol {}", p[i]));
        ++i;
        break;
      case 0x95:  // FRAME
        WL_NEED(8);
        i += 8;
        break;
      case '.': {  // STOP
        WL_POP(v);
        if (consumed) *consumed = i;
        return v;
      }
      case '(':  // MARK
        if (marks.size() >= kMaxMarks) return error("too many nested MARKs");
        marks.push_back(stack.size());
        break;
      case '0': {  // POP
        if (!stack.empty() && (marks.empty() || stack.size() > marks.back()))
          stack.pop_back();
        else if (!marks.empty())
          marks.pop_back();
        else
          return error("stack underflow");
        break;
      }
      case '1': {  // POP_MARK
        std::vector<Value*> tmp;
        WL_RETURN_IF_ERROR(pop_mark(&tmp));
        break;
      }
      case '2': {  // DUP
        WL_TOP(v);
        stack.push_back(v);
        break;
      }
      case 'N': stack.push_back(make(Kind::kNone)); break;
      case 0x88:
      case 0x89: {
        Value* v = make(Kind::kBool);
        v->i = op == 0x88;
        stack.push_back(v);
        break;
      }
      case 'J': {  // BININT
        WL_NEED(4);
        Value* v = make(Kind::kInt);
        v->i = static_cast<int32_t>(u32(i));
        i += 4;
        stack.push_back(v);
        break;
      }
      case 'K': {  // BININT1
        WL_NEED(1);
        Value* v = make(Kind::kInt);
        v->i = p[i++];
        stack.push_back(v);
        break;
      }
      case 'M': {  // BININT2
        WL_NEED(2);
        Value* v = make(Kind::kInt);
        v->i = u16(i);
        i += 2;
        stack.push_back(v);
        break;
      }
      case 0x8a: {  // LONG1: little-endian two's complement, up to 8 bytes supported
        WL_NEED(1);
        size_t len = p[i++];
        WL_NEED(len);
        if (len > 8) {  // a big integer (the legacy format's magic number): kept as raw bytes
          Value* big = make(Kind::kOther);
          big->s.assign(reinterpret_cast<const char*>(p + i), len);
          i += len;
          stack.push_back(big);
          break;
        }
        uint64_t u = 0;
        for (size_t k = 0; k < len; ++k) u |= uint64_t{p[i + k]} << (8 * k);
        if (len > 0 && len < 8 && (p[i + len - 1] & 0x80)) u |= ~uint64_t{0} << (8 * len);
        Value* v = make(Kind::kInt);
        v->i = static_cast<int64_t>(u);
        i += len;
        stack.push_back(v);
        break;
      }
      case 'G': {  // BINFLOAT (big-endian double)
        WL_NEED(8);
        uint64_t u = 0;
        for (int k = 0; k < 8; ++k) u = (u << 8) | p[i + k];
        Value* v = make(Kind::kFloat);
        std::memcpy(&v->f, &u, 8);
        i += 8;
        stack.push_back(v);
        break;
      }
      case 'X':  // BINUNICODE
        WL_NEED(4);
        WL_RETURN_IF_ERROR(push_str(Kind::kStr, u32(i), 4));
        break;
      case 0x8c:  // SHORT_BINUNICODE
        WL_NEED(1);
        WL_RETURN_IF_ERROR(push_str(Kind::kStr, p[i], 1));
        break;
      case 0x8d:  // BINUNICODE8
        WL_NEED(8);
        WL_RETURN_IF_ERROR(push_str(Kind::kStr, u64(i), 8));
        break;
      case 'U':  // SHORT_BINSTRING (protocol 2 byte strings, e.g. legacy sys_info keys)
        WL_NEED(1);
        WL_RETURN_IF_ERROR(push_str(Kind::kStr, p[i], 1));
        break;
      case 'T':  // BINSTRING
        WL_NEED(4);
        WL_RETURN_IF_ERROR(push_str(Kind::kStr, u32(i), 4));
        break;
      case 'C':  // SHORT_BINBYTES
        WL_NEED(1);
        WL_RETURN_IF_ERROR(push_str(Kind::kBytes, p[i], 1));
        break;
      case 'B':  // BINBYTES
        WL_NEED(4);
        WL_RETURN_IF_ERROR(push_str(Kind::kBytes, u32(i), 4));
        break;
      case 0x8e:  // BINBYTES8
        WL_NEED(8);
        WL_RETURN_IF_ERROR(push_str(Kind::kBytes, u64(i), 8));
        break;
      case ')': stack.push_back(make(Kind::kTuple)); break;
      case ']': stack.push_back(make(Kind::kList)); break;
      case '}': stack.push_back(make(Kind::kDict)); break;
      case 0x8f: stack.push_back(make(Kind::kSet)); break;
      case 't': {  // TUPLE
        Value* v = make(Kind::kTuple);
        WL_RETURN_IF_ERROR(pop_mark(&v->items));
        stack.push_back(v);
        break;
      }
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        size_t k = op - 0x84;
        size_t floor = marks.empty() ? 0 : marks.back();
        if (stack.size() < floor + k) return error("stack underflow");
        Value* v = make(Kind::kTuple);
        v->items.assign(stack.end() - static_cast<ptrdiff_t>(k), stack.end());
        stack.resize(stack.size() - k);
        stack.push_back(v);
        break;
      }
      case 'l': {  // LIST
        Value* v = make(Kind::kList);
        WL_RETURN_IF_ERROR(pop_mark(&v->items));
        stack.push_back(v);
        break;
      }
      case 'd': {  // DICT
        std::vector<Value*> items;
        WL_RETURN_IF_ERROR(pop_mark(&items));
        if (items.size() % 2) return error("DICT with an odd number of items");
        Value* d = make(Kind::kDict);
        for (size_t k = 0; k < items.size(); k += 2) WL_RETURN_IF_ERROR(dict_set(d, items[k], items[k + 1]));
        stack.push_back(d);
        break;
      }
      case 'a': {  // APPEND
        WL_POP(item);
        WL_TOP(list);
        if (list->kind != Kind::kList)
          return error(fmt::format("can only append to a list, not a {}", kind_name(list->kind)));
        list->items.push_back(item);
        break;
      }
      case 'e': {  // APPENDS
        std::vector<Value*> items;
        WL_RETURN_IF_ERROR(pop_mark(&items));
        WL_TOP(list);
        if (list->kind != Kind::kList)
          return error(fmt::format("can only extend a list, not a {}", kind_name(list->kind)));
        list->items.insert(list->items.end(), items.begin(), items.end());
        break;
      }
      case 0x90: {  // ADDITEMS
        std::vector<Value*> items;
        WL_RETURN_IF_ERROR(pop_mark(&items));
        WL_TOP(set);
        if (set->kind != Kind::kSet) return error("ADDITEMS on a non-set");
        set->items.insert(set->items.end(), items.begin(), items.end());
        break;
      }
      case 's': {  // SETITEM
        WL_POP(v);
        WL_POP(k);
        WL_TOP(d);
        WL_RETURN_IF_ERROR(dict_set(d, k, v));
        break;
      }
      case 'u': {  // SETITEMS
        std::vector<Value*> items;
        WL_RETURN_IF_ERROR(pop_mark(&items));
        if (items.size() % 2) return error("SETITEMS with an odd number of items");
        WL_TOP(d);
        for (size_t k = 0; k < items.size(); k += 2) WL_RETURN_IF_ERROR(dict_set(d, items[k], items[k + 1]));
        break;
      }
      case 'c': {  // GLOBAL "module\nname\n"
        const char* b = reinterpret_cast<const char*>(p + i);
        const void* nl1 = std::memchr(b, '\n', std::min<size_t>(n - i, 512));
        if (!nl1) return error("GLOBAL without a module line");
        size_t l1 = static_cast<size_t>(static_cast<const char*>(nl1) - b);
        const void* nl2 = std::memchr(b + l1 + 1, '\n', std::min<size_t>(n - i - l1 - 1, 512));
        if (!nl2) return error("GLOBAL without a name line");
        size_t l2 = static_cast<size_t>(static_cast<const char*>(nl2) - (b + l1 + 1));
        WL_ASSIGN_OR_RETURN(Value * g, find_global(std::string_view(b, l1), std::string_view(b + l1 + 1, l2)));
        stack.push_back(g);
        i += l1 + l2 + 2;
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        WL_POP(name);
        WL_POP(module);
        if (name->kind != Kind::kStr || module->kind != Kind::kStr) return error("STACK_GLOBAL needs two strings");
        WL_ASSIGN_OR_RETURN(Value * g, find_global(module->s, name->s));
        stack.push_back(g);
        break;
      }
      case 'R': {  // REDUCE
        WL_POP(args);
        WL_TOP(func);
        WL_ASSIGN_OR_RETURN(Value * r, call(func, args));
        func = r;
        break;
      }
      case 0x81: {  // NEWOBJ: only Parameter
        WL_POP(args);
        WL_TOP(cls);
        if (cls->kind != Kind::kGlobal || cls->global != Global::kParameter)
          return error(fmt::format("NEWOBJ of '{}' is not allowed; only Parameter", cls->s));
        WL_ASSIGN_OR_RETURN(Value * r, call(cls, args));
        cls = r;
        break;
      }
      case 'b': {  // BUILD: state of a Tensor / Parameter / OrderedDict is accepted and ignored
        WL_POP(state);
        (void)state;
        WL_TOP(inst);
        if (inst->kind != Kind::kTensor && inst->kind != Kind::kDict)
          return error(
              fmt::format("BUILD is only allowed on a tensor, parameter or dict, not a {}", kind_name(inst->kind)));
        break;
      }
      case 'Q': {  // BINPERSID
        WL_POP(pid);
        WL_ASSIGN_OR_RETURN(Value * s, load_persistent(pid));
        stack.push_back(s);
        break;
      }
      case 'q':
      case 'r':
      case 0x94: {  // BINPUT, LONG_BINPUT, MEMOIZE
        uint64_t idx = 0;
        if (op == 'q') {
          WL_NEED(1);
          idx = p[i++];
        } else if (op == 'r') {
          WL_NEED(4);
          idx = u32(i);
          i += 4;
        } else
          idx = memo.size();
        WL_TOP(v);
        if (memo.size() >= kMaxMemo) return error("memo is too large");
        memo[idx] = v;
        break;
      }
      case 'h':
      case 'j': {  // BINGET, LONG_BINGET
        uint64_t idx = 0;
        if (op == 'h') {
          WL_NEED(1);
          idx = p[i++];
        } else {
          WL_NEED(4);
          idx = u32(i);
          i += 4;
        }
        auto it = memo.find(idx);
        if (it == memo.end()) return error(fmt::format("memo key {} is not defined", idx));
        stack.push_back(it->second);
        break;
      }
      default: return error(fmt::format("unsupported pickle opcode 0x{:02x}", op));
    }
  }
#undef WL_NEED
#undef WL_POP
#undef WL_TOP
}

namespace {
Status flatten_rec(const Value* v, std::string& prefix, int depth, std::vector<std::pair<std::string, size_t>>* out,
                   std::string_view file) {
  if (depth > kMaxDepth)
    return Status::Corrupt(fmt::format("data.pkl: objects nested deeper than {} levels", kMaxDepth)).with_file(file);
  auto child = [&](const std::string& key, const Value* c) -> Status {
    size_t keep = prefix.size();
    if (!prefix.empty()) prefix += '.';
    prefix += key;
    Status s = flatten_rec(c, prefix, depth + 1, out, file);
    prefix.resize(keep);
    return s;
  };
  switch (v->kind) {
    case Kind::kTensor: out->emplace_back(prefix, static_cast<size_t>(v->i)); return Status();
    case Kind::kDict:
      for (size_t k = 0; k + 1 < v->items.size(); k += 2) {
        const Value* key = v->items[k];
        std::string ks = key->kind == Kind::kStr ? key->s : key->kind == Kind::kInt ? std::to_string(key->i) : "";
        if (key->kind != Kind::kStr && key->kind != Kind::kInt) continue;
        WL_RETURN_IF_ERROR(child(ks, v->items[k + 1]));
      }
      return Status();
    case Kind::kList:
    case Kind::kTuple:
      for (size_t k = 0; k < v->items.size(); ++k) WL_RETURN_IF_ERROR(child(std::to_string(k), v->items[k]));
      return Status();
    default: return Status();
  }
}
}  // namespace

Status flatten_tensors(const Value* root, std::vector<std::pair<std::string, size_t>>* out, std::string_view file) {
  std::string prefix;
  return flatten_rec(root, prefix, 0, out, file);
}

}  // namespace wl::pickle
