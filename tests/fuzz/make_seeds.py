#!/usr/bin/env python3
"""Writes the hand-made seed corpora of the fuzz targets (committed; rerun to regenerate):
small valid GGUF files (v2, v3, a split pair) and malformed ones that each break one rule
the reader enforces, plus text, chat and request seeds."""
import os
import struct
import sys

here = os.path.dirname(os.path.abspath(__file__))
out = os.path.join(here, "corpus")


def s(x: bytes) -> bytes:
    return struct.pack("<Q", len(x)) + x


def kv(key, typ, payload):
    return s(key.encode()) + struct.pack("<I", typ) + payload


U32, I32, F32, BOOL, STR, ARR, U64 = 4, 5, 6, 7, 8, 9, 10


def gguf(version=3, kvs=None, tensors=None, align=32, n_tensors=None, n_kv=None):
    kvs = kvs if kvs is not None else [
        kv("general.architecture", STR, s(b"deepseek41")),
        kv("general.name", STR, s(b"seed")),
        kv("general.alignment", U32, struct.pack("<I", align)),
        kv("tokenizer.ggml.tokens", ARR, struct.pack("<IQ", STR, 3) + s(b"a") + s(b"b") + s(b"<s>")),
        kv("deepseek41.block_count", U32, struct.pack("<I", 1)),
        kv("x.f", F32, struct.pack("<f", 1.5)),
        kv("x.b", BOOL, b"\x01"),
    ]
    tensors = tensors if tensors is not None else [("t.f32", [4], 0, 16), ("t.q8", [32], 8, 34)]
    head = b"GGUF" + struct.pack("<I", version)
    cnt = struct.pack("<QQ", n_tensors if n_tensors is not None else len(tensors), n_kv if n_kv is not None else len(kvs))
    if version == 1:
        cnt = struct.pack("<II", len(tensors), len(kvs))
    body = b"".join(kvs)
    info, off = b"", 0
    for name, dims, typ, nbytes in tensors:
        info += s(name.encode()) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        info += struct.pack("<IQ", typ, off)
        off += (nbytes + align - 1) // align * align
    blob = head + cnt + body + info
    blob += b"\0" * ((-len(blob)) % align)
    return blob + bytes(range(256)) * (off // 256 + 1)


def write(sub, name, data):
    d = os.path.join(out, sub)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    good = gguf()
    write("gguf", "valid_v3.bin", good)
    write("gguf", "valid_v2.bin", gguf(version=2))
    write("gguf", "truncated_header.bin", good[:10])
    write("gguf", "truncated_kv.bin", good[:60])
    write("gguf", "truncated_data.bin", good[: len(good) - 300])
    write("gguf", "huge_tensor_count.bin", gguf(n_tensors=1 << 62))
    write("gguf", "huge_kv_count.bin", gguf(n_kv=1 << 40))
    write("gguf", "huge_string.bin", gguf(kvs=[s(b"k") + struct.pack("<I", STR) + struct.pack("<Q", 1 << 60)]))
    write("gguf", "bad_value_type.bin", gguf(kvs=[kv("k", 99, b"\0" * 8)]))
    write("gguf", "dims_overflow.bin", gguf(tensors=[("t", [1 << 40, 1 << 40], 0, 16)]))
    write("gguf", "zero_dim.bin", gguf(tensors=[("t", [0], 0, 0)]))
    write("gguf", "too_many_dims.bin", gguf(tensors=[("t", [1] * 9, 0, 4)]))
    write("gguf", "bad_tensor_type.bin", gguf(tensors=[("t", [4], 1234, 16)]))
    write("gguf", "duplicate_tensor.bin", gguf(tensors=[("t", [4], 0, 16), ("t", [4], 0, 16)]))
    write("gguf", "bad_alignment.bin", gguf(align=3))
    write("gguf", "nested_arrays.bin", gguf(kvs=[kv("k", ARR, (struct.pack("<IQ", ARR, 1)) * 40 + struct.pack("<IQ", U32, 0))]))
    write("gguf", "array_count_huge.bin", gguf(kvs=[kv("k", ARR, struct.pack("<IQ", U64, 1 << 61))]))
    write("gguf", "wrong_magic.bin", b"GGML" + good[4:])
    write("gguf", "version_99.bin", gguf(version=99))
    # split seeds: byte 0 chooses where the input is cut into two shards
    write("gguf_split", "pair.bin", bytes([128]) + good + good)
    write("gguf_split", "short.bin", bytes([3]) + good[:40])
    write("text", "ascii.txt", b"Hello world, 12345 tokens!\n")
    write("text", "unicode.txt", "Ünïcödé 今天 🙂 — ok".encode())
    write("text", "invalid_utf8.txt", b"\xff\xfe\xc3(\xe2\x28\xa1 ok \xf0\x9f\x99")
    write("text", "specials.txt", b"<s>hi</s><|User|>x<|Assistant|>")
    write("ids", "ids.bin", bytes(range(64)))
    write("ids", "bytes.bin", b"\x00\x01\xff\xfe" * 16)
    write("chat", "turns.bin", b"\x07You are helpful.\0What is 2+2?\0Four.\0And 3+3?")
    write("chat", "empty.bin", b"\x00")
    # GenerateRequest (protobuf): prompt "hi", max_new_tokens 8 -- fields as in inference.proto
    write("request", "prompt.bin", b"\x12\x02hi")
    write("request", "junk.bin", b"\xff\xff\xff\xff\x0f\x08\x96\x01")


if __name__ == "__main__":
    sys.exit(main())
