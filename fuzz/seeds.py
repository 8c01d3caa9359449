"""Writes the seed corpora of fuzz/corpus/ from the repository's real traces.

    python3 fuzz/seeds.py

- pickle_snapshot: the small snapshot fixtures as they are, and the real H200
  snapshots cut down (a few segments, blocks and trace entries, stack frames
  shortened) and pickled again with protocols 2, 4 and 5;
- csv_trace: the head of each real CSV trace (its first 200 events), and the test
  fixture's;
- rmm_log: the same heads written as RMM's replay log (pointers made up from the
  ids), plus the README's example;
- ipc_handle: handle bytes (legacy and mempool), as bytes, as hex and with the
  checksum to be fixed up (the first byte picks the mode: see src/ipc.rs);
- capi_args: short programs of the C ABI target (see src/capi.rs);
- pool_ops: programs of the pool target (see src/pool.rs): a step of training
  made and freed a few times, on each kind of pool the first bytes choose;
- torch_hooks: programs of PyTorch's hooks (see src/torch.rs): tensors made,
  used on another stream and freed, a private pool's life, and bad arguments;
- cupy_hooks: programs of CuPy's allocator (see src/cupy.rs): arrays made on
  each stream and freed, with hooks and before any, and failures of each kind.

Files the fuzzer found (crashes fixed, and its queue when kept) are added by hand
and are not rewritten here.
"""
import glob
import os
import pickle
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORPUS = os.path.join(HERE, "corpus")


def out(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def cut_snapshot(snap, segments, blocks, entries, frames):
    def short(rec):
        rec = dict(rec)
        if "frames" in rec:
            rec["frames"] = rec["frames"][:frames]
        return rec

    segs = []
    for s in snap["segments"][:segments]:
        s = short(s)
        s["blocks"] = [short(b) for b in s.get("blocks", [])[:blocks]]
        segs.append(s)
    cut = dict(snap)
    cut["segments"] = segs
    cut["device_traces"] = [[short(e) for e in t[:entries]] for t in snap["device_traces"]]
    return cut


def pickles():
    fixtures = os.path.join(ROOT, "crates/emm-trace/tests/fixtures")
    for p in sorted(glob.glob(os.path.join(fixtures, "*.pickle"))):
        name = os.path.basename(p)
        if name.startswith("h200_"):
            with open(p, "rb") as f:
                snap = pickle.load(f)
            base = name[: -len(".pickle")]
            small = cut_snapshot(snap, 3, 4, 40, 2)
            for proto in (2, 4, 5):
                out("pickle_snapshot", f"{base}_cut_p{proto}.pickle", pickle.dumps(small, protocol=proto))
            more = cut_snapshot(snap, 8, 16, 300, 1)
            out("pickle_snapshot", f"{base}_cut300_p4.pickle", pickle.dumps(more, protocol=4))
        else:
            with open(p, "rb") as f:
                out("pickle_snapshot", name, f.read())


def heads():
    files = sorted(glob.glob(os.path.join(ROOT, "crates/emm-cli/traces/*.csv")))
    files.append(os.path.join(ROOT, "crates/emm-trace/tests/fixtures/llama_generate_h100.csv"))
    for p in files:
        with open(p) as f:
            lines = [next(f) for _ in range(201)]
        yield os.path.basename(p)[: -len(".csv")], lines


def text():
    for name, lines in heads():
        out("csv_trace", f"{name}_head.csv", "".join(lines))
        rmm = ["Thread,Time,Action,Pointer,Size,Stream\n"]
        sizes = {}
        for i, line in enumerate(lines[1:]):
            op, ident, size, stream = line.strip().split(",")
            ptr = 0x7F00_0000_0000 + int(ident) * 0x1000
            if op == "a":
                sizes[ident] = size
                rmm.append(f"1,{i * 0.001:.6f},allocate,{ptr:#x},{size},{int(stream):#x}\n")
            else:
                rmm.append(f"1,{i * 0.001:.6f},free,{ptr:#x},{sizes.get(ident, 0)},{int(stream):#x}\n")
        out("rmm_log", f"{name}_head.log", "".join(rmm))
    out(
        "rmm_log",
        "readme_example.log",
        "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x7f00,256,0x0\n"
        "1,0.2,allocate,0x7f10,64,0x0\n1,0.3,free,0x7f00,256,0x0\n"
        "1,0.4,allocate failure,0x0,1099511627776,0x0\n1,0.5,free,0xdead,1,0x0\n",
    )


def fnv1a(b):
    h = 0xCBF29CE484222325
    for x in b:
        h ^= x
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def handle(kind, base, offset, size):
    body = b"EMMIPC" + bytes([2, kind])
    if kind == 1:
        body += bytes(range(64)) + struct.pack("<QQQ", base, offset, size) + bytes(range(16)) + struct.pack("<I", 4242)
    else:
        body += bytes(range(64)) + struct.pack("<iI", 7, 4242) + struct.pack("<QQQ", base, offset, size) + bytes(range(16))
    return body + struct.pack("<Q", fnv1a(body))


def ipc():
    for kind, label in ((1, "legacy"), (2, "mempool")):
        h = handle(kind, 1 << 21, 4096, 1 << 20)
        out("ipc_handle", f"{label}_bytes", b"\x00" + h)
        out("ipc_handle", f"{label}_hex", b"\x01" + h.hex().encode())
        out("ipc_handle", f"{label}_fixup", b"\x02" + h[:-8] + b"\x00" * 8)
        bad = handle(kind, 100, 90, 20)
        out("ipc_handle", f"{label}_range_outside", b"\x02" + bad)


def capi():
    # Op codes as in src/capi.rs: 2 alloc, 3 free, 4 export, 5 open, 12 array
    # create, 13 get/set, 14 lock, 15 dlpack, 16 move, 18 history, 19 info.
    out("capi_args", "alloc_free", bytes([2, 7, 5, 0, 3, 0, 0, 0]))
    out("capi_args", "alloc_export_open", bytes([2, 4, 12, 4, 0, 0, 0, 0, 4, 12, 200, 1, 5, 0, 0, 255, 0, 4, 0, 0, 0, 4, 8, 4, 8, 200, 1, 5, 0, 0, 3, 1, 6, 1] + [0] * 8))
    out("capi_args", "array", bytes([12, 2, 32, 2, 2, 3, 2, 4, 1, 1, 0, 13, 0, 2, 2, 1, 2, 0, 0, 0, 0, 0, 4, 0, 14, 0, 0, 15, 0, 1, 16, 0, 1, 17, 0]))
    out("capi_args", "strings", b"\x00\x0apool_limit\x02lo\x01\x08" + b"pool" + b"\x00" * 8 + b"\x01\x01\x08\x18num_ooms\x01\x07\x20\x01\x09\x10\x01")
    out("capi_args", "history", bytes([18, 16, 0, 18, 0, 1, 19, 1, 0, 0, 0, 0, 0, 0, 0]))


def pool():
    # src/pool.rs: flags (1 expandable, 2 merging, 4 stream pools, 8 thread
    # caches, 16 piece share, 32 replaced pieces, 64/128 a lagging device), the
    # capacity (16 MiB << n), then steps: 0-2 allocate (size: 2^e plus e/256 of it
    # times m; stream), 3-4 free (index), 5 trim, 6 limit or threshold, 7 stats,
    # snapshot and peak reset.
    def alloc(e, m, s):
        return [0, e, m, s]

    step = []
    for k in range(6):  # activations of growing and shrinking sizes on two streams
        step += alloc(20 + k % 5, 17 * k % 256, k % 2)
    step += alloc(12, 3, 0) + alloc(9, 0, 0)  # small blocks among them
    step += [3, 2, 4, 0, 3, 5, 3, 1]  # freed in another order
    weights = alloc(24, 0, 0) + alloc(23, 128, 0)
    program = weights + step * 3 + [7] + step + [5, 6, 1, 1] + step + [6, 0, 7]
    for flags, name in ((0b0001_1101, "expandable"), (0b0000_1010, "plain_merging"),
                        (0b0100_1101, "expandable_lagging"), (0b1011_0111, "everything")):
        out("pool_ops", f"steps_{name}", bytes([flags, 4] + program))
    # Out of memory: a 16 MiB pool asked for more, then for less after a limit.
    # (Sizes 30 and 31: none, and more than any machine has.)
    out("pool_ops", "out_of_memory", bytes([0b0000_1101, 0] + alloc(23, 0, 0) + alloc(24, 0, 1)
                                           + alloc(29, 255, 0) + alloc(30, 0, 3) + alloc(31, 2, 1)
                                           + [6, 1, 2] + alloc(22, 0, 2) + [4, 0, 5]))


def torch():
    # src/torch.rs: 0-2 allocate (size, device, stream), 3 free, 4 release, 5
    # record_stream, 6 statistics, 7 peaks/cacheInfo/empty_cache, 8 create a
    # private pool, 9 begin or end routing, 10 allocate into it, 11 release it,
    # list its live blocks or describe it. Sizes: 3 = 2^k + m, 4 = a * 4096 + b;
    # devices: 3 = 0, 0 = -1, 1 = 1; streams: 0 none, 1 legacy, 2 per thread.
    tensors = [0, 4, 255, 0, 3, 0, 1, 3, 22, 5, 3, 1, 2, 4, 7, 9, 3, 2]
    use = [5, 1, 3, 2, 6, 3, 0, 1, 2, 3, 7, 3]
    frees = [4, 1, 1, 3, 1, 1, 0, 4, 1, 0, 4, 1, 1]
    out("torch_hooks", "tensors", bytes(tensors + use + frees + [7, 0]))
    graph = [8, 1, 0, 9, 1, 0, 0, 10, 1, 0, 4, 16, 0, 0, 10, 1, 0, 3, 21, 9, 1,
             11, 1, 0, 1, 4, 11, 1, 0, 2, 9, 1, 0, 1, 4, 1, 1, 11, 1, 0, 0]
    out("torch_hooks", "private_pool", bytes(graph + tensors + frees))
    bad = ([0, 1, 7, 3, 0, 0, 2, 0, 3, 0, 0, 4, 1, 1, 1, 0]
           + [4, 0] + [0xEF, 0xBE, 0xAD, 0xDE, 0, 0, 0, 0] + [3]
           + [3, 0] + [8, 0, 0, 0, 0, 0, 0, 0] + [2] + [0xFF] * 8 + [1, 0, 1]
           + [10, 2, 1, 4, 1, 1, 0] + [11, 2, 1, 0] + [9, 2, 1, 1])
    out("torch_hooks", "bad_arguments", bytes(bad))


def cupy():
    # src/cupy.rs: 0-3 malloc (stream: 0 none, 1 legacy, 2 per thread, 3 the
    # stream function fails; size; device), 4-5 free (a held block by index, on
    # its own device unless the next byte % 4 is 0; or pick % 4 == 0: any
    # address and device), 6 set the hooks (type pair, pick: 0-3 a null, 4-7
    # valid), 7 free null or the failure value. Sizes: 1 = MAX >> k, 2 = 2^k +
    # m, 3 = a * 4096 + b; devices: 3 = 0, 0 = -1, 1 = 1, 2 = any (8 bytes).
    hooks = [6, 0, 4]
    arrays = ([0, 0, 3, 1, 0, 3] + [1, 1, 3, 16, 0, 3] + [2, 2, 2, 20, 5, 3]
              + [3, 3, 3, 2, 0, 3] + [0, 0, 3, 0, 7, 3])
    frees = [4, 1, 1] + [5, 2, 1] + [4, 3, 1] + [4, 1, 1]
    out("cupy_hooks", "arrays", bytes([0, 0, 3, 1, 0, 3] + hooks + arrays + frees))
    failures = ([6, 1, 5] + [0, 0, 1, 0, 3] + [0, 0, 2, 35, 0, 3] + [0, 0, 3, 1, 0, 0]
                + [0, 1, 3, 1, 0, 1] + [0, 2, 3, 1, 0, 2] + [0xEF] * 8
                + [6, 0, 0] + [6, 0, 1] + [6, 0, 2] + [6, 0, 3]
                + [0, 0, 3, 4, 0, 3] + [4, 1, 0, 0] + [4, 0] + [0xEF, 0xBE, 0xAD, 0xDE, 0, 0, 0, 0] + [3]
                + [7, 0, 3] + [7, 1, 0] + [6, 0, 4] + [0, 3, 3, 1, 0, 3] + [4, 1, 1])
    out("cupy_hooks", "failures", bytes(failures))


if __name__ == "__main__":
    pickles()
    text()
    ipc()
    capi()
    pool()
    torch()
    cupy()
