#!/usr/bin/env python3
"""Writes the seed corpora of the fuzzers under tests/fuzz/corpus/ (committed; rerun after changing a layout).

The layouts are described at the top of spec_fuzzer.cpp and dlpack_fuzzer.cpp: little-endian fixed-width fields.
"""
import pathlib
import struct

HERE = pathlib.Path(__file__).resolve().parent / "corpus"


def size(v):
    """A size field: one byte below 0x80, else 0xff and an i64."""
    return struct.pack("<B", v) if 0 <= v < 0x80 else struct.pack("<Bq", 0xFF, v)


def spec_seed(mesh, spec, entries, flags=0, dims=(), ranks=(), mesh_fields=b""):
    """`entries`: how many entries `spec` has; the global rank is len(dims)."""
    out = mesh.encode() + b"\n" + spec.encode() + b"\n" + struct.pack("<B", flags) + mesh_fields
    out += struct.pack("<b", len(dims) - entries + 1) + b"".join(size(d) for d in dims)
    out += struct.pack("<B", len(ranks)) + b"".join(struct.pack("<i", r) for r in ranks)
    return out


def dlpack_seed(mode=0, major=1, minor=3, flags=0, dims=(), strides=None, code=2, bits=32, lanes=1, dev=1, dev_id=0,
                offset=0):
    if strides is None:
        mode |= 4
        strides = [0] * len(dims)
    out = struct.pack("<BIIQ", mode, major, minor, flags)
    out += struct.pack("<bBBHiiQ", len(dims), code, bits, lanes, dev, dev_id, offset)
    return out + b"".join(size(d) + size(s) for d, s in zip(dims, strides))


SEEDS = {
    "spec": {
        # DESIGN.md's worked check: mesh (4,2) over ('x','y'), global (8,4).
        "worked_example": spec_seed("x=4,y=2", "P('x','y')", 2, dims=(8, 4)),
        "tuple_axes": spec_seed("x=4, y=2", "P(('x', 'y'), None)", 2, dims=(8, 4), ranks=(5, 8)),
        "unnamed_mesh": spec_seed("2x1x3", "x, None, z", 3, dims=(4, 7, 9)),
        "uneven": spec_seed("x=4", "P('x')", 1, flags=1, dims=(10,)),
        "indivisible": spec_seed("x=4,y=2", "(None, ('x','y'))", 2, dims=(8, 12)),
        "fields_mesh": spec_seed("", "'y', x", 2, flags=2, mesh_fields=bytes([2, 0, 3, 1, 2]), dims=(6, 6)),
        "replicated": spec_seed("x=2,y=2", "P()", 0, dims=(3, 5), ranks=(-1, 3)),
        # Regressions (spec_test.cpp has the same cases).
        "huge_uneven": spec_seed("x=3", "x", 1, flags=1, dims=(2**63 - 1,)),
        "mesh_size_overflow": spec_seed("", "x", 1, flags=2, mesh_fields=bytes([2, 0]) + size(2**62) + bytes([1])
                                        + size(4), dims=(8,)),
    },
    "dlpack": {
        "versioned_f32_2x3": dlpack_seed(dims=(2, 3), strides=(3, 1)),
        "legacy_i64_strided": dlpack_seed(mode=1, dims=(3, 2), strides=(1, 3), code=0, bits=64),
        "readonly_offset": dlpack_seed(flags=1, dims=(4,), strides=(2,), code=2, bits=16, offset=8),
        "empty_null_data": dlpack_seed(mode=8, dims=(0, 3), code=5, bits=128),
        "cuda_device": dlpack_seed(dims=(5,), dev=2, dev_id=1, code=4, bits=16),
        "scalar_bool": dlpack_seed(mode=1 | 2, code=6, bits=8),
        "broadcast_zero_stride": dlpack_seed(dims=(100, 3), strides=(0, 1), code=1, bits=8),
        # Regressions (dlpack_test.cpp has the same cases).
        "empty_negative_stride": dlpack_seed(dims=(0,), strides=(-1,)),
        "extent_overflow": dlpack_seed(dims=(2,), strides=(2**63 - 1,), code=1, bits=8),
        "empty_huge_rows": dlpack_seed(dims=(10**12, 0), strides=(0, 0), code=0, bits=64),
    },
}

for name, seeds in SEEDS.items():
    d = HERE / name
    d.mkdir(parents=True, exist_ok=True)
    for seed, data in seeds.items():
        (d / seed).write_bytes(data)
    print(f"{d}: {len(seeds)} seeds")
