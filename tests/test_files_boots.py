"""A killed writer's temporaries of an earlier boot of this machine (uform.core.boots): removed
where that is provable, never in a folder other machines may write into."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from uform.core import boots, files

pytestmark = pytest.mark.skipif(boots.ids() is None or boots.booted() is None, reason="a boot is told only on Linux (/proc)")

RUNNING = 1  # init: a process id that runs in every boot


def _left(folder: Path, machine: str, boot: str, space: str) -> Path:
    """A temporary as a writer of ``machine``'s ``boot`` (process-id namespace ``space``) leaves it."""
    path = folder / f".big.bin.{machine}-{boot}-{space}-{RUNNING}-1-0badc0de{files.PARTIAL}"
    path.write_bytes(b"x" * 1000)
    return path


@pytest.fixture
def rebooted(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine booted after every file the test writes was last changed."""
    monkeypatch.setattr(boots, "booted", lambda: time.time() + 3600)


def test_a_temporary_of_this_machines_earlier_boot_goes(tmp_path: Path, rebooted: None) -> None:
    """Its writer's id named the boot and namespace only, so after a reboot it looked like another
    machine's and stayed for good (a killed base export: 352 MB)."""
    machine, boot, space = boots.ids()  # type: ignore[misc]
    if boots.file_system(tmp_path) not in boots.LOCAL or machine == "0" * 8:
        pytest.skip("the test folder is not on a local file system, or this machine has no machine id")
    earlier = _left(tmp_path, machine, "0" * 8 if boot != "0" * 8 else "1" * 8, "2" * 8)
    scratch = tmp_path / f".{machine}-{'0' * 8}-{'2' * 8}-{RUNNING}-1-0badc0de{files.PARTIAL}"
    scratch.mkdir()
    (scratch / "weights.data").write_bytes(b"w")
    files.write_bytes(tmp_path / "other.bin", b"y")
    assert sorted(os.listdir(tmp_path)) == ["other.bin"]
    assert not earlier.exists()


@pytest.mark.parametrize(
    "why",
    ["another machine", "this boot, another container", "a shared folder", "changed since this boot", "no machine id"],
)
def test_a_temporary_not_provably_of_an_earlier_boot_stays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, why: str) -> None:
    machine, boot, space = boots.ids()  # type: ignore[misc]
    other = "0" * 8 if boot != "0" * 8 else "1" * 8
    if why != "changed since this boot":
        monkeypatch.setattr(boots, "booted", lambda: time.time() + 3600)
    monkeypatch.setattr(boots, "file_system", lambda folder: "nfs4" if why == "a shared folder" else "ext4")
    if why == "no machine id":
        monkeypatch.setattr(boots, "ids", lambda: ("0" * 8, boot, space))
        machine = "0" * 8
    left = {
        "another machine": lambda: _left(tmp_path, "f" * 8 if machine != "f" * 8 else "e" * 8, other, "2" * 8),
        "this boot, another container": lambda: _left(tmp_path, machine, boot, "2" * 8 if space != "2" * 8 else "3" * 8),
    }.get(why, lambda: _left(tmp_path, machine, other, "2" * 8))()
    files.write_bytes(tmp_path / "other.bin", b"y")
    assert left.read_bytes() == b"x" * 1000


def test_the_file_system_of_a_folder_is_its_deepest_mount() -> None:
    mountinfo = (
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "40 22 0:40 / /mnt/my\\040share rw,relatime shared:2 - nfs4 host:/export rw\n"
        "41 22 0:41 / /mnt/my rw,relatime - tmpfs tmpfs rw\n"
    )
    assert boots.mounted(mountinfo, "/mnt/my share/out") == "nfs4"
    assert boots.mounted(mountinfo, "/mnt/my/out") == "tmpfs"
    assert boots.mounted(mountinfo, "/mnt/myshare") == "ext4"
    assert boots.mounted(mountinfo, "/home") == "ext4"
    assert boots.mounted("", "/home") is None
