// Dummy weights: Philox known answers, conversions, value range, determinism
// across thread counts, untouched integer tensors, errors, and (when a GPU is
// present) the CUDA kernel against the CPU bytes.
#include <cmath>
#include <cstring>
#include <set>

#include <gtest/gtest.h>

#include "weightlift/dummy.h"
#include "weightlift/dummy_kernel.h"
#include "weightlift/gpu.h"

namespace wl {
namespace {

namespace d = wl::dummy;

// Golden bits (F32 and F64 ones cross-checked with an independent Python
// Philox in docs/model.md).
constexpr uint64_t GOLDEN_F32_0 = 3124982606u;  // -0.00074558414
constexpr uint64_t GOLDEN_F32_5 = 3125495688u;  // -0.00077544944
constexpr uint64_t GOLDEN_BF16_1 = 14905;
constexpr uint64_t GOLDEN_F16_2 = 36782;
constexpr uint64_t GOLDEN_F64_3 = 4561941351045296740ull;
constexpr uint64_t GOLDEN_E5M2_7 = 174;
constexpr uint64_t GOLDEN_E4M3_9 = 42;

const DType kFilled[] = {DType::F32, DType::F16, DType::BF16, DType::F64, DType::F8_E4M3, DType::F8_E5M2};

Tensor make(DType t, int64_t n) {
  auto r = Tensor::empty(t, {n});
  EXPECT_TRUE(r.ok());
  return std::move(r).value();
}

float as_f32(const Tensor& t, size_t i) {
  float v;
  std::memcpy(&v, t.bytes().data() + i * 4, 4);
  return v;
}

TEST(Philox, KnownAnswers) {
  // Random123's kat_vectors for philox4x32-10.
  auto a = d::philox4x32_full({{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(a.v[0], 0x6627e8d5u);
  EXPECT_EQ(a.v[1], 0xe169c58du);
  EXPECT_EQ(a.v[2], 0xbc57ac4cu);
  EXPECT_EQ(a.v[3], 0x9b00dbd8u);
  auto b = d::philox4x32_full({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu);
  EXPECT_EQ(b.v[0], 0x408f276du);
  EXPECT_EQ(b.v[1], 0x41c83b0eu);
  EXPECT_EQ(b.v[2], 0xa20bc7c6u);
  EXPECT_EQ(b.v[3], 0x6d5451fdu);
  auto c = d::philox4x32_full({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(c.v[0], 0xd16cfe09u);
  EXPECT_EQ(c.v[1], 0x94fdccebu);
  EXPECT_EQ(c.v[2], 0x5001e420u);
  EXPECT_EQ(c.v[3], 0x24126ea1u);
  // The short form is the full form with counter (lo, hi, 0, 0) and key (lo, hi).
  auto s = d::philox4x32(0x0000000500000007ull, 0x1122334455667788ull);
  auto f = d::philox4x32_full({{7, 5, 0, 0}}, 0x55667788u, 0x11223344u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(s.v[i], f.v[i]);
}

TEST(DummyConversions, HalfMatchesTheCompiler) {
#ifdef __FLT16_MAX__
  // Every half code round-trips; random floats round like the compiler's _Float16.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) continue;  // NaN
    float f = d::f16_to_f32(static_cast<uint16_t>(h));
    _Float16 ref = static_cast<_Float16>(f);
    uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    ASSERT_EQ(ref_bits, h);
    ASSERT_EQ(d::f32_to_f16(f), h);
  }
  uint64_t x = 12345;
  for (int i = 0; i < 1000000; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t bits = static_cast<uint32_t>(x >> 32);
    float f = d::bits_f32(bits);
    if (std::isnan(f)) continue;
    _Float16 ref = static_cast<_Float16>(f);
    uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    ASSERT_EQ(d::f32_to_f16(f), ref_bits) << std::hex << bits;
  }
#else
  GTEST_SKIP() << "no _Float16 in this compiler";
#endif
}

TEST(DummyConversions, KnownCodes) {
  EXPECT_EQ(d::f32_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(d::f32_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(d::f32_to_f16(65520.0f), 0x7C00);
  EXPECT_EQ(d::f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(d::f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even
  EXPECT_EQ(d::f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(d::f32_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(d::f32_to_bf16(d::bits_f32(0x3F808000u)), 0x3F80);  // tie to even
  EXPECT_EQ(d::f32_to_bf16(d::bits_f32(0x3F818000u)), 0x3F82);
  EXPECT_EQ(d::f32_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(d::f32_to_e4m3(-1.0f), 0xB8);
  EXPECT_EQ(d::f32_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(d::f32_to_e4m3(464.0f), 0x7E);  // tie, to even
  EXPECT_EQ(d::f32_to_e4m3(465.0f), 0x7F);  // past the largest: NaN (e4m3fn has no inf)
  EXPECT_EQ(d::f32_to_e4m3(std::ldexp(1.0f, -9)), 0x01);
  EXPECT_EQ(d::f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);  // tie, to even
  EXPECT_EQ(d::f32_to_e4m3(std::ldexp(1.5f, -10)), 0x01);
  EXPECT_EQ(d::f32_to_e4m3(std::ldexp(1.0f, -6)), 0x08);  // smallest normal
  EXPECT_EQ(d::f32_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(d::f16_to_e5m2(0x3C00), 0x3C);
  EXPECT_EQ(d::f16_to_e5m2(0x3C80), 0x3C);  // tie, to even
  EXPECT_EQ(d::f16_to_e5m2(0x3D80), 0x3E);
  EXPECT_EQ(d::f16_to_e5m2(0x7BFF), 0x7C);  // overflow to inf
  EXPECT_EQ(d::f16_to_e5m2(0xBC00), 0xBC);
}

TEST(DummyWeights, FirstValuesFollowTheDocumentedFormula) {
  Tensor t = make(DType::F32, 8);
  ASSERT_TRUE(fill_dummy(t).ok());
  for (uint64_t i = 0; i < 8; ++i) {
    uint32_t w = d::philox4x32(i / 4, 1234).v[i % 4];
    double u = static_cast<double>(w >> 8) / 16777216.0;
    // range is fl32(high) - fl32(low), computed in float
    float range = static_cast<float>(1e-3) - static_cast<float>(-1e-3);
    float expect = static_cast<float>(static_cast<double>(static_cast<float>(-1e-3)) + static_cast<double>(range) * u);
    EXPECT_EQ(as_f32(t, i), expect) << i;
    EXPECT_EQ(dummy_element_bits(DType::F32, i, -1e-3, 1e-3, 1234), d::f32_bits(expect));
  }
}

TEST(DummyWeights, KnownValues) {
  // Golden bits for seed 1234, bounds +-1e-3: a change here changes every
  // dummy model; only change them on purpose.
  EXPECT_EQ(dummy_element_bits(DType::F32, 0, -1e-3, 1e-3, 1234), GOLDEN_F32_0);
  EXPECT_EQ(dummy_element_bits(DType::F32, 5, -1e-3, 1e-3, 1234), GOLDEN_F32_5);
  EXPECT_EQ(dummy_element_bits(DType::BF16, 1, -1e-3, 1e-3, 1234), GOLDEN_BF16_1);
  EXPECT_EQ(dummy_element_bits(DType::F16, 2, -1e-3, 1e-3, 1234), GOLDEN_F16_2);
  EXPECT_EQ(dummy_element_bits(DType::F64, 3, -1e-3, 1e-3, 1234), GOLDEN_F64_3);
  EXPECT_EQ(dummy_element_bits(DType::F8_E5M2, 7, -1.0, 1.0, 42), GOLDEN_E5M2_7);
  EXPECT_EQ(dummy_element_bits(DType::F8_E4M3, 9, -1.0, 1.0, 42), GOLDEN_E4M3_9);
}

TEST(DummyWeights, SameBytesAtAnyThreadCount) {
  for (DType dt : kFilled) {
    const int64_t n = 100003;  // odd: chunks end inside Philox blocks
    Tensor ref = make(dt, n);
    ASSERT_TRUE(fill_dummy(ref, -1e-3, 1e-3, 1234, 1).ok());
    for (int threads : {2, 3, 4, 5, 6, 7, 8, 9, 16}) {  // 4, 5, 8 once left the last elements unfilled
      Tensor t = make(dt, n);
      std::fill(t.mutable_bytes().begin(), t.mutable_bytes().end(), std::byte{0xA5});  // unfilled bytes show
      ASSERT_TRUE(fill_dummy(t, -1e-3, 1e-3, 1234, threads).ok());
      ASSERT_EQ(std::memcmp(t.bytes().data(), ref.bytes().data(), ref.nbytes()), 0)
          << dtype_name(dt) << " with " << threads << " threads";
    }
    // Each element is a function of its index alone.
    // (every element: the batched fill equals the one-element formula)
    for (uint64_t i = 0; i < static_cast<uint64_t>(n); ++i) {
      uint64_t bits = 0;
      std::memcpy(&bits, ref.bytes().data() + i * dtype_size(dt), dtype_size(dt));
      ASSERT_EQ(bits, dummy_element_bits(dt, i, -1e-3, 1e-3, 1234)) << dtype_name(dt) << " " << i;
    }
    // A smaller tensor is a prefix of a larger one (values depend on seed, index and dtype only).
    Tensor small = make(dt, 37);
    ASSERT_TRUE(fill_dummy(small).ok());
    EXPECT_EQ(std::memcmp(small.bytes().data(), ref.bytes().data(), small.nbytes()), 0) << dtype_name(dt);
  }
}

TEST(DummyWeights, UnevenSizesAreFilledToTheLastElementAtEveryThreadCount) {
  // Sizes the thread count does not divide: the chunks' rounding must never
  // leave a tail for nobody (the F32 [100003], F64 [50001], BF16 [1024, 1024]).
  const std::pair<DType, int64_t> cases[] = {{DType::F32, 100003},
                                             {DType::F64, 50001},
                                             {DType::BF16, 1024 * 1024},
                                             {DType::F16, 4096 * 3 + 1},
                                             {DType::F8_E4M3, 65537}};
  for (auto [dt, n] : cases) {
    for (int threads = 1; threads <= 9; ++threads) {
      Tensor t = make(dt, n);
      std::fill(t.mutable_bytes().begin(), t.mutable_bytes().end(), std::byte{0xA5});
      ASSERT_TRUE(fill_dummy(t, -1e-3, 1e-3, 1234, threads).ok());
      for (int64_t i : {n - 1, n - 2, n - 3, n - 5, n / 2, int64_t{0}}) {
        uint64_t bits = 0;
        std::memcpy(&bits, t.bytes().data() + i * dtype_size(dt), dtype_size(dt));
        ASSERT_EQ(bits, dummy_element_bits(dt, static_cast<uint64_t>(i), -1e-3, 1e-3, 1234))
            << dtype_name(dt) << " [" << n << "] element " << i << " with " << threads << " threads";
      }
    }
  }
}

TEST(DummyWeights, ValuesLieInRange) {
  const int64_t n = 200000;
  Tensor f = make(DType::F32, n);
  ASSERT_TRUE(fill_dummy(f).ok());
  double sum = 0, lo = 1, hi = -1;
  for (int64_t i = 0; i < n; ++i) {
    float v = as_f32(f, i);
    ASSERT_GE(v, -1e-3f);
    ASSERT_LT(v, 1e-3f);
    sum += v;
    lo = std::min<double>(lo, v);
    hi = std::max<double>(hi, v);
  }
  EXPECT_NEAR(sum / n, 0.0, 1e-5);
  EXPECT_LT(lo, -0.99e-3);
  EXPECT_GT(hi, 0.99e-3);

  Tensor g = make(DType::F64, n);
  ASSERT_TRUE(fill_dummy(g, 2.0, 3.0, 7, 0).ok());
  for (int64_t i = 0; i < n; ++i) {
    double v;
    std::memcpy(&v, g.bytes().data() + i * 8, 8);
    ASSERT_GE(v, 2.0);
    ASSERT_LT(v, 3.0);
  }
  // 16-bit kinds: a value that rounds up to `high` becomes `low`.
  for (DType dt : {DType::F16, DType::BF16}) {
    Tensor h = make(dt, n);
    ASSERT_TRUE(fill_dummy(h, 0.0, 1.0, 9, 0).ok());
    for (int64_t i = 0; i < n; ++i) {
      uint16_t code;
      std::memcpy(&code, h.bytes().data() + i * 2, 2);
      float v = dt == DType::F16 ? d::f16_to_f32(code) : d::bf16_to_f32(code);
      ASSERT_GE(v, 0.0f);
      ASSERT_LT(v, 1.0f) << dtype_name(dt);
    }
  }
}

TEST(DummyWeights, Float8IsDrawnInHalfThenRounded) {
  Tensor t = make(DType::F8_E4M3, 10000);
  ASSERT_TRUE(fill_dummy(t).ok());
  std::set<int> codes;
  for (auto b : t.bytes()) codes.insert(static_cast<int>(b));
  // +-1e-3 is about half of e4m3's smallest step (2^-9): only 0 and +-2^-9 occur.
  for (int c : codes) EXPECT_TRUE(c == 0x00 || c == 0x80 || c == 0x01 || c == 0x81) << c;
  EXPECT_TRUE(codes.count(0x01) && codes.count(0x81));
  // Element by element, the code is the rounded half value.
  Tensor h = make(DType::F16, 10000);
  ASSERT_TRUE(fill_dummy(h).ok());
  Tensor e5 = make(DType::F8_E5M2, 10000);
  ASSERT_TRUE(fill_dummy(e5).ok());
  for (int i = 0; i < 10000; ++i) {
    uint16_t code;
    std::memcpy(&code, h.bytes().data() + i * 2, 2);
    ASSERT_EQ(static_cast<uint8_t>(t.bytes()[i]), d::f32_to_e4m3(d::f16_to_f32(code)));
    ASSERT_EQ(static_cast<uint8_t>(e5.bytes()[i]), d::f16_to_e5m2(code));
  }
}

TEST(DummyWeights, SeedsAndBoundsChangeValues) {
  Tensor a = make(DType::F32, 64), b = make(DType::F32, 64), c = make(DType::F32, 64);
  ASSERT_TRUE(fill_dummy(a, -1e-3, 1e-3, 1, 1).ok());
  ASSERT_TRUE(fill_dummy(b, -1e-3, 1e-3, 2, 1).ok());
  ASSERT_TRUE(fill_dummy(c, 0.5, 0.5, 2, 1).ok());
  EXPECT_NE(std::memcmp(a.bytes().data(), b.bytes().data(), a.nbytes()), 0);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(as_f32(c, i), 0.5f);  // low == high
}

TEST(DummyWeights, NonFloatTensorsAreUntouched) {
  for (DType dt : {DType::I32, DType::I8, DType::U8, DType::I64, DType::BOOL, DType::C64, DType::U16}) {
    Tensor t = make(dt, 33);
    for (size_t i = 0; i < t.nbytes(); ++i) t.mutable_bytes()[i] = static_cast<std::byte>(i * 7);
    ASSERT_TRUE(fill_dummy(t).ok()) << dtype_name(dt);
    for (size_t i = 0; i < t.nbytes(); ++i) ASSERT_EQ(t.bytes()[i], static_cast<std::byte>(i * 7)) << dtype_name(dt);
    EXPECT_FALSE(dummy_fills(dt));
  }
}

TEST(DummyWeights, Errors) {
  Tensor t = make(DType::F32, 4);
  Status st = fill_dummy(t, 1.0, 0.0, 1, 1);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "dummy weight bounds need low <= high, got [1, 0)");
  st = fill_dummy(t, NAN, 0.0, 1, 1);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("must be finite"), std::string::npos);
  st = fill_dummy(t, -INFINITY, 0.0, 1, 1);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);

  Tensor e8 = make(DType::F8_E8M0, 4);
  st = fill_dummy(e8);
  EXPECT_EQ(st.code(), Code::kUnimplemented);
  EXPECT_EQ(st.message(), "dummy weights of dtype F8_E8M0 are not supported");

  std::byte small[6];
  st = fill_dummy(DType::F32, small, 2);
  EXPECT_EQ(st.code(), Code::kOutOfRange);
  EXPECT_EQ(st.message(), "a buffer of 6 bytes cannot hold 2 elements of F32");
  EXPECT_TRUE(fill_dummy(DType::F32, {}, 0).ok());  // empty tensors are fine
}

TEST(DummyCuda, UnavailableWithoutAGpuOrMatchesTheCpu) {
  if (gpu::device_count() == 0) {
    EXPECT_FALSE(gpu::unavailable_reason().empty());
    auto buf = gpu::DeviceBuffer::allocate(64);
    EXPECT_EQ(buf.status().code(), Code::kUnavailable);
    Status st = gpu::fill_dummy_device(DType::F32, nullptr, 16);
    EXPECT_EQ(st.code(), Code::kUnavailable);
    // Argument errors come first, even without a GPU.
    EXPECT_EQ(gpu::fill_dummy_device(DType::F32, nullptr, 16, {1.0, 0.0, 1, 0}).code(), Code::kInvalidArgument);
    return;
  }
  for (DType dt : kFilled) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{4099}, int64_t{1000003}}) {
      Tensor cpu = make(dt, n);
      ASSERT_TRUE(fill_dummy(cpu, -0.5, 0.25, 99, 0).ok());
      auto buf = gpu::DeviceBuffer::allocate(cpu.nbytes());
      ASSERT_TRUE(buf.ok()) << buf.status().to_string();
      ASSERT_TRUE(gpu::fill_dummy_device(dt, *buf, static_cast<uint64_t>(n), {-0.5, 0.25, 99, 0}).ok());
      Tensor back = make(dt, n);
      ASSERT_TRUE(buf->copy_to_host(back.mutable_bytes()).ok());
      ASSERT_EQ(std::memcmp(back.bytes().data(), cpu.bytes().data(), cpu.nbytes()), 0) << dtype_name(dt) << " n=" << n;
    }
  }
}

}  // namespace
}  // namespace wl
