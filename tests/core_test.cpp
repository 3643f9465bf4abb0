#include <gtest/gtest.h>

#include "weightlift/dtype.h"
#include "weightlift/hash.h"
#include "weightlift/status.h"
#include "weightlift/tensor.h"

namespace wl {
namespace {

TEST(Status, ToStringNamesFileAndTensor) {
  Status s = Status::Corrupt("bad offsets").with_file("/m/a.safetensors").with_tensor("w");
  EXPECT_EQ(s.code(), Code::kCorruptData);
  EXPECT_EQ(s.to_string(), "/m/a.safetensors: tensor 'w': bad offsets");
  // Innermost context wins.
  s.with_file("/other");
  EXPECT_EQ(s.file(), "/m/a.safetensors");
  EXPECT_EQ(Status().to_string(), "ok");
}

TEST(Status, FromErrnoMapsCodes) {
  EXPECT_EQ(Status::FromErrno(ENOENT, "open").code(), Code::kNotFound);
  EXPECT_EQ(Status::FromErrno(EACCES, "open").code(), Code::kPermissionDenied);
  EXPECT_EQ(Status::FromErrno(EIO, "read").code(), Code::kIoError);
  EXPECT_EQ(Status::FromErrno(ENOSPC, "write").code(), Code::kIoError);
  EXPECT_NE(Status::FromErrno(ENOSPC, "write").message().find("No space"), std::string::npos);
}

Result<int> half(int x) {
  if (x % 2) return Status::InvalidArgument("odd");
  return x / 2;
}
Result<int> quarter(int x) {
  WL_ASSIGN_OR_RETURN(int h, half(x));
  WL_ASSIGN_OR_RETURN(int q, half(h));
  return q;
}

TEST(Result, PropagatesErrors) {
  EXPECT_EQ(*quarter(8), 2);
  EXPECT_FALSE(quarter(6).ok());
  EXPECT_EQ(quarter(6).status().message(), "odd");
  Result<int> bad = Status();  // OK status is not a value
  EXPECT_EQ(bad.status().code(), Code::kInternal);
}

TEST(DType, NamesAndSizesRoundTrip) {
  for (int i = 0; i < kDTypeCount; ++i) {
    auto t = static_cast<DType>(i);
    auto back = dtype_from_name(dtype_name(t));
    ASSERT_TRUE(back.has_value()) << dtype_name(t);
    EXPECT_EQ(*back, t);
  }
  EXPECT_EQ(dtype_size(DType::BF16), 2);
  EXPECT_EQ(dtype_size(DType::F8_E4M3), 1);
  EXPECT_EQ(dtype_size(DType::C64), 8);
  EXPECT_EQ(dtype_bits(DType::F4), 4);
  EXPECT_EQ(dtype_size(DType::F4), 0);
  EXPECT_FALSE(dtype_from_name("bf16").has_value());  // case-sensitive as safetensors
  EXPECT_FALSE(dtype_from_name("F128").has_value());
  EXPECT_TRUE(dtype_in_safetensors(DType::U64));
  EXPECT_FALSE(dtype_in_safetensors(DType::C128));
  EXPECT_TRUE(dtype_in_safetensors(DType::F8_E4M3FNUZ));  // safetensors stores the FNUZ float8 kinds
}

TEST(DType, NbytesChecksOverflowAndWholeBytes) {
  EXPECT_EQ(*dtype_nbytes(DType::F32, 10), 40u);
  EXPECT_EQ(*dtype_nbytes(DType::F4, 10), 5u);
  EXPECT_FALSE(dtype_nbytes(DType::F4, 3).has_value());
  EXPECT_EQ(*dtype_nbytes(DType::F6_E2M3, 4), 3u);
  EXPECT_FALSE(dtype_nbytes(DType::F64, UINT64_MAX / 4).has_value());
}

TEST(Tensor, EmptyAndCopy) {
  auto t = Tensor::empty(DType::F32, {2, 3});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->nbytes(), 24u);
  EXPECT_EQ(t->numel(), 6u);
  t->mutable_bytes()[5] = std::byte{7};
  auto c = Tensor::copy_of(t->view());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->bytes()[5], std::byte{7});
  EXPECT_FALSE(Tensor::empty(DType::F32, {-1}).ok());
  EXPECT_FALSE(Tensor::empty(DType::F32, {INT64_MAX, INT64_MAX}).ok());
  // A view keeps its storage alive after the tensor is gone.
  TensorView v;
  {
    auto big = Tensor::empty(DType::U8, {4 << 20});
    ASSERT_TRUE(big.ok());
    big->mutable_bytes()[123] = std::byte{9};
    v = big->view();
  }
  EXPECT_EQ(v.bytes()[123], std::byte{9});
}

TEST(Buffer, HugeAllocationsAreAlignedAndUsable) {
  auto b = Buffer::allocate(5 << 20, 4096);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 4096, 0u);
  b->data()[(5 << 20) - 1] = std::byte{1};
  Buffer moved = std::move(*b);
  EXPECT_EQ(moved.size(), size_t{5} << 20);
  EXPECT_FALSE(Buffer::allocate(16, 3).ok());
  EXPECT_FALSE(Buffer::allocate(SIZE_MAX - 10).ok());
}

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(std::string_view("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex(std::string_view("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Sha256 h;
  h.update("a");
  h.update("bc");
  EXPECT_EQ(h.hex_digest(), sha256_hex(std::string_view("abc")));
}

}  // namespace
}  // namespace wl

namespace wl {
namespace {
TEST(Buffer, OddHugeSizesMapAndUnmapCleanly) {
  // Sizes just past a 2 MiB multiple once unmapped far more than they owned.
  for (size_t size : {size_t{2} << 20, (size_t{2} << 20) + 1, (size_t{6} << 20) + 4097, (size_t{8} << 20) - 1}) {
    for (int i = 0; i < 4; ++i) {
      auto b = Buffer::allocate(size, 4096);
      ASSERT_TRUE(b.ok());
      b->data()[0] = std::byte{1};
      b->data()[size - 1] = std::byte{2};
    }
  }
  auto keep = Buffer::allocate(1 << 20);
  keep->data()[0] = std::byte{3};
  for (int i = 0; i < 8; ++i) (void)Buffer::allocate((size_t{2} << 20) + 4096 * i + 1);
  EXPECT_EQ(keep->data()[0], std::byte{3});
}
}  // namespace
}  // namespace wl
