"""Converts a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) into emm's
trace CSV (op,id,size,stream): the client's calls, `alloc` and `free_requested`,
on their streams, for one device. Needs no PyTorch.

    python3 snapshot_to_csv.py SNAPSHOT.pickle OUT.csv [--device 0]

Blocks still allocated in `segments` at dump time with no `alloc` in the trace
(allocated before recording began) are allocated at the start; frees of addresses
with no alloc in the trace are such blocks too, and are allocated at the start.
Prints PyTorch's own peak reserved bytes (from segment events) beside peak live.
"""
import argparse
import pickle


def main():
    p = argparse.ArgumentParser()
    p.add_argument("snapshot")
    p.add_argument("out")
    p.add_argument("--device", type=int, default=0)
    a = p.parse_args()
    with open(a.snapshot, "rb") as f:
        snap = pickle.load(f)
    trace = snap["device_traces"][a.device]
    streams = {}

    def sid(s):
        return streams.setdefault(s, len(streams))

    live, ops, pre = {}, [], []
    next_id = 0
    for e in trace:
        act = e["action"]
        if act == "alloc":
            live[e["addr"]] = (next_id, e["size"], e["stream"])
            ops.append(("a", next_id, e["size"], sid(e["stream"])))
            next_id += 1
        elif act == "free_requested":
            if e["addr"] in live:
                i, size, s = live.pop(e["addr"])
            else:  # allocated before recording began
                i, size, s = next_id, e["size"], e["stream"]
                next_id += 1
                pre.append(("a", i, size, sid(s)))
            ops.append(("f", i, size, sid(s)))
    seen = {addr for addr in live}
    for seg in snap["segments"]:
        if seg.get("device", 0) != a.device:
            continue
        for b in seg["blocks"]:
            if b["state"] == "active_allocated" and b["address"] not in seen:
                pre.append(("a", next_id, b.get("requested_size", b["size"]), sid(seg["stream"])))
                next_id += 1
    ops = pre + ops
    cur = peak = 0
    sizes = {}
    for op, i, size, _ in ops:
        if op == "a":
            sizes[i] = size
            cur += size
            peak = max(peak, cur)
        else:
            cur -= sizes.pop(i, 0)
    reserved = peak_res = 0
    for e in trace:
        if e["action"] in ("segment_alloc", "segment_map"):
            reserved += e["size"]
            peak_res = max(peak_res, reserved)
        elif e["action"] in ("segment_free", "segment_unmap"):
            reserved -= e["size"]
    with open(a.out, "w") as f:
        f.write("op,id,size,stream\n")
        for op, i, size, s in ops:
            f.write(f"{op},{i},{size},{s}\n")
    print(f"{a.out}: {len(ops)} events, {len(streams)} streams, peak live {peak}, "
          f"PyTorch peak reserved (from segment events) {peak_res}, pre-recording blocks {len(pre)}")


if __name__ == "__main__":
    main()
