"""What each format's arrays look like (docs/FORMATS.md): bytes per row, block
scales, per-row scales, and the array dtypes that may hold them.

The C library checks K rules and pointers; this table lets the binding check the
*arrays* (shapes, dtypes, strides) before any pointer reaches it, and infer
``hidden`` / ``intermediate`` / ``rows`` / ``cols`` from the banks.
"""

from __future__ import annotations

from dataclasses import dataclass

# Logical dtype names (numpy / ml_dtypes / torch names) that may hold each kind of array.
BYTES = ("uint8", "int8")
BITS16 = ("bfloat16", "uint16", "int16")
E4M3 = BYTES + ("float8_e4m3fn",)
E5M2 = BYTES + ("float8_e5m2",)
E8M0 = BYTES + ("float8_e8m0fnu",)
PACKED_E2M1 = BYTES + ("float4_e2m1fn_x2",)
FLOAT32 = ("float32",)


@dataclass(frozen=True)
class Layout:
    name: str
    data_dtypes: tuple[str, ...]
    k_multiple: int  # K % k_multiple == 0 (1: any K)
    block_len: int  # elements per block of a GGUF block format, else 0
    block_bytes: int  # bytes of such a block
    bytes_per_elem: float  # for the plain formats
    scale_kind: str | None  # None, "fp8_block", "e8m0", "e4m3"
    scale_group: int  # elements of K per scale column
    row_scales: bool
    description: str

    def row_bytes(self, k: int) -> int:
        if self.block_len:
            return k // self.block_len * self.block_bytes
        return int(k * self.bytes_per_elem)

    def k_from_row_bytes(self, nbytes: int) -> int | None:
        """K of a row of `nbytes` bytes, or None when no K gives exactly that."""
        if self.block_len:
            if nbytes % self.block_bytes:
                return None
            k = nbytes // self.block_bytes * self.block_len
        else:
            k = nbytes / self.bytes_per_elem
            if k != int(k):
                return None
            k = int(k)
        return k if k >= 1 and self.row_bytes(k) == nbytes else None

    def k_problem(self, k: int) -> str | None:
        if k < 1:
            return "must be >= 1"
        if k % self.k_multiple:
            return f"must be a multiple of {self.k_multiple} for {self.name}"
        return None

    def scale_shape(self, rows: int, k: int) -> tuple[int, int]:
        """[scale rows, scale columns] of one [rows, k] matrix (columns before padding)."""
        cols = -(-k // self.scale_group)
        srows = -(-rows // 128) if self.scale_kind == "fp8_block" else rows
        return srows, cols

    def scale_dtypes(self, scale_dtype: int) -> tuple[str, ...]:
        if self.scale_kind == "fp8_block":
            return FLOAT32 if scale_dtype == 1 else BITS16
        if self.scale_kind == "e8m0":
            return E8M0
        return E4M3


def _plain(name, dtypes, bpe, desc, k_multiple=1, scale_kind=None, group=0, row_scales=False):
    return Layout(name, dtypes, k_multiple, 0, 0, bpe, scale_kind, group, row_scales, desc)


def layout(format_name: str, group_size: int = 0) -> Layout | None:
    """The layout of a format by name (group_size: mxfp8's 0 = 32, 32, 64, 128); None
    for a format id this package does not describe."""
    g = group_size or 32
    table = {
        "bf16": _plain("bf16", BITS16, 2, "2 bytes per weight"),
        "nvfp4": _plain("nvfp4", PACKED_E2M1, 0.5, "two e2m1 codes per byte, low nibble first", 16, "e4m3", 16, True),
        "mxfp4": _plain("mxfp4", PACKED_E2M1, 0.5, "two e2m1 codes per byte, low nibble first", 32, "e8m0", 32),
        "ds_fp4": _plain("ds_fp4", PACKED_E2M1, 0.5, "two e2m1 codes per byte, low nibble first", 32, "e8m0", 32),
        "q4_0": Layout("q4_0", BYTES, 32, 32, 18, 0, None, 0, False, "blocks of 32 weights in 18 bytes"),
        "fp8_block": _plain("fp8_block", E4M3, 1, "1 byte (e4m3) per weight", 1, "fp8_block", 128),
        "q8_0": Layout("q8_0", BYTES, 32, 32, 34, 0, None, 0, False, "blocks of 32 weights in 34 bytes"),
        "mxfp8_e4m3": _plain("mxfp8_e4m3", E4M3, 1, "1 byte (e4m3) per weight", g, "e8m0", g),
        "mxfp8_e5m2": _plain("mxfp8_e5m2", E5M2, 1, "1 byte (e5m2) per weight", g, "e8m0", g),
    }
    # GGUF K-quants: super-blocks of 256 weights with their scales inline, as ggml stores them.
    for name, nbytes in (("q4_K", 144), ("q5_K", 176), ("q6_K", 210), ("q2_K", 84), ("q3_K", 110)):
        table[name] = Layout(name, BYTES, 256, 256, nbytes, 0, None, 0, False,
                             f"super-blocks of 256 weights in {nbytes} bytes")
    return table.get(format_name)
