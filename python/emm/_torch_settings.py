"""``torch.cuda.memory._set_allocator_settings`` under emm (what
``emm.torch.install()`` routes it to): PyTorch programs change allocator settings
per phase with it, in PyTorch's ``key:value,key:value`` form
(``PYTORCH_CUDA_ALLOC_CONF``'s). Under emm, PyTorch's caching allocator does not
serve, so its settings would do nothing; each key goes to emm's setting of the
same meaning, or the call is refused with a message naming what emm offers:

- ``expandable_segments:True|False`` -> ``pool_expandable`` (read when the pool is
  made: the value in effect is accepted, another refused);
- ``per_process_memory_fraction:F`` -> ``pool_limit`` = F x the current device's
  memory (a run-time setting: applied at once);
- ``garbage_collection_threshold:F`` -> ``pool_release_threshold`` = F x the
  current device's memory (applied at once: memory above it goes back once its
  streams are idle, where PyTorch reclaims cached blocks past that fraction);
- any of emm's own keys (``emm.settings()``), e.g. ``pool_limit:8G``.

Every key is checked before any is applied; the settings read when the pool was
made are applied before the run-time ones, so a refused one leaves the others as
they were.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

from ._lib import EMM_OK, _raise_last, load, settings
from ._torch_routes import _wrap

# PyTorch's keys with no meaning for emm's pool, and why.
_NO_MEANING = {
    "max_split_size_mb": "emm's pool splits blocks by best fit in one expandable segment",
    "max_non_split_rounding_mb": "emm's pool rounds every large block to 2 MiB",
    "roundup_power2_divisions": "emm's pool rounds every large block to 2 MiB",
    "release_lock_on_cudamalloc": "emm's pool keeps no lock across driver calls it can avoid",
    "backend": "emm is the allocator",
    "pinned_use_cuda_host_register": "emm's pinned memory comes from cuMemHostAlloc",
    "pinned_num_register_threads": "emm's pinned memory comes from cuMemHostAlloc",
    "pinned_use_background_threads": "emm's pinned memory comes from cuMemHostAlloc",
    "graph_capture_record_stream_reuse": "emm keeps a private pool per capture",
}


def _split(text: str) -> List[Tuple[str, str]]:
    """``key:value`` pairs of PyTorch's form (commas inside ``[...]`` belong to a
    value, as in ``roundup_power2_divisions:[256:1,512:2]``)."""
    pairs, depth, item = [], 0, ""
    for ch in text + ",":
        if ch == "," and depth == 0:
            item = item.strip()
            if item:
                key, sep, value = item.partition(":")
                if not sep:
                    raise ValueError(f"allocator setting {item!r} is not key:value")
                pairs.append((key.strip(), value.strip()))
            item = ""
            continue
        depth += {"[": 1, "]": -1}.get(ch, 0)
        item += ch
    return pairs


def _fraction(key: str, value: str, one: bool = True) -> float:
    """``value`` as a share in (0, 1] (PyTorch's ``per_process_memory_fraction``),
    or in (0, 1) with ``one`` false (its ``garbage_collection_threshold``)."""
    try:
        f = float(value)
    except ValueError:
        raise ValueError(f"{key} must be a number between 0 and 1, not {value!r}") from None
    if not (0.0 < f <= 1.0 if one else 0.0 < f < 1.0):
        upper = "at most 1" if one else "below 1"
        raise ValueError(f"{key} must be above 0 and {upper} (got {value!r})")
    return f


# emm's setting each of PyTorch's keys sets (emm's own keys set themselves).
_TARGET = {
    "expandable_segments": "pool_expandable",
    "per_process_memory_fraction": "pool_limit",
    "garbage_collection_threshold": "pool_release_threshold",
}


def translate(text: str, device_memory: Callable[[], int]) -> List[Tuple[str, str]]:
    """emm's ``(key, value)`` pairs for PyTorch's settings ``text``; ``ValueError``
    naming every key emm cannot honour (nothing applied)."""
    own = {s.name for s in settings()}
    out, refused = [], []
    seen: Dict[str, str] = {}
    for key, value in _split(text):
        # A key given twice (or two keys that set one setting of emm's): which
        # value was meant is not guessed (PyTorch lets the last win).
        target = _TARGET.get(key, key)
        if target in seen:
            raise ValueError(f"{key} sets {target}, which {seen[target]} set already in {text!r}; "
                             "nothing was applied")
        seen[target] = key
        if key == "expandable_segments":
            if value not in ("True", "False"):
                raise ValueError(f"expandable_segments must be True or False, not {value!r}")
            out.append(("pool_expandable", "1" if value == "True" else "0"))
        elif key == "per_process_memory_fraction":
            out.append(("pool_limit", str(int(_fraction(key, value) * device_memory()))))
        elif key == "garbage_collection_threshold":
            share = _fraction(key, value, one=False)
            out.append(("pool_release_threshold", str(int(share * device_memory()))))
        elif key in own and key != "manager":
            out.append((key, value))
        else:
            why = _NO_MEANING.get(key, "not a setting of PyTorch's allocator emm knows")
            refused.append(f"{key} ({why})")
    if refused:
        names = ", ".join(sorted(own - {"manager"}))
        raise ValueError(
            f"emm serves PyTorch's memory: it cannot honour {'; '.join(refused)}. emm takes "
            f"expandable_segments, per_process_memory_fraction, garbage_collection_threshold and its own "
            f"settings ({names}); nothing was applied")
    return out


def route_allocator_settings(torch: Any) -> None:
    """Puts :func:`translate` behind ``torch.cuda.memory._set_allocator_settings``."""
    memory = torch.cuda.memory
    if getattr(getattr(memory, "_set_allocator_settings", None), "_emm_routed", False):
        return

    def device_memory() -> int:
        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)

    def _set_allocator_settings(env: str) -> None:
        lib = load()
        runtime = {s.name for s in settings() if s.runtime}
        # Settings read at a manager's creation first: once a manager serves they are
        # refused unless unchanged, and a refusal then comes before any run-time
        # setting was applied.
        pairs = sorted(translate(env, device_memory), key=lambda kv: kv[0] in runtime)
        # Every value checked before any is applied: emm's own keys come as
        # PyTorch's text, which only the library parses.
        for key, value in pairs:
            status = lib.emm_configure_check(key.encode(), value.encode())
            if status != EMM_OK:
                _raise_last(lib, status)
        for key, value in pairs:
            status = lib.emm_configure(key.encode(), value.encode())
            if status != EMM_OK:
                _raise_last(lib, status)

    if hasattr(memory, "_set_allocator_settings"):
        _wrap(memory, "_set_allocator_settings", _set_allocator_settings,
              "Routed to emm's settings by emm.torch.install() (see emm._torch_settings).\n\n")
