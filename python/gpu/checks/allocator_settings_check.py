"""GPU check: ``torch.cuda.memory._set_allocator_settings`` under emm's allocator
object goes to emm's settings (``emm._torch_settings``), cross-checked at the
device (``torch.cuda.mem_get_info``):

- PyTorch keys emm cannot honour are refused before anything is applied;
- ``expandable_segments`` accepts the value in effect and refuses another (read
  when the pool was made);
- ``per_process_memory_fraction`` becomes the pool's byte limit at once: the cache
  above it goes back to the device, live tensors keep their bytes, and a larger
  request raises ``torch.OutOfMemoryError``;
- ``garbage_collection_threshold`` becomes the pool's release threshold: memory
  above it goes back to the device when set, and frees past it give memory back
  on their own (up to what thread caches keep).

    PYTHONPATH=python EMM_LIBRARY=gpu-bundle/lib/libemm_capi.so \\
        python3 python/gpu/checks/allocator_settings_check.py
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # python/, for emm

import torch  # noqa: E402

import emm  # noqa: E402
import emm.torch as et  # noqa: E402

MiB = 1 << 20


def device_free() -> int:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def main() -> None:
    et.install()
    total = torch.cuda.get_device_properties(0).total_memory
    setting = torch.cuda.memory._set_allocator_settings
    x = torch.full((256 * MiB,), 7, dtype=torch.uint8, device="cuda")

    try:
        setting("per_process_memory_fraction:0.01,max_split_size_mb:128")
        raise SystemExit("max_split_size_mb was accepted")
    except ValueError as e:
        assert "max_split_size_mb" in str(e) and "nothing was applied" in str(e), e
    y = torch.empty(1024 * MiB, dtype=torch.uint8, device="cuda")  # the fraction was not applied
    del y

    setting("expandable_segments:True")
    try:
        setting("expandable_segments:False")
        raise SystemExit("expandable_segments:False was accepted after the pool was made")
    except emm.EmmError as e:
        assert "pool_expandable" in str(e), e

    # The limit at run time: 512 MiB, below what the pool reserves now.
    before = device_free()
    reserved_before = torch.cuda.memory_reserved()
    setting(f"per_process_memory_fraction:{512 * MiB / total:.9f}")
    after = device_free()
    reserved = torch.cuda.memory_reserved()
    given = reserved_before - reserved
    print(f"limit 512 MiB: reserved {reserved_before / MiB:.0f} -> {reserved / MiB:.0f} MiB; "
          f"device free +{(after - before) / MiB:.0f} MiB")
    assert reserved <= 514 * MiB, reserved
    assert after - before >= given - 4 * MiB, (after - before, given)
    try:
        torch.empty(1024 * MiB, dtype=torch.uint8, device="cuda")
        raise SystemExit("1 GiB was served under a 512 MiB limit")
    except torch.OutOfMemoryError as e:
        print("past the limit:", str(e).splitlines()[0][:160])
    setting("pool_limit:max")
    assert bool((x == 7).all()), "a live tensor lost its bytes"  # (the comparison takes 256 MiB)

    # The release threshold: 512 MiB.
    ys = [torch.empty(256 * MiB, dtype=torch.uint8, device="cuda") for _ in range(8)]
    del ys
    high = torch.cuda.memory_reserved()
    mid = device_free()
    setting(f"garbage_collection_threshold:{512 * MiB / total:.9f}")
    now = torch.cuda.memory_reserved()
    freed_at_device = device_free() - mid
    print(f"threshold 512 MiB set: reserved {high / MiB:.0f} -> {now / MiB:.0f} MiB; "
          f"device free +{freed_at_device / MiB:.0f} MiB")
    assert now <= 514 * MiB, now
    assert freed_at_device >= (high - now) - 4 * MiB, (freed_at_device, high - now)
    zs = [torch.empty(256 * MiB, dtype=torch.uint8, device="cuda") for _ in range(8)]
    grown = torch.cuda.memory_reserved()
    del zs
    torch.cuda.synchronize()
    w = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")  # frees after the work is done
    del w
    settled = torch.cuda.memory_reserved()
    stats = torch.cuda.memory_stats()
    print(f"frees past the threshold: reserved {grown / MiB:.0f} -> {settled / MiB:.0f} MiB "
          f"(thread caches keep up to 512 MiB); emm.threshold_releases "
          f"{emm.torch.memory_stats().get('emm.threshold_releases')}")
    assert settled <= 512 * MiB + 512 * MiB + 4 * MiB, settled
    assert grown - settled >= 512 * MiB, (grown, settled)
    assert stats["num_ooms"] >= 1
    setting("pool_release_threshold:max")
    assert bool((x == 7).all())
    print("allocator_settings_check: OK")


if __name__ == "__main__":
    main()
