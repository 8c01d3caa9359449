"""``emm.replay``: the replay's JSON as Python objects, through the ``emm`` program
of this installation (CI: the wheel's, in a fresh venv; a checkout: its build)."""

import pytest

import emm
from emm import _install

pytestmark = pytest.mark.skipif(
    _install.binary() is None, reason="no `emm` program in this installation (build emm-cli)"
)


def test_replay_returns_the_json_of_emm_replay():
    doc = emm.replay(managers=["pool", "pytorch-native", "pytorch-expandable"], passes=2)
    assert doc["exit_status"] == 0, doc["messages"]
    t = doc["traces"][0]
    assert t["trace"].startswith("gpt_train.csv")
    by = {m["manager"]: m for m in t["managers"]}
    assert set(by) == {"pool", "pytorch-native", "pytorch-expandable"}
    # PyTorch 2.11's allocator reserved 1.390x and 1.086x of peak live on an H100.
    assert by["pytorch-native"]["reserved_over_live"] == pytest.approx(1.390, abs=0.005)
    assert by["pytorch-expandable"]["reserved_over_live"] == pytest.approx(1.086, abs=0.005)
    assert by["pool"]["peak_reserved_bytes"] < by["pytorch-expandable"]["peak_reserved_bytes"]


def test_device_memory_and_fit_answer_will_it_fit():
    doc = emm.replay(managers=["pool", "pytorch-native"], passes=1, device_memory="3.5G")
    assert doc["device_memory_bytes"] == int(3.5 * 2**30)
    failed = {m["manager"]: m["failed"] for m in doc["traces"][0]["managers"]}
    assert failed == {"pool": False, "pytorch-native": True}
    assert doc["exit_status"] == 1  # a manager did not fit, as the command says
    doc = emm.replay(managers=["pool"], passes=1, fit=True, overhead=0)
    (f,) = doc["traces"][0]["fit"]
    assert f["manager"] == "pool"
    assert doc["traces"][0]["peak_live_bytes"] <= f["needs_bytes"] == f["with_overhead_bytes"]


def test_device_lag_reaches_the_command():
    doc = emm.replay(managers=["pool"], passes=1, device_lag=300)
    assert doc["exit_status"] == 0, doc["messages"]
    assert doc["device_lag_requests"] == 300
    assert emm.replay(managers=["pool"], passes=1)["device_lag_requests"] == 0


def test_one_manager_may_be_named_as_a_str():
    """``managers="pool"`` is the list of one, as ``traces`` takes a str (it
    was taken letter by letter: ``-m p -m o -m o -m l``)."""
    doc = emm.replay(managers="pool", passes=1)
    assert doc["exit_status"] == 0, doc["messages"]
    assert [m["manager"] for m in doc["traces"][0]["managers"]] == ["pool"]


def test_arguments_the_command_refuses_raise_value_error():
    with pytest.raises(ValueError, match="max_split_size_mb"):
        emm.replay(managers=["pytorch-native"], pytorch_conf="max_split_size_mb:5")
    with pytest.raises(ValueError):
        emm.replay(managers=["no-such-manager"])
