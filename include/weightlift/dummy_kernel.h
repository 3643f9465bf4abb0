// weightlift/dummy_kernel.h: the arithmetic of dummy weights (dummy.h),
// shared by the CPU fill (src/model/dummy.cpp), the CUDA kernel
// (src/cuda/backend.cu, through gpu/cuda_abi.h) and the fake GPU backend: the
// Philox generator and the bit-exact conversions, written with integer
// operations and single IEEE roundings so that host and device give identical
// bytes. Compiled by nvcc too: no other weightlift header, C++17.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define WL_HD __host__ __device__ __forceinline__
#else
#define WL_HD inline
#endif

namespace wl::dummy {

struct U4 {
  uint32_t v[4];
};

WL_HD void mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

// Philox4x32-10 (Salmon et al., SC'11) over a full 128-bit counter: the one
// round loop (philox4x32_lanes is its host-only, N-at-once twin).
WL_HD U4 philox4x32_full(U4 ctr, uint32_t key0, uint32_t key1) {
  uint32_t c0 = ctr.v[0], c1 = ctr.v[1], c2 = ctr.v[2], c3 = ctr.v[3], k0 = key0, k1 = key1;
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(0xD2511F53u, c0, &hi0, &lo0);
    mulhilo(0xCD9E8D57u, c2, &hi1, &lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return U4{{c0, c1, c2, c3}};
}

// Block `counter` of the stream keyed by `seed` (counter words 2 and 3 zero).
WL_HD U4 philox4x32(uint64_t counter, uint64_t seed) {
  return philox4x32_full(U4{{static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0, 0}},
                         static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// Blocks first_counter .. first_counter+N-1 at once (host only), words in
// block order: out[4*n + j] is word j of block first_counter + n.
template <int N>
inline void philox4x32_lanes(uint64_t first_counter, uint64_t seed, uint32_t* out) {
  uint32_t c0[N], c1[N], c2[N], c3[N];
  for (int n = 0; n < N; ++n) {
    uint64_t ctr = first_counter + static_cast<uint64_t>(n);
    c0[n] = static_cast<uint32_t>(ctr);
    c1[n] = static_cast<uint32_t>(ctr >> 32);
    c2[n] = 0;
    c3[n] = 0;
  }
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    for (int n = 0; n < N; ++n) {
      uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0[n];
      uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2[n];
      uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[n] ^ k0;
      uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[n] ^ k1;
      c1[n] = static_cast<uint32_t>(p1);
      c3[n] = static_cast<uint32_t>(p0);
      c0[n] = n0;
      c2[n] = n2;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  for (int n = 0; n < N; ++n) {
    out[4 * n] = c0[n];
    out[4 * n + 1] = c1[n];
    out[4 * n + 2] = c2[n];
    out[4 * n + 3] = c3[n];
  }
}

WL_HD uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
WL_HD float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// fl32(low + range * u) for u = k * 2^-24: the product is exact in double, so
// one double addition (fused or not) and one narrowing give the same result
// on every compiler and on the GPU.
WL_HD float uniform_f32(uint32_t word, float low, float range) {
  double u = static_cast<double>(word >> 8) * (1.0 / 16777216.0);
#if defined(__CUDA_ARCH__)
  double t = __dadd_rn(u * static_cast<double>(range), static_cast<double>(low));
  return __double2float_rn(t);
#else
  double t = u * static_cast<double>(range) + static_cast<double>(low);
  return static_cast<float>(t);
#endif
}

WL_HD double uniform_f64(uint32_t w0, uint32_t w1, double low, double range) {
  uint64_t k = (static_cast<uint64_t>(w0) << 21) | (w1 >> 11);
  double u = static_cast<double>(k) * (1.0 / 9007199254740992.0);
#if defined(__CUDA_ARCH__)
  return __dadd_rn(__dmul_rn(u, range), low);
#else
  volatile double prod = u * range;  // no contraction into an FMA
  return prod + low;
#endif
}

// float -> IEEE half, round to nearest even (overflow -> inf, NaN kept quiet).
WL_HD uint16_t f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7FFFFFFFu;
  if (ax >= 0x7F800000u) return static_cast<uint16_t>(sign | (ax > 0x7F800000u ? 0x7E00u : 0x7C00u));
  if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to >= 65520: inf
  if (ax < 0x38800000u) {                                               // below 2^-14: half subnormal (or zero)
    if (ax < 0x33000000u) return static_cast<uint16_t>(sign);           // < 2^-25 rounds to 0 (tie at 2^-25 -> even 0)
    uint32_t e = ax >> 23;
    uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126 - e;  // value = m * 2^(e-150); subnormal unit 2^-24
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t r = ax + 0xFFFu + ((ax >> 13) & 1u);
  r -= (127u - 15u) << 23;
  return static_cast<uint16_t>(sign | (r >> 13));
}

WL_HD float f16_to_f32(uint16_t h) {
  uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  uint32_t out;
  if (e == 0) {
    if (m == 0) {
      out = sign;
    } else {  // subnormal: normalise
      e = 113;
      while (!(m & 0x400u)) {
        m <<= 1;
        --e;
      }
      out = sign | (e << 23) | ((m & 0x3FFu) << 13);
    }
  } else if (e == 31) {
    out = sign | 0x7F800000u | (m << 13);
  } else {
    out = sign | ((e + 112u) << 23) | (m << 13);
  }
  return bits_f32(out);
}

WL_HD uint16_t f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}
WL_HD float bf16_to_f32(uint16_t b) { return bits_f32(static_cast<uint32_t>(b) << 16); }

// half -> float8 e5m2 (the top byte of a half), nearest even; overflow -> inf.
WL_HD uint8_t f16_to_e5m2(uint16_t h) {
  if ((h & 0x7FFFu) > 0x7C00u) return static_cast<uint8_t>((h >> 8) | 0x02u);  // NaN stays NaN
  return static_cast<uint8_t>((h + 0x7Fu + ((h >> 8) & 1u)) >> 8);
}

// float -> float8 e4m3fn, nearest even; |x| that rounds past 448 -> NaN (0x7F).
WL_HD uint8_t f32_to_e4m3(float f) {
  uint32_t x = f32_bits(f);
  uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  uint32_t ax = x & 0x7FFFFFFFu;
  if (ax >= 0x43F00000u)
    return static_cast<uint8_t>(sign | 0x7Fu);  // >= 480 (or inf/NaN); (464, 480) rounds to 0x7F below
  if (ax < 0x3C800000u) {                       // below 2^-6: subnormal unit 2^-9
    if (ax < 0x3A000000u) return sign;          // < 2^-11 (half the unit... and the tie) -> 0
    uint32_t e = ax >> 23;
    uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 141 - e;  // value = m * 2^(e-150), unit 2^-9
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint8_t>(sign | q);
  }
  uint32_t r = ax + 0x7FFFFu + ((ax >> 20) & 1u);
  r -= (127u - 7u) << 23;
  return static_cast<uint8_t>(sign | (r >> 20));
}

// Kinds of element the generator writes.
enum Kind : int { kF32 = 0, kF16 = 1, kBF16 = 2, kE4M3 = 3, kE5M2 = 4, kF64 = 5 };

struct Params {
  float low32, range32, high32;
  uint16_t low16;  // low as the 16-bit code of the kind (F16 for the fp8 kinds)
  double low64, range64, high64;
  uint64_t seed;
};

// Element `i` of one 32-bit word `w` (all kinds but F64); returns the bits.
WL_HD uint32_t element_from_word(int kind, uint32_t w, const Params& p) {
  float v = uniform_f32(w, p.low32, p.range32);
  if (kind == kF32) {
    if (!(v < p.high32)) v = p.low32;
    return f32_bits(v);
  }
  if (kind == kBF16) {
    uint16_t b = f32_to_bf16(v);
    if (!(bf16_to_f32(b) < p.high32)) b = p.low16;
    return b;
  }
  uint16_t h = f32_to_f16(v);
  if (!(f16_to_f32(h) < p.high32)) h = p.low16;
  if (kind == kF16) return h;
  if (kind == kE5M2) return f16_to_e5m2(h);
  return f32_to_e4m3(f16_to_f32(h));
}

}  // namespace wl::dummy
