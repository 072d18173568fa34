#!/usr/bin/env python3
"""PyTorch's float8 casts as the reference for the emulated cuda_fp8.h (dev/emu/test_emu_fp8.cpp).

    .venv/bin/python dev/emu/fp8_reference.py > dev/emu/fp8_reference.txt

Writes two tables, each value as its fp32 bit pattern in hex:
  decode CODE E4M3 E5M2     every byte: the value it holds in e4m3fn and in e5m2 (torch's view as float)
  encode X E4M3 E5M2 E4M3_SAT E5M2_SAT
                            X's code in e4m3fn and e5m2 as torch rounds it (ties to even; beyond the
                            largest finite value NaN in e4m3fn, infinity in e5m2), and the code of X
                            clamped to the format's largest finite value (what __NV_SATFINITE gives)
The X are every finite value of both formats, the midpoints between neighbours (the ties), the fp32
values just beside each midpoint, values beyond the largest finite ones, infinities, and 1500 random
values spread over 2^-24 .. 2^17 in magnitude, both signs. NaN inputs are checked by definition in the
test, not here (PyTorch does not fix the sign of the NaN it returns)."""
import random
import struct

import torch


def bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def codes(values, dtype, limit=None):
    t = torch.tensor(values, dtype=torch.float32)
    if limit is not None:
        t = t.clamp(-limit, limit)
    return t.to(dtype).view(torch.uint8).tolist()


def main():
    all_codes = torch.arange(256, dtype=torch.uint8)
    e4 = all_codes.view(torch.float8_e4m3fn).to(torch.float32).tolist()
    e5 = all_codes.view(torch.float8_e5m2).to(torch.float32).tolist()
    for c in range(256):
        print(f"decode {c:02x} {bits(e4[c]):08x} {bits(e5[c]):08x}")

    xs = set()
    for table in (e4, e5):
        finite = sorted({v for v in table if v == v and abs(v) != float("inf")})
        xs.update(finite)
        for a, b in zip(finite, finite[1:]):
            mid = struct.unpack("<f", struct.pack("<f", (a + b) / 2))[0]
            xs.add(mid)
            xs.add(float(torch.nextafter(torch.tensor(mid), torch.tensor(float("inf")))))
            xs.add(float(torch.nextafter(torch.tensor(mid), torch.tensor(float("-inf")))))
    for m in (448.0, 57344.0):
        for k in (1.01, 1.0625, 1.07, 1.125, 1.5, 2.0, 1e3):
            xs.update({m * k, -m * k})
    xs.update({float("inf"), float("-inf"), 1e30, -1e30, 2.0 ** -30, -(2.0 ** -30), 0.0, -0.0})
    rng = random.Random(48)
    for _ in range(1500):
        xs.add(struct.unpack("<f", struct.pack("<f", rng.choice((-1, 1)) * 2.0 ** rng.uniform(-24, 17)))[0])
    xs = sorted(xs, key=lambda v: (v, str(v)))
    e4n, e5n = codes(xs, torch.float8_e4m3fn), codes(xs, torch.float8_e5m2)
    e4s, e5s = codes(xs, torch.float8_e4m3fn, 448.0), codes(xs, torch.float8_e5m2, 57344.0)
    for x, a, b, c, d in zip(xs, e4n, e5n, e4s, e5s):
        print(f"encode {bits(x):08x} {a:02x} {b:02x} {c:02x} {d:02x}")


if __name__ == "__main__":
    main()
