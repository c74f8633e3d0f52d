#!/usr/bin/env python3
"""Independent GGUF v3 reader (written from the GGUF spec, sharing no code with dsflash).

Checks that a file written by dsflash's writer is a standard GGUF file: header, every
metadata value, tensor infos, alignment, data offsets inside the file and non-overlapping,
and that each F32 tensor's bytes are finite floats. Usage: gguf_independent_check.py FILE
[EXPECTED_TENSORS]. Exits non-zero with a message on the first problem.
"""
import math
import struct
import sys

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
# ggml type id -> (block elements, block bytes)
TYPES = {0: (1, 4), 1: (1, 2), 8: (32, 34), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
         14: (256, 210), 30: (1, 2), 39: (32, 17)}


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            sys.exit(f"truncated at {self.pos}")
        (v,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return v

    def string(self):
        n = self.take("<Q")
        s = self.data[self.pos:self.pos + n]
        self.pos += n
        return s.decode("utf-8")

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("<I"), self.take("<Q")
            return [self.value(et) for _ in range(n)]
        return self.take(SCALARS[t])


def main():
    path = sys.argv[1]
    data = open(path, "rb").read()
    r = Reader(data)
    if data[:4] != b"GGUF":
        sys.exit("bad magic")
    r.pos = 4
    version, n_tensors, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
    if version != 3:
        sys.exit(f"version {version}")
    kv = {}
    for _ in range(n_kv):
        k = r.string()
        kv[k] = r.value(r.take("<I"))
    align = kv.get("general.alignment", 32)
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        ne = [r.take("<Q") for _ in range(r.take("<I"))]
        ttype, off = r.take("<I"), r.take("<Q")
        infos.append((name, ne, ttype, off))
    data_start = (r.pos + align - 1) // align * align
    spans = []
    for name, ne, ttype, off in infos:
        if ttype not in TYPES:
            sys.exit(f"{name}: unexpected type {ttype}")
        be, bb = TYPES[ttype]
        n = math.prod(ne)
        size = n // be * bb
        if off % align or data_start + off + size > len(data):
            sys.exit(f"{name}: offset {off} size {size} outside or misaligned")
        spans.append((off, off + size, name))
        if ttype == 0:
            vals = struct.unpack_from(f"<{n}f", data, data_start + off)
            if not all(math.isfinite(v) for v in vals):
                sys.exit(f"{name}: non-finite f32 values")
    spans.sort()
    for a, b in zip(spans, spans[1:]):
        if a[1] > b[0]:
            sys.exit(f"{a[2]} overlaps {b[2]}")
    if len(sys.argv) > 2 and len(infos) != int(sys.argv[2]):
        sys.exit(f"{len(infos)} tensors, expected {sys.argv[2]}")
    arch = kv.get("general.architecture")
    print(f"ok: {path}: GGUF v{version}, {n_kv} keys, {n_tensors} tensors, architecture {arch}, alignment {align}")


if __name__ == "__main__":
    main()
