"""The XID rules and the recovery rule, as pure functions."""

from __future__ import annotations

import pytest

from vgpud.gpu.healthrules import (
    APPLICATION_XIDS,
    DEFAULT_IGNORED_XIDS,
    DeviceTrack,
    describe_xid,
    is_fatal,
    on_check,
    on_fatal_xid,
    parse_xid_list,
    recovery_due,
    settle,
)

DEFAULT = parse_xid_list(DEFAULT_IGNORED_XIDS)


def test_the_application_xids_are_nvidias_device_plugins() -> None:
    assert DEFAULT == frozenset(APPLICATION_XIDS) == {13, 31, 43, 45, 68, 109}


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_application_xids_are_ignored_by_default(xid: int) -> None:
    assert not is_fatal(xid, DEFAULT)


@pytest.mark.parametrize("xid", [48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 7])
def test_every_other_xid_is_fatal(xid: int) -> None:
    assert is_fatal(xid, DEFAULT)


def test_the_list_is_parsed_strictly() -> None:
    assert parse_xid_list(" 79, 13 ,79") == {13, 79}
    assert parse_xid_list("NONE") == frozenset()
    for bad in ("", "13,", "x", "-1", "0", "65536", "13;31", "1e3"):
        with pytest.raises(ValueError, match="is not an XID"):
            parse_xid_list(bad)


def test_xids_are_named_where_known() -> None:
    assert describe_xid(79) == "XID 79 (GPU has fallen off the bus)"
    assert describe_xid(7) == "XID 7"


def test_a_fatal_xid_makes_the_gpu_unhealthy_and_the_first_cause_stays() -> None:
    sick = on_fatal_xid(DeviceTrack(), 79, now=10.0)
    assert (sick.healthy, sick.reason, sick.xid, sick.bad_at) == (False, describe_xid(79), 79, 10.0)
    again = on_fatal_xid(sick, 48, now=20.0)
    assert (again.reason, again.xid, again.bad_at) == (sick.reason, 79, 20.0)


def test_recovery_comes_the_recovery_time_after_the_last_bad_observation() -> None:
    sick = on_fatal_xid(DeviceTrack(), 94, now=10.0)
    assert recovery_due(sick, 60) == 70.0
    assert settle(on_check(sick, None, 69.9), 69.9, 60) == sick
    assert settle(on_check(sick, None, 70.0), 70.0, 60) == DeviceTrack()


def test_a_gpu_that_does_not_answer_waits_until_it_answers_again() -> None:
    lost = on_check(DeviceTrack(), "GPU is lost (NVML error 15)", now=5.0)
    assert (lost.healthy, lost.reason, lost.answering) == (
        False,
        "GPU lost: GPU is lost (NVML error 15)",
        False,
    )
    still = on_check(lost, "GPU is lost (NVML error 15)", now=100.0)
    assert recovery_due(still, 60) is None and settle(still, 1000.0, 60) == still
    back = on_check(still, None, now=105.0)
    assert recovery_due(back, 60) == 160.0  # from the last failed check
    assert not settle(back, 159.0, 60).healthy
    assert settle(back, 160.0, 60).healthy


def test_a_lost_gpu_keeps_its_first_cause_when_an_xid_comes() -> None:
    sick = on_fatal_xid(DeviceTrack(), 79, now=1.0)
    lost = on_check(sick, "GPU is lost", now=2.0)
    assert (lost.reason, lost.xid, lost.answering, lost.bad_at) == (describe_xid(79), 79, False, 2.0)


def test_a_healthy_gpu_stays_healthy_while_it_answers() -> None:
    assert settle(on_check(DeviceTrack(), None, 1.0), 1.0, 60) == DeviceTrack()
    assert recovery_due(DeviceTrack(), 60) is None
