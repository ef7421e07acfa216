"""actors.stores.memory: FileMemory and default_memory."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from actors.stores.memory import (
    FileMemory,
    MemoryFailure,
    MemorySource,
    default_memory,
    entry_text,
)


def test_missing_file_is_an_empty_block(tmp_path: Path) -> None:
    assert FileMemory(tmp_path / "MEMORY.md").block() == ""
    assert FileMemory(tmp_path / "no" / "such" / "dir" / "MEMORY.md").block() == ""


def test_contents_read(tmp_path: Path) -> None:
    path = tmp_path / "MEMORY.md"
    path.write_text("# Memory\n- likes tea ☕\n", encoding="utf-8")
    mem = FileMemory(path)
    assert mem.block() == "# Memory\n- likes tea ☕\n"
    path.write_text("changed\n", encoding="utf-8")
    assert mem.block() == "changed\n"  # read afresh each time


def test_str_path_accepted(tmp_path: Path) -> None:
    path = tmp_path / "m.md"
    path.write_text("hi", encoding="utf-8")
    assert FileMemory(str(path)).block() == "hi"


def test_directory_is_a_failure(tmp_path: Path) -> None:
    path = tmp_path / "MEMORY.md"
    path.mkdir()
    with pytest.raises(MemoryFailure, match=r"MEMORY\.md"):
        FileMemory(path).block()


def test_a_damaged_file_gives_its_readable_part_and_reports_once(tmp_path: Path) -> None:
    # A remember cut off inside a multi-byte character (the old append-in-place did that).
    path = tmp_path / "MEMORY.md"
    path.write_bytes("- tea ☕\n- coffee ".encode() + "☕".encode()[:2])
    mem = FileMemory(path)
    first = mem.block()
    assert first.startswith("- tea ☕\n- coffee ")
    assert first.endswith("\ufffd")
    (report,) = mem.take_reports()
    assert str(path) in report and "damaged" in report and "byte 19" in report
    assert mem.block() == first
    assert mem.take_reports() == []  # the same file: reported once


def test_a_cut_multibyte_character_at_the_cap_is_not_damage(tmp_path: Path) -> None:
    path = tmp_path / "MEMORY.md"
    path.write_text("☕" * 50, encoding="utf-8")
    mem = FileMemory(path, max_chars=10)
    text = mem.block()
    assert text.startswith("☕" * 10 + "\n[loopd: the memory file is longer than 10 characters")
    reports = mem.take_reports()
    assert len(reports) == 1 and "memory.max_chars (10 characters)" in reports[0]


def test_the_block_is_read_again_only_when_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "MEMORY.md"
    path.write_text("one\n", encoding="utf-8")
    mem = FileMemory(path)
    for _ in range(100):
        assert mem.block() == "one\n"
    assert mem.reads == 1
    path.write_text("two, longer\n", encoding="utf-8")  # a new size
    assert mem.block() == "two, longer\n"
    replacement = tmp_path / "new.md"
    replacement.write_text("six!\n", encoding="utf-8")
    os.replace(replacement, path)  # the same size as before, a new inode
    assert mem.block() == "six!\n"
    mem.remember("seven")
    assert mem.block() == "six!\n- seven\n"
    assert mem.reads == 4
    path.unlink()
    assert mem.block() == ""


def test_known_block_answers_only_what_needs_no_read(tmp_path: Path) -> None:
    path = tmp_path / "MEMORY.md"
    memory = FileMemory(path)
    assert memory.known_block() == ""  # no file: an empty block
    path.write_text("fact one\n")
    assert memory.known_block() is None  # never read: it would take a read
    assert memory.block() == "fact one\n"
    assert memory.known_block() == "fact one\n"
    path.write_text("fact one, changed\n")
    assert memory.known_block() is None
    assert memory.reads == 1  # known_block itself never reads the file


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_path_that_is_not_a_regular_file_fails_at_once(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "MEMORY.md"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    mem = FileMemory(path)
    # A FIFO with no writer used to block the Context for ever.
    with pytest.raises(MemoryFailure, match="not a regular file"):
        mem.block()
    with pytest.raises(MemoryFailure, match="not a regular file"):
        mem.remember("x")


def test_remember_writes_all_or_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "MEMORY.md"
    path.write_text("- old\n", encoding="utf-8")
    mem = FileMemory(path)
    real_fsync = os.fsync

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(MemoryFailure, match="No space left"):
        mem.remember("☕" * 100)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert path.read_bytes() == b"- old\n"  # the old file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["MEMORY.md"]  # no temporary left


def test_remember_keeps_the_file_mode_and_follows_a_link(tmp_path: Path) -> None:
    real = tmp_path / "real.md"
    real.write_text("- a\n", encoding="utf-8")
    real.chmod(0o600)
    link = tmp_path / "MEMORY.md"
    link.symlink_to(real)
    FileMemory(link).remember("b")
    assert link.is_symlink()
    assert real.read_text(encoding="utf-8") == "- a\n- b\n"
    assert real.stat().st_mode & 0o777 == 0o600


def test_an_entry_longer_than_max_entry_chars_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "MEMORY.md"
    mem = FileMemory(path, max_entry_chars=5)
    mem.remember("12345")
    with pytest.raises(MemoryFailure, match=r"6 characters; memory.max_entry_chars allows 5"):
        mem.remember("123456")
    assert path.read_text(encoding="utf-8") == "- 12345\n"


def test_remember_is_refused_once_the_file_is_full(tmp_path: Path) -> None:
    path = tmp_path / "MEMORY.md"
    mem = FileMemory(path, max_chars=20)
    mem.remember("0123456789")  # "- 0123456789\n" is 13 characters
    with pytest.raises(MemoryFailure, match="memory is full"):
        mem.remember("abcdef")
    assert path.read_text(encoding="utf-8") == "- 0123456789\n"


@pytest.mark.parametrize("size", [1001, 5000])  # within the read's byte cap, and past it
def test_remember_into_a_file_already_past_max_chars_says_so(tmp_path: Path, size: int) -> None:
    # Past 4003 bytes the refusal used to be "MEMORY.md is larger than 4003 bytes".
    path = tmp_path / "MEMORY.md"
    path.write_text("x" * size, encoding="utf-8")
    mem = FileMemory(path, max_chars=1000)
    with pytest.raises(MemoryFailure) as info:
        mem.remember("one more")
    assert str(info.value) == (
        "the memory file already holds more than memory.max_chars (1000) characters; new "
        f"entries would not reach new sessions: an operator must make room in {path}"
    )
    assert path.read_text(encoding="utf-8") == "x" * size


def test_a_file_exactly_at_max_chars_is_full_not_past_it(tmp_path: Path) -> None:
    path = tmp_path / "MEMORY.md"
    path.write_text("x" * 20, encoding="utf-8")  # no newline at its end: one would be added
    with pytest.raises(MemoryFailure, match="memory is full: the memory file would have 25 "):
        FileMemory(path, max_chars=20).remember("a")


def test_the_entry_checks_are_one_function() -> None:
    assert entry_text("  tea,\n  not\tcoffee ", 20) == "tea, not coffee"
    for line, text in [(" \n ", "empty"), ("x" * 21, "21 characters"), ("a\ud800", "Unicode")]:
        with pytest.raises(MemoryFailure, match=text):
            entry_text(line, 20)


def test_remember_refuses_text_that_is_not_unicode(tmp_path: Path) -> None:
    mem = FileMemory(tmp_path / "MEMORY.md")
    with pytest.raises(MemoryFailure, match="not valid Unicode"):
        mem.remember("a\ud800b")
    assert not (tmp_path / "MEMORY.md").exists()


def test_updated_recorded(tmp_path: Path) -> None:
    mem = FileMemory(tmp_path / "MEMORY.md")
    assert mem.updates == []
    mem.updated("sub-mm-thread-1", 1)
    mem.updated("mm-thread", 3)
    assert mem.updates == [("sub-mm-thread-1", 1), ("mm-thread", 3)]


def test_updated_from_many_threads(tmp_path: Path) -> None:
    mem = FileMemory(tmp_path / "MEMORY.md")

    def work(i: int) -> None:
        for turn in range(100):
            mem.updated(f"s{i}", turn)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    updates = mem.updates
    assert len(updates) == 800
    for i in range(8):
        assert [turn for s, turn in updates if s == f"s{i}"] == list(range(100))


def test_default_memory(tmp_path: Path) -> None:
    mem = default_memory(tmp_path)
    assert mem.path == tmp_path / "MEMORY.md"
    assert default_memory(str(tmp_path)).path == tmp_path / "MEMORY.md"
    (tmp_path / "MEMORY.md").write_text("remember", encoding="utf-8")
    assert mem.block() == "remember"


def test_file_memory_is_a_memory_source(tmp_path: Path) -> None:
    source: MemorySource = FileMemory(tmp_path / "MEMORY.md")
    assert isinstance(source, MemorySource)


def test_remember_starts_a_new_line_and_keeps_what_was_there(tmp_path) -> None:
    from actors.stores.memory import FileMemory

    path = tmp_path / "MEMORY.md"
    path.write_text("Written by hand, no newline at the end")
    memory = FileMemory(path)
    memory.remember("first\nsecond")
    memory.remember("third")
    assert path.read_text() == ("Written by hand, no newline at the end\n- first second\n- third\n")


def test_updates_keep_only_the_newest(tmp_path) -> None:
    from actors.stores.memory import UPDATES_KEPT, FileMemory

    memory = FileMemory(tmp_path / "MEMORY.md")
    for turn in range(UPDATES_KEPT + 5):
        memory.updated("s", turn)
    assert len(memory.updates) == UPDATES_KEPT
    assert memory.updates[-1] == ("s", UPDATES_KEPT + 4)


WRITER = """
import sys
from actors.stores.memory import FileMemory
memory = FileMemory(sys.argv[1], max_chars=10**7, max_entry_chars=10**6)
for i in range(10**6):
    memory.remember("\\u2615" * 40_000 + f" {i}")
    print(i, flush=True)
"""


def test_a_writer_killed_mid_remember_leaves_whole_lines(tmp_path: Path) -> None:
    after = 3
    import signal
    import subprocess
    import sys

    path = tmp_path / "MEMORY.md"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        for _ in range(after):
            assert proc.stdout is not None and proc.stdout.readline()
        proc.send_signal(signal.SIGKILL)  # lands somewhere inside the next remember
    finally:
        proc.kill()
        proc.wait(timeout=30)
    text = path.read_bytes().decode("utf-8")  # strict: no cut character
    lines = text.splitlines(keepends=True)
    assert len(lines) >= after
    for i, line in enumerate(lines):
        assert line == "- " + "☕" * 40_000 + f" {i}\n"
    # At most the temporary file of the write that was killed is left beside it.
    others = [p.name for p in tmp_path.iterdir() if p.name != "MEMORY.md"]
    assert all(name.startswith(".MEMORY.md.") and name.endswith(".tmp") for name in others)
