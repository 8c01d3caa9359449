"""One vocabulary of statistic names: the library's table (``emm_core::stat_names``,
through ``emm_stat_names``) against the bindings' constants (``emm._stat_names``),
and the names the C++ allocator object (``_torch_native.cpp``) and
``emm._torch_routes`` ask for in PyTorch's ``memory_stats`` layout against both:
every PyTorch key emm counts is asked for, and every name asked for is emm's or
one of the few PyTorch keys emm keeps no counter for (``TORCH_ONLY``, read as 0)."""

import os
import re

import emm
from emm import _stat_names, _torch_routes

CPP = os.path.join(os.path.dirname(emm.__file__), "_torch_native.cpp")


def cpp_names():
    """The names the C++ object composes: ``<array>.all.<field>`` and the counters."""
    with open(CPP) as f:
        src = f.read()

    def array(name):
        m = re.search(r"k%s\s*=\s*\{([^}]*)\}" % name, src)
        assert m, f"k{name} not found in {CPP}"
        return re.findall(r'"([^"]+)"', m.group(1))

    return [f"{a}.all.{f}" for a in array("ArrayNames") for f in array("FieldNames")] + array("CounterNames")


def test_the_bindings_constants_are_the_librarys_table():
    table = emm.stat_names()
    assert [n for n, _, _ in table] == list(_stat_names.NAMES)
    for name, doc, torch in table:
        assert doc and torch == (not name.startswith("emm.")), name
    constants = {v for k, v in vars(_stat_names).items() if k.isupper() and isinstance(v, str)}
    assert constants == set(_stat_names.NAMES), "a constant outside NAMES, or the reverse"
    assert not set(_stat_names.TORCH_ONLY) & set(_stat_names.NAMES)


def test_pytorchs_layout_asks_for_every_pytorch_name_emm_counts():
    torch_names = {n for n in _stat_names.NAMES if not n.startswith("emm.")}
    known = set(_stat_names.NAMES) | set(_stat_names.TORCH_ONLY)
    for who, asked in (("the C++ object", cpp_names()), ("emm._torch_routes", _torch_routes._ASKED)):
        assert torch_names <= set(asked), f"{who} never asks for {sorted(torch_names - set(asked))}"
        assert set(asked) <= known, f"{who} asks for names nobody declared: {sorted(set(asked) - known)}"
