"""actors.memory: FileMemory and default_memory."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from actors.memory import FileMemory, MemoryFailure, MemorySource, default_memory


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


def test_invalid_utf8_is_a_failure_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "MEMORY.md"
    path.write_bytes(b"ok \xff\xfe not utf-8")
    with pytest.raises(MemoryFailure) as info:
        FileMemory(path).block()
    assert str(path) in str(info.value)
    assert isinstance(info.value.__cause__, UnicodeDecodeError)


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
    from actors.memory import FileMemory

    path = tmp_path / "MEMORY.md"
    path.write_text("Written by hand, no newline at the end")
    memory = FileMemory(path)
    memory.remember("first\nsecond")
    memory.remember("third")
    assert path.read_text() == ("Written by hand, no newline at the end\n- first second\n- third\n")


def test_updates_keep_only_the_newest(tmp_path) -> None:
    from actors.memory import UPDATES_KEPT, FileMemory

    memory = FileMemory(tmp_path / "MEMORY.md")
    for turn in range(UPDATES_KEPT + 5):
        memory.updated("s", turn)
    assert len(memory.updates) == UPDATES_KEPT
    assert memory.updates[-1] == ("s", UPDATES_KEPT + 4)
