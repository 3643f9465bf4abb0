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

// ---- load(): one handler per opcode ------------------------------------------

// The state of one load() (the pickle's bytes, the stack, the marks, the
// memo), the opcodes' handlers, and step(), the table from opcode to handler.
// A handler returns false on an error, which it records with fail(). Every
// Value on the stack is non-null.
struct Unpickler::Machine {
  Machine(Unpickler& owner, std::string_view data)
      : u(owner), p(reinterpret_cast<const unsigned char*>(data.data())), n(data.size()) {}

  Unpickler& u;
  const unsigned char* const p;
  const size_t n;
  size_t i = 0;  // the next byte
  std::vector<Value*> stack;
  std::vector<size_t> marks;
  std::unordered_map<uint64_t, Value*> memo;
  Value* result = nullptr;  // set by STOP
  Status status;            // set by fail()

  bool fail(Status s) {
    status = std::move(s);
    return false;
  }
  bool fail(std::string what) { return fail(u.error(std::move(what))); }
  bool truncated() { return fail(std::string("truncated pickle")); }
  bool underflow() { return fail(std::string("stack underflow")); }
  // *out = r's value, or fail with its error.
  bool take(Result<Value*> r, Value** out) {
    if (!r.ok()) return fail(std::move(r).status());
    *out = *r;
    return true;
  }
  bool has(size_t k) const { return n - i >= k; }
  uint32_t u16(size_t at) const { return static_cast<uint32_t>(p[at] | (p[at + 1] << 8)); }
  uint32_t u32(size_t at) const {
    return uint32_t{p[at]} | (uint32_t{p[at + 1]} << 8) | (uint32_t{p[at + 2]} << 16) | (uint32_t{p[at + 3]} << 24);
  }
  uint64_t u64(size_t at) const { return uint64_t{u32(at)} | (uint64_t{u32(at + 4)} << 32); }

  // The stack above the innermost mark is empty.
  bool bare() const { return stack.empty() || (!marks.empty() && stack.size() <= marks.back()); }
  // The top of the stack above the innermost mark, popped; nullptr when bare().
  Value* pop_value() {
    if (bare()) return nullptr;
    Value* v = stack.back();
    stack.pop_back();
    return v;
  }
  // The top of the stack above the innermost mark, in place; nullptr when bare().
  Value** top() { return bare() ? nullptr : &stack.back(); }
  bool push(Value* v) {
    stack.push_back(v);
    return true;
  }
  bool push_int(int64_t x) {
    Value* v = u.make(Kind::kInt);
    v->i = x;
    return push(v);
  }

  // Pops the stack down to the innermost mark into *items.
  bool pop_mark(std::vector<Value*>* items) {
    if (marks.empty()) return fail(std::string("no MARK on the stack"));
    size_t m = marks.back();
    marks.pop_back();
    items->assign(stack.begin() + static_cast<ptrdiff_t>(m), stack.end());
    stack.resize(m);
    return true;
  }
  bool dict_set(Value* d, Value* k, Value* v) {
    if (d->kind != Kind::kDict) return fail(fmt::format("cannot set an item on a {}", kind_name(d->kind)));
    if (k->kind == Kind::kStr) {
      if (!d->str_index) {
        u.indexes_.emplace_back();
        d->str_index = &u.indexes_.back();
        for (size_t j = 0; j + 1 < d->items.size(); j += 2)
          if (d->items[j]->kind == Kind::kStr) (*d->str_index)[d->items[j]->s] = j;
      }
      auto [it, fresh] = d->str_index->emplace(k->s, d->items.size());
      if (!fresh) {
        d->items[it->second + 1] = v;  // Python semantics: the later value wins
        return true;
      }
    }
    d->items.push_back(k);
    d->items.push_back(v);
    return true;
  }
  bool set_items(Value* d, const std::vector<Value*>& items) {
    for (size_t k = 0; k < items.size(); k += 2)
      if (!dict_set(d, items[k], items[k + 1])) return false;
    return true;
  }

  // ---- the handlers (pickletools' names in the table below) ----
  bool unsupported(unsigned char op) { return fail(fmt::format("unsupported pickle opcode 0x{:02x}", op)); }
  bool proto() {
    if (!has(1)) return truncated();
    if (p[i] < 2 || p[i] > 5) return fail(fmt::format("unsupported pickle protocol {}", p[i]));
    ++i;
    return true;
  }
  bool frame() {
    if (!has(8)) return truncated();
    i += 8;
    return true;
  }
  bool stop() {
    result = pop_value();
    return result || underflow();
  }
  bool mark() {
    if (marks.size() >= kMaxMarks) return fail(std::string("too many nested MARKs"));
    marks.push_back(stack.size());
    return true;
  }
  bool pop() {
    if (!stack.empty() && (marks.empty() || stack.size() > marks.back()))
      stack.pop_back();
    else if (!marks.empty())
      marks.pop_back();
    else
      return underflow();
    return true;
  }
  bool pop_mark_op() {
    std::vector<Value*> dropped;
    return pop_mark(&dropped);
  }
  bool dup() {
    Value** v = top();
    return v ? push(*v) : underflow();
  }
  bool none() { return push(u.make(Kind::kNone)); }
  bool boolean(unsigned char op) {  // NEWTRUE, NEWFALSE
    Value* v = u.make(Kind::kBool);
    v->i = op == 0x88;
    return push(v);
  }
  bool binint() {
    if (!has(4)) return truncated();
    push_int(static_cast<int32_t>(u32(i)));
    i += 4;
    return true;
  }
  bool binint1() {
    if (!has(1)) return truncated();
    return push_int(p[i++]);
  }
  bool binint2() {
    if (!has(2)) return truncated();
    push_int(u16(i));
    i += 2;
    return true;
  }
  bool long1() {  // little-endian two's complement, up to 8 bytes supported
    if (!has(1)) return truncated();
    size_t len = p[i++];
    if (!has(len)) return truncated();
    if (len > 8) {  // a big integer (the legacy format's magic number): kept as raw bytes
      Value* big = u.make(Kind::kOther);
      big->s.assign(reinterpret_cast<const char*>(p + i), len);
      i += len;
      return push(big);
    }
    uint64_t x = 0;
    for (size_t k = 0; k < len; ++k) x |= uint64_t{p[i + k]} << (8 * k);
    if (len > 0 && len < 8 && (p[i + len - 1] & 0x80)) x |= ~uint64_t{0} << (8 * len);
    i += len;
    return push_int(static_cast<int64_t>(x));
  }
  bool binfloat() {  // big-endian double
    if (!has(8)) return truncated();
    uint64_t x = 0;
    for (int k = 0; k < 8; ++k) x = (x << 8) | p[i + k];
    Value* v = u.make(Kind::kFloat);
    std::memcpy(&v->f, &x, 8);
    i += 8;
    return push(v);
  }
  // A string of kind K after its length, a little-endian integer of kLenBytes bytes.
  template <Kind K, size_t kLenBytes>
  bool string() {
    if (!has(kLenBytes)) return truncated();
    uint64_t len = 0;
    if constexpr (kLenBytes == 1) len = p[i];
    if constexpr (kLenBytes == 4) len = u32(i);
    if constexpr (kLenBytes == 8) len = u64(i);
    if (len > n - i - kLenBytes) return fail(fmt::format("string of {} bytes runs past the end of the pickle", len));
    Value* v = u.make(K);
    v->s.assign(reinterpret_cast<const char*>(p + i + kLenBytes), len);
    i += kLenBytes + len;
    return push(v);
  }
  template <Kind K>
  bool empty() {  // EMPTY_TUPLE, EMPTY_LIST, EMPTY_DICT, EMPTY_SET
    return push(u.make(K));
  }
  template <Kind K>
  bool collect() {  // TUPLE, LIST: the items since the mark
    Value* v = u.make(K);
    return pop_mark(&v->items) && push(v);
  }
  bool tuple_n(unsigned char op) {  // TUPLE1..3
    size_t k = op - 0x84;
    size_t floor = marks.empty() ? 0 : marks.back();
    if (stack.size() < floor + k) return underflow();
    Value* v = u.make(Kind::kTuple);
    v->items.assign(stack.end() - static_cast<ptrdiff_t>(k), stack.end());
    stack.resize(stack.size() - k);
    return push(v);
  }
  bool dict() {
    std::vector<Value*> items;
    if (!pop_mark(&items)) return false;
    if (items.size() % 2) return fail(std::string("DICT with an odd number of items"));
    Value* d = u.make(Kind::kDict);
    return set_items(d, items) && push(d);
  }
  bool append() {
    Value* item = pop_value();
    if (!item) return underflow();
    Value** list = top();
    if (!list) return underflow();
    if ((*list)->kind != Kind::kList)
      return fail(fmt::format("can only append to a list, not a {}", kind_name((*list)->kind)));
    (*list)->items.push_back(item);
    return true;
  }
  bool appends() {
    std::vector<Value*> items;
    if (!pop_mark(&items)) return false;
    Value** list = top();
    if (!list) return underflow();
    if ((*list)->kind != Kind::kList)
      return fail(fmt::format("can only extend a list, not a {}", kind_name((*list)->kind)));
    (*list)->items.insert((*list)->items.end(), items.begin(), items.end());
    return true;
  }
  bool additems() {
    std::vector<Value*> items;
    if (!pop_mark(&items)) return false;
    Value** set = top();
    if (!set) return underflow();
    if ((*set)->kind != Kind::kSet) return fail(std::string("ADDITEMS on a non-set"));
    (*set)->items.insert((*set)->items.end(), items.begin(), items.end());
    return true;
  }
  bool setitem() {
    Value* v = pop_value();
    if (!v) return underflow();
    Value* k = pop_value();
    if (!k) return underflow();
    Value** d = top();
    return d ? dict_set(*d, k, v) : underflow();
  }
  bool setitems() {
    std::vector<Value*> items;
    if (!pop_mark(&items)) return false;
    if (items.size() % 2) return fail(std::string("SETITEMS with an odd number of items"));
    Value** d = top();
    return d ? set_items(*d, items) : underflow();
  }
  bool global() {  // "module\nname\n"
    const char* b = reinterpret_cast<const char*>(p + i);
    const void* nl1 = std::memchr(b, '\n', std::min<size_t>(n - i, 512));
    if (!nl1) return fail(std::string("GLOBAL without a module line"));
    size_t l1 = static_cast<size_t>(static_cast<const char*>(nl1) - b);
    const void* nl2 = std::memchr(b + l1 + 1, '\n', std::min<size_t>(n - i - l1 - 1, 512));
    if (!nl2) return fail(std::string("GLOBAL without a name line"));
    size_t l2 = static_cast<size_t>(static_cast<const char*>(nl2) - (b + l1 + 1));
    Value* g = nullptr;
    if (!take(u.find_global(std::string_view(b, l1), std::string_view(b + l1 + 1, l2)), &g)) return false;
    i += l1 + l2 + 2;
    return push(g);
  }
  bool stack_global() {
    Value* name = pop_value();
    if (!name) return underflow();
    Value* module = pop_value();
    if (!module) return underflow();
    if (name->kind != Kind::kStr || module->kind != Kind::kStr)
      return fail(std::string("STACK_GLOBAL needs two strings"));
    Value* g = nullptr;
    return take(u.find_global(module->s, name->s), &g) && push(g);
  }
  bool reduce() {
    Value* args = pop_value();
    if (!args) return underflow();
    Value** func = top();
    if (!func) return underflow();
    return take(u.call(*func, args), func);
  }
  bool newobj() {  // only Parameter
    Value* args = pop_value();
    if (!args) return underflow();
    Value** cls = top();
    if (!cls) return underflow();
    if ((*cls)->kind != Kind::kGlobal || (*cls)->global != Global::kParameter)
      return fail(fmt::format("NEWOBJ of '{}' is not allowed; only Parameter", (*cls)->s));
    return take(u.call(*cls, args), cls);
  }
  bool build() {  // the state of a Tensor / Parameter / OrderedDict is accepted and ignored
    if (!pop_value()) return underflow();
    Value** inst = top();
    if (!inst) return underflow();
    if ((*inst)->kind != Kind::kTensor && (*inst)->kind != Kind::kDict)
      return fail(
          fmt::format("BUILD is only allowed on a tensor, parameter or dict, not a {}", kind_name((*inst)->kind)));
    return true;
  }
  bool binpersid() {
    Value* pid = pop_value();
    if (!pid) return underflow();
    Value* s = nullptr;
    return take(u.load_persistent(pid), &s) && push(s);
  }
  bool put(unsigned char op) {  // BINPUT, LONG_BINPUT, MEMOIZE
    uint64_t idx = 0;
    if (op == 'q') {
      if (!has(1)) return truncated();
      idx = p[i++];
    } else if (op == 'r') {
      if (!has(4)) return truncated();
      idx = u32(i);
      i += 4;
    } else {
      idx = memo.size();
    }
    Value** v = top();
    if (!v) return underflow();
    if (memo.size() >= kMaxMemo) return fail(std::string("memo is too large"));
    memo[idx] = *v;
    return true;
  }
  bool get(unsigned char op) {  // BINGET, LONG_BINGET
    uint64_t idx = 0;
    if (op == 'h') {
      if (!has(1)) return truncated();
      idx = p[i++];
    } else {
      if (!has(4)) return truncated();
      idx = u32(i);
      i += 4;
    }
    auto it = memo.find(idx);
    if (it == memo.end()) return fail(fmt::format("memo key {} is not defined", idx));
    return push(it->second);
  }

  // The dispatch table: opcode -> handler, for the opcodes that state dicts
  // use (protocols 2 to 5); every other byte is refused. A switch, so that the
  // compiler builds the jump table and inlines the handlers: a table of
  // member-function pointers read 7% slower (bench/unpickle_bench.cpp).
  bool step(unsigned char op) {
    switch (op) {
      case 0x80: return proto();       // PROTO
      case 0x95: return frame();       // FRAME
      case '.': return stop();         // STOP
      case '(': return mark();         // MARK
      case '0': return pop();          // POP
      case '1': return pop_mark_op();  // POP_MARK
      case '2': return dup();          // DUP
      case 'N': return none();         // NONE
      case 0x88:
      case 0x89: return boolean(op);                // NEWTRUE, NEWFALSE
      case 'J': return binint();                    // BININT
      case 'K': return binint1();                   // BININT1
      case 'M': return binint2();                   // BININT2
      case 0x8a: return long1();                    // LONG1
      case 'G': return binfloat();                  // BINFLOAT
      case 'X': return string<Kind::kStr, 4>();     // BINUNICODE
      case 0x8c: return string<Kind::kStr, 1>();    // SHORT_BINUNICODE
      case 0x8d: return string<Kind::kStr, 8>();    // BINUNICODE8
      case 'U': return string<Kind::kStr, 1>();     // SHORT_BINSTRING (protocol 2, legacy sys_info keys)
      case 'T': return string<Kind::kStr, 4>();     // BINSTRING
      case 'C': return string<Kind::kBytes, 1>();   // SHORT_BINBYTES
      case 'B': return string<Kind::kBytes, 4>();   // BINBYTES
      case 0x8e: return string<Kind::kBytes, 8>();  // BINBYTES8
      case ')': return empty<Kind::kTuple>();       // EMPTY_TUPLE
      case ']': return empty<Kind::kList>();        // EMPTY_LIST
      case '}': return empty<Kind::kDict>();        // EMPTY_DICT
      case 0x8f: return empty<Kind::kSet>();        // EMPTY_SET
      case 't': return collect<Kind::kTuple>();     // TUPLE
      case 0x85:
      case 0x86:
      case 0x87: return tuple_n(op);            // TUPLE1, TUPLE2, TUPLE3
      case 'l': return collect<Kind::kList>();  // LIST
      case 'd': return dict();                  // DICT
      case 'a': return append();                // APPEND
      case 'e': return appends();               // APPENDS
      case 0x90: return additems();             // ADDITEMS
      case 's': return setitem();               // SETITEM
      case 'u': return setitems();              // SETITEMS
      case 'c': return global();                // GLOBAL
      case 0x93: return stack_global();         // STACK_GLOBAL
      case 'R': return reduce();                // REDUCE
      case 0x81: return newobj();               // NEWOBJ
      case 'b': return build();                 // BUILD
      case 'Q': return binpersid();             // BINPERSID
      case 'q':
      case 'r':
      case 0x94: return put(op);  // BINPUT, LONG_BINPUT, MEMOIZE
      case 'h':
      case 'j': return get(op);  // BINGET, LONG_BINGET
      default: return unsupported(op);
    }
  }
};

Result<Value*> Unpickler::load(std::string_view data, size_t* consumed) {
  Machine m(*this, data);
  while (!m.result) {
    pos_ = m.i;
    if (!m.has(1)) return error("truncated pickle");
    if (!m.step(m.p[m.i++])) return std::move(m.status);
  }
  if (consumed) *consumed = m.i;
  return m.result;
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
