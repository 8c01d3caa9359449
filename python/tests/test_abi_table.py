"""The Python bindings' own copy of the C ABI (``emm/_lib.py``: the ctypes table of
every function they call, the status codes and the ABI version) against the header
the library is built with (``crates/emm-capi/include/emm.h``, written by cbindgen
from the library's source and checked against it in CI). Needs neither the library
nor a driver: a function whose arguments changed in C, a status code renumbered
or added, fails here instead of corrupting a call at run time."""

import ctypes
import os
import re

import pytest

from emm import _lib

HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "crates", "emm-capi",
                      "include", "emm.h")

# C scalar types of the header and the ctypes type that passes each.
SCALARS = {
    "int": ctypes.c_int,
    "emm_status": ctypes.c_int,
    "int32_t": ctypes.c_int32,
    "unsigned int": ctypes.c_uint,
    "uint8_t": ctypes.c_uint8,
    "uint32_t": ctypes.c_uint32,
    "uint64_t": ctypes.c_uint64,
    "size_t": ctypes.c_size_t,
    "ssize_t": ctypes.c_ssize_t,
}
# Opaque or byte pointees a pointer to which is passed as c_void_p or c_char_p.
BYTES = {"char", "uint8_t"}
STRUCTS = {"emm_stats": _lib._Stats, "emm_setting": _lib._Setting, "emm_stat_name": _lib._StatName,
           "emm_graph_pool_info": _lib._GraphPoolInfo}


def header_text():
    if not os.path.exists(HEADER):
        pytest.skip(f"{HEADER} is not here (an installed package without the checkout)")
    with open(HEADER) as f:
        text = f.read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def declarations():
    """{name: (result type, [argument types])} of every function the header declares,
    each type as (base name, pointer depth)."""
    out = {}
    code = re.sub(r"^\s*#[^\n]*", " ", header_text(), flags=re.M)  # preprocessor lines
    for m in re.finditer(r"([A-Za-z_][\w\s\*]*?)\b(emm_\w+)\s*\(([^()]*)\)\s*;", code):
        result, name, params = m.group(1), m.group(2), m.group(3).strip()
        args = []
        if params and params != "void":
            for p in params.split(","):
                # The last identifier is the parameter's name.
                p = re.sub(r"\b\w+\s*$", "", p.strip())
                args.append(c_type(p))
        out[name] = (c_type(result), args)
    return out


def c_type(text):
    depth = text.count("*")
    words = [w for w in re.sub(r"\*", " ", text).split() if w not in ("const", "struct")]
    return " ".join(words), depth


def passes(c, py, result=False):
    """Whether ctypes type ``py`` passes (or, for a result, reads) C type ``c``."""
    base, depth = c
    if depth == 0:
        if base == "void":
            return result and py is None
        return base in SCALARS and py is SCALARS[base]
    if py is ctypes.c_void_p:
        return True  # any pointer
    if py is ctypes.c_char_p:
        return depth == 1 and base in BYTES
    pointee = getattr(py, "_type_", None)
    if pointee is None or not isinstance(py, type) or not issubclass(py, ctypes._Pointer):
        return False
    if depth == 1:
        if base in STRUCTS:
            return pointee is STRUCTS[base]
        return base in SCALARS and pointee is SCALARS[base]
    # A pointer to a pointer: to a handle, a string or bytes.
    return depth == 2 and pointee in (ctypes.c_void_p, ctypes.c_char_p)


def test_every_function_the_bindings_call_is_declared_alike():
    declared = declarations()
    assert len(declared) > 40, f"the header parsed to {len(declared)} functions"
    problems = []
    for name, (args, res) in _lib._signatures().items():
        if name not in declared:
            problems.append(f"{name}: not in emm.h")
            continue
        c_res, c_args = declared[name]
        if len(args) != len(c_args):
            problems.append(f"{name}: {len(args)} arguments in _lib.py, {len(c_args)} in emm.h")
            continue
        for i, (py, c) in enumerate(zip(args, c_args)):
            if not passes(c, py):
                problems.append(f"{name}: argument {i + 1} is {c} in emm.h, {py} in _lib.py")
        if not passes(c_res, res, result=True):
            problems.append(f"{name}: returns {c_res} in emm.h, {res} in _lib.py")
    assert not problems, "\n".join(problems)


def test_the_checker_catches_a_changed_signature():
    # The comparison itself: a wrong width, a missing pointer and a wrong struct fail.
    assert passes(("size_t", 0), ctypes.c_size_t)
    assert not passes(("size_t", 0), ctypes.c_uint32)
    assert not passes(("size_t", 1), ctypes.c_size_t)
    assert passes(("size_t", 1), ctypes.POINTER(ctypes.c_size_t))
    assert not passes(("uint64_t", 1), ctypes.POINTER(ctypes.c_uint32))
    assert not passes(("emm_stats", 1), ctypes.POINTER(ctypes.c_uint64))
    assert not passes(("int", 1), ctypes.c_char_p)
    assert passes(("void", 0), None, result=True) and not passes(("void", 0), None)


def test_status_codes_and_their_names_match_the_header():
    codes = {m.group(1): int(m.group(2))
             for m in re.finditer(r"#define\s+(EMM_(?:OK|ERR_\w+))\s+(-?\d+)", header_text())}
    assert "EMM_OK" in codes and len(codes) > 5, codes
    ours = {n: getattr(_lib, n) for n in dir(_lib) if re.fullmatch(r"EMM_(OK|ERR_\w+)", n)}
    assert ours == codes, f"_lib.py {ours}\nemm.h {codes}"
    for name, code in codes.items():
        if name != "EMM_OK":
            assert _lib._STATUS_NAMES.get(code) == name, f"_STATUS_NAMES lacks {name}"


def test_the_abi_the_bindings_need_is_the_headers():
    m = re.search(r"#define\s+EMM_ABI_VERSION\s+(\d+)", header_text())
    if m is None:
        pytest.skip("emm.h states no EMM_ABI_VERSION")
    assert _lib.ABI_NEEDED == int(m.group(1)), (
        f"_lib.ABI_NEEDED is {_lib.ABI_NEEDED}, emm.h's EMM_ABI_VERSION {m.group(1)}: "
        "bindings that need an older ABI than the header they are shipped with miss its changes")


# The functions of emm.h the bindings do not call through ctypes: handed to
# PyTorch, CuPy or the C++ allocator object by address, or bound where they are
# used. A new C function is either bound in _lib._signatures() or named here.
BY_ADDRESS = {
    "emm_torch_alloc", "emm_torch_free",  # PyTorch's CUDAPluggableAllocator (torch.py)
    "emm_torch_release", "emm_torch_cache_info", "emm_torch_graph_pool_begin",  # the C++ object's
    "emm_torch_graph_pool_end", "emm_torch_graph_pool_release", "emm_torch_graph_pool_alloc",
    "emm_torch_graph_pool_live", "emm_torch_graph_pool_create",  # function table (test_torch_native.py checks them)
    "emm_cupy_malloc", "emm_cupy_free",  # CuPy's C-function allocator (cupy.py)
    "emm_cupy_set_hooks",  # bound in cupy.py (its function pointers as c_void_p)
}


def test_every_function_of_the_header_is_bound_or_named():
    declared = set(declarations())
    unbound = declared - set(_lib._signatures()) - BY_ADDRESS
    assert not unbound, f"emm.h declares {sorted(unbound)}: bind them in _lib._signatures() or name them in BY_ADDRESS"
    assert BY_ADDRESS <= declared, f"no longer in emm.h: {sorted(BY_ADDRESS - declared)}"


def test_every_struct_the_bindings_pass_has_the_headers_fields():
    text = header_text()
    for name, py in STRUCTS.items():
        m = re.search(r"typedef\s+struct\s+%s\s*\{(.*?)\}\s*%s\s*;" % (name, name), text, flags=re.S)
        assert m, f"struct {name} not in emm.h"
        fields = [(f.group(2), c_type(f.group(1))) for f in re.finditer(r"([\w\s\*]+?)\s*\b(\w+)\s*;", m.group(1))]
        ours = [(n, t) for n, t in py._fields_]
        assert [n for n, _ in fields] == [n for n, _ in ours], f"{name}: {fields} in emm.h, {ours} in _lib.py"
        for (n, c), (_, t) in zip(fields, ours):
            base, depth = c
            ok = (t is ctypes.c_char_p and depth == 1 and base in BYTES) or (depth == 0 and SCALARS.get(base) is t)
            assert ok, f"{name}.{n}: {c} in emm.h, {t} in _lib.py"
