// ds_fp4's e4m3 round trip of activations (formats.md "ds_fp4 extra numerics").
#pragma once

#include <cstdint>

#include "jit/kernel_key.h"

namespace moejit {

// formats::ds_act_roundtrip(src, n, dst), 16 values per AVX-512 instruction when
// `isa` has AVX-512: the same bits (the scalar e4m3_round's operations, none of
// which depends on MXCSR), else the scalar code itself. dst may be src.
void ds_act_roundtrip_n(const uint16_t* src, int64_t n, uint16_t* dst, jit::Isa isa);

}  // namespace moejit
