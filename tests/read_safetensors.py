#!/usr/bin/env python3
"""Reads a safetensors file with the standard library only and prints one line per tensor:
name dtype shape first-value. Exits non-zero if the file breaks the format."""
import json
import struct
import sys

SIZES = {"F8_E4M3": 1, "F8_E5M2": 1, "F16": 2, "BF16": 2, "F32": 4, "F64": 8, "I64": 8}
FLOAT8 = {"F8_E4M3": (3, 7, False), "F8_E5M2": (2, 15, True)}  # mantissa bits, bias, has inf
CODES = {"F16": "e", "F32": "f", "F64": "d", "I64": "q"}


def float8_value(code, mantissa_bits, bias, has_inf):
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code & 0x7F) >> mantissa_bits, code & ((1 << mantissa_bits) - 1)
    if (code & 0x7F) == 0x7F or (has_inf and exponent == 0x1F and mantissa):
        return float("nan")
    if has_inf and exponent == 0x1F:
        return sign * float("inf")
    if exponent == 0:
        return sign * mantissa * 2.0 ** (1 - bias - mantissa_bits)
    return sign * (1 + mantissa / (1 << mantissa_bits)) * 2.0 ** (exponent - bias)


def first_value(dtype, body, begin):
    if dtype in FLOAT8:
        return float8_value(body[begin], *FLOAT8[dtype])
    if dtype == "BF16":  # the upper half of a float32: widen by appending two zero bytes below it
        (bits,) = struct.unpack_from("<H", body, begin)
        return struct.unpack("<f", struct.pack("<I", bits << 16))[0]
    return struct.unpack_from("<" + CODES[dtype], body, begin)[0]


with open(sys.argv[1], "rb") as f:
    data = f.read()
(n,) = struct.unpack("<Q", data[:8])
header = json.loads(data[8:8 + n])
body = data[8 + n:]
ends = []
for name, entry in sorted(header.items()):
    if name == "__metadata__":
        assert all(isinstance(v, str) for v in entry.values()), "metadata values must be strings"
        continue
    begin, end = entry["data_offsets"]
    count = 1
    for d in entry["shape"]:
        count *= d
    assert end - begin == count * SIZES[entry["dtype"]], name
    ends.append((begin, end))
    first = first_value(entry["dtype"], body, begin) if count else None
    print(name, entry["dtype"], entry["shape"], repr(first))
covered = 0
for begin, end in sorted(ends):
    assert begin == covered, "gap or overlap"
    covered = end
assert covered == len(body), "trailing bytes"
