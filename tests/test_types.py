"""The shared words (topk_bench.types) and the messages between the parent and its warm template."""

import json

import pytest

from topk_bench.case import Budget, Case
from topk_bench.types import (
    READY,
    DeviceKind,
    DType,
    Exited,
    Kill,
    Method,
    Mode,
    Refused,
    Start,
    Started,
    decode,
    encode,
)


def test_members_are_their_spelling_in_csv_json_and_f_strings():
    assert Mode.FWD == "fwd" and f"{Mode.FWD_BWD}" == "fwd_bwd" and str(Method.PREDICTED) == "predicted"
    assert json.dumps({"mode": Mode.FWD, "dtype": DType.BFLOAT16}) == '{"mode": "fwd", "dtype": "bfloat16"}'
    assert Mode.FWD_BWD.backward and not Mode.FWD.backward
    assert DType.BFLOAT16.itemsize == 2 and DType.FLOAT64.itemsize == 8 and DType.FLOAT16.half
    assert DeviceKind.of("cuda:1") is DeviceKind.CUDA and DeviceKind.of("cpu") is DeviceKind.CPU


def test_an_unknown_word_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown device 'xpu' \(known: cpu, cuda\)"):
        DeviceKind.of("xpu:0")
    with pytest.raises(ValueError, match=r"unknown mode 'bwd' \(known: fwd, fwd_bwd\)"):
        Case.make(suite="s", workload="mha", impl="vanilla", params={}, mode="bwd")


def test_a_case_holds_members_and_keeps_its_id():
    spelled = Case.make(
        suite="s",
        workload="mha",
        impl="vanilla",
        params={"seq_len": 8},
        mode="fwd",
        method="predicted",
        dtype="bfloat16",
    )
    typed = Case.make(
        suite="s",
        workload="mha",
        impl="vanilla",
        params={"seq_len": 8},
        mode=Mode.FWD,
        method=Method.PREDICTED,
        dtype=DType.BFLOAT16,
    )
    assert spelled == typed and spelled.case_id == typed.case_id
    assert spelled.mode is Mode.FWD and spelled.method is Method.PREDICTED and spelled.dtype is DType.BFLOAT16
    assert spelled.predicted and not spelled.measured_on(DeviceKind.CPU)
    back = Case.from_json(spelled.to_json())
    assert back == spelled and back.mode is Mode.FWD and back.case_id == spelled.case_id
    # The id is the one every earlier version wrote for this case: members hash as their spelling.
    assert (
        Case.make(suite="s", workload="mha", impl="vanilla", params={}).case_id == "3d80d6d911357116"
    )  # main before issue 25


@pytest.mark.parametrize(
    "message",
    [
        Start(3, ("case.json", "result.json", "--budget", "{}"), {"OMP_NUM_THREADS": "1"}, 1),
        Start(4),
        Kill(5),
        Started(6, 1234),
        Started(7, 1235, fresh="the template has 2 threads"),
        Exited(8, -9),
        Refused(9, "expected 2 file descriptors, got 1"),
    ],
)
def test_every_message_survives_its_datagram(message):
    data = encode(message)
    assert json.loads(data)["type"] == type(message).TYPE
    assert decode(data) == message


@pytest.mark.parametrize(
    "junk",
    [
        b"",
        b"{",
        b"[]",
        b'{"type": "dance", "id": 1}',
        b'{"id": 1}',
        b'{"type": "exited", "id": 1, "code": 0, "surprise": 1}',
    ],
)
def test_anything_else_is_not_a_message(junk):
    if junk.endswith(b'"surprise": 1}'):  # an unknown field of a known message is ignored (a newer sender)
        assert decode(junk) == Exited(1, 0)
        return
    with pytest.raises(ValueError, match="not a template message"):
        decode(junk)


def test_budget_round_trips_and_ready_is_one_byte():
    budget = Budget(max_memory_bytes=2**30, max_seconds=1.5)
    assert Budget.from_json(budget.to_json()) == budget and Budget.from_json(Budget().to_json()) == Budget()
    assert READY == b"r" and len(READY) == 1


def test_a_reader_takes_any_device_cell_and_a_damaged_method_is_no_method():
    from topk_bench.protocol import drawn_metric

    assert (
        DeviceKind.read("cuda:0") is DeviceKind.CUDA
        and DeviceKind.read("tpu") is None
        and DeviceKind.read(None) is None
    )
    assert drawn_metric("memory", "paper", "cuda", "mesured") == "memory"  # a damaged row draws what it has
    assert drawn_metric("memory", "paper", "gpu?", "measured") == "memory"
