"""plan + read: every line of every file is read by exactly one rank, in order, whatever the files."""

from __future__ import annotations

import glob
import itertools
import os
import tempfile
from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.files import iter_chunks, plan, read_bytes, read_lines
from shardwise.files.read import Chunk

# A file is a list of lines, each ending "\n" or "\r\n", maybe without a final terminator.
_line = st.text(alphabet=st.characters(blacklist_characters="\r\n", codec="utf-8"), max_size=12)
_file = st.tuples(
    st.lists(st.tuples(_line, st.sampled_from(["\n", "\r\n"])), max_size=12), st.booleans()
)


def _write(folder: Path, files: list) -> tuple[list[Path], list[str]]:
    """Write the files; return their paths and all their lines, in order."""
    paths, expected = [], []
    for index, (lines, final_terminator) in enumerate(files):
        text = "".join(line + end for line, end in lines)
        expected.extend(line for line, _ in lines)
        if lines and not final_terminator:
            text = text[: -len(lines[-1][1])]
            if not lines[-1][0]:
                expected.pop()  # an empty last line without its terminator is no line at all
        path = folder / f"part-{index:03d}.txt"
        path.write_bytes(text.encode("utf-8"))
        paths.append(path)
    return paths, expected


@settings(max_examples=150, deadline=None)
@given(files=st.lists(_file, min_size=1, max_size=6), world_size=st.integers(1, 64))
def test_every_line_is_read_exactly_once_in_file_order(files: list, world_size: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        paths, expected = _write(Path(folder), files)
        the_plan = plan(paths, world_size)
        per_rank = [read_lines(the_plan, rank, world_size) for rank in range(world_size)]
        assert [line for lines in per_rank for line in lines] == expected
        skipped = [read_lines(the_plan, rank, world_size, skip_blank=True) for rank in range(world_size)]
        assert [line for lines in skipped for line in lines] == [line for line in expected if line]
        # The chunks tile the files byte for byte, whatever the block size.
        for block_bytes in (1, 7, 1 << 20):
            pieces: dict[str, list] = {}
            for rank in range(world_size):
                for chunk in iter_chunks(the_plan, rank, world_size, block_bytes=block_bytes):
                    pieces.setdefault(chunk.source.name, []).append((chunk.start, chunk.data))
                    assert chunk.start == 0 or _byte_before(chunk) == b"\n"
            for path in paths:
                got = sorted(pieces.get(str(path), []))
                assert b"".join(data for _, data in got) == path.read_bytes()


def _byte_before(chunk) -> bytes:
    with open(chunk.source.name, "rb") as f:
        f.seek(chunk.start - 1)
        return f.read(1)


@given(sizes=st.lists(st.integers(0, 10_000), min_size=1, max_size=20), world_size=st.integers(1, 64))
def test_ranges_are_contiguous_and_within_one_byte_of_equal(sizes: list[int], world_size: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for index, size in enumerate(sizes):
            path = Path(folder) / f"{index:02d}"
            path.write_bytes(b"x" * size)
            paths.append(path)
        the_plan = plan(paths, world_size)
        bounds = [the_plan.bounds(rank) for rank in range(world_size)]
        assert bounds[0][0] == 0 and bounds[-1][1] == sum(sizes)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
        widths = [stop - start for start, stop in bounds]
        assert max(widths) - min(widths) <= 1
        for rank, (start, stop) in enumerate(bounds):
            covered = sum(p.stop - p.start for p in the_plan.pieces(rank))
            assert covered == stop - start


def test_seed_example_a_huge_file_and_a_tiny_one_balance_by_bytes(tmp_path: Path) -> None:
    big = tmp_path / "big.txt"
    big.write_text("".join(f"{i},{i + 1}\n" for i in range(15_000)))
    small = tmp_path / "small.txt"
    small.write_text("".join(f"{i},{i + 1}\n" for i in range(50)))
    world_size = 6
    per_rank = [len(read_bytes([big, small], rank, world_size)) for rank in range(world_size)]
    assert sum(per_rank) == big.stat().st_size + small.stat().st_size
    mean = sum(per_rank) / world_size
    assert max(per_rank) / mean <= 1.01


def test_fewer_bytes_than_ranks_gives_the_lines_to_some_ranks_and_nothing_to_others(tmp_path: Path) -> None:
    path = tmp_path / "tiny.txt"
    path.write_bytes(b"a\nb")
    per_rank = [read_lines(path, rank, 16) for rank in range(16)]
    assert [line for lines in per_rank for line in lines] == ["a", "b"]
    assert sum(1 for lines in per_rank if lines) == 2


def test_a_blank_line_does_not_cut_a_file_short(tmp_path: Path) -> None:
    first = tmp_path / "1.txt"
    first.write_text("a\n\nb\nc\n")
    second = tmp_path / "2.txt"
    second.write_text("d\n")
    assert read_lines([first, second], 0, 1, skip_blank=True) == ["a", "b", "c", "d"]


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_read_bytes_holds_the_lines_read_lines_gives_byte_order_marks_left_out(
        tmp_path: Path, world_size: int) -> None:
    """A mark opening any file, not only the first, is not part of its first line."""
    mark = b"\xef\xbb\xbf"
    for name, data in [("1.txt", mark + b"a\n"), ("2.txt", mark + b"b\nc"), ("3.txt", mark),
                       ("4.txt", mark + b"\xc3\xa9\n")]:
        (tmp_path / name).write_bytes(data)
    for rank in range(world_size):
        lines = read_lines(tmp_path, rank, world_size)
        assert read_bytes(tmp_path, rank, world_size) == "".join(f"{line}\n" for line in lines).encode()
    assert read_bytes(tmp_path, 0, 1) == "a\nb\nc\n\u00e9\n".encode()


def test_directories_and_globs_expand_sorted_and_skip_hidden_files(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("b\n")
    (tmp_path / "a.txt").write_text("a\n")
    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / ".a.txt.crc").write_text("junk\n")
    assert read_lines(tmp_path, 0, 1) == ["a", "b"]
    assert read_lines(str(tmp_path / "*.txt"), 0, 1) == ["a"]
    assert read_lines(f"file://{tmp_path}/sub/b.txt", 0, 1) == ["b"]
    # A glob matches as Spark's do: matched directories are walked, hidden names are skipped.
    assert read_lines(str(tmp_path / "*"), 0, 1) == ["a", "b"]
    assert read_lines(str(tmp_path / "**"), 0, 1) == ["a", "b"]
    with pytest.raises(FileNotFoundError, match="names that start with . or _ are skipped"):
        read_lines(str(tmp_path / "_*"), 0, 1)


def test_missing_inputs_raise_errors_naming_them(tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match="input file not found: .*nope.txt"):
        plan([missing], 2)
    with pytest.raises(FileNotFoundError, match=r"no input file matches the glob .*\*.csv"):
        plan(str(tmp_path / "*.csv"), 2)
    (tmp_path / "a.txt").write_text("a\n")
    with pytest.raises(ValueError, match="a.txt is named twice"):
        plan([tmp_path / "a.txt", tmp_path], 2)
    with pytest.raises(ValueError, match="world_size must be at least 1, got 0"):
        plan(tmp_path, 0)


def test_the_plan_prints_as_a_table_with_one_row_per_rank(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x\n" * 100)
    text = str(plan(tmp_path, 3))
    assert "200 bytes, 3 ranks" in text
    rows = [line for line in text.splitlines() if "a.txt@" in line]
    assert len(rows) == 3 and all(os.fspath(tmp_path) in row for row in rows)


def test_a_set_of_paths_is_planned_in_sorted_order(tmp_path: Path) -> None:
    names = [f"{i:02d}.txt" for i in range(20)]
    for name in names:
        (tmp_path / name).write_text(f"{name}\n")
    given = {tmp_path / name for name in names} | {str(tmp_path / "00.txt")}  # str and Path alike
    with pytest.raises(ValueError, match="00.txt is named twice"):
        plan(given, 1)
    given.discard(str(tmp_path / "00.txt"))
    assert [s.name for s in plan(frozenset(given), 3).sources] == [str(tmp_path / n) for n in names]


def test_names_keep_the_spelling_of_the_inputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "data" / "sub").mkdir(parents=True)
    (tmp_path / "data" / "a.txt").write_text("a\n")
    (tmp_path / "data" / "sub" / "b.txt").write_text("b\n")
    monkeypatch.chdir(tmp_path)
    assert [s.name for s in plan("data", 1).sources] == ["data/a.txt", "data/sub/b.txt"]
    assert [s.name for s in plan("./data/", 1).sources] == ["data/a.txt", "data/sub/b.txt"]
    assert [s.name for s in plan("data/*/*.txt", 1).sources] == ["data/sub/b.txt"]
    assert [s.name for s in plan(["data/a.txt"], 1).sources] == ["data/a.txt"]


def test_symlinked_directories_are_walked_once_and_loops_end(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    (root / "sub").mkdir(parents=True)
    elsewhere.mkdir()
    (root / "a.txt").write_text("a\n")
    (elsewhere / "b.txt").write_text("b\n")
    (root / "linked").symlink_to(elsewhere, target_is_directory=True)
    (root / "sub" / "loop").symlink_to(root, target_is_directory=True)  # back to an ancestor
    (root / "sub" / "again").symlink_to(elsewhere, target_is_directory=True)  # walked already
    sources = plan(root, 1).sources
    assert [s.name for s in sources] == [str(root / "a.txt"), str(root / "linked" / "b.txt")]
    assert [s.size for s in sources] == [2, 2]  # never a directory's 4096 bytes
    assert read_lines(root, 0, 1) == ["a", "b"]
    (root / "c.txt").symlink_to(elsewhere / "b.txt")  # a file reached twice is still an error
    with pytest.raises(ValueError, match=r"linked/b.txt \(the same file as .*c.txt\) is named"):
        plan(root, 1)
    assert read_lines(str(tmp_path / "*" / "linked" / "*.txt"), 0, 1) == ["b"]


@pytest.mark.timeout(60)
def test_a_recursive_glob_through_links_back_to_its_folder_ends(tmp_path: Path) -> None:
    """Python's glob follows every path through them: 2**40 with two such links."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("a\n")
    (tmp_path / "sub" / "b.txt").write_text("b\n")
    for name in ("self1", "self2", "sub/up"):
        (tmp_path / name).symlink_to(tmp_path, target_is_directory=True)
    for pattern in ("**/*.txt", "**", "**/", "*/**/*.txt"):
        assert read_lines(str(tmp_path / pattern), 0, 1) == ["a", "b"], pattern


def test_a_glob_ending_in_a_slash_matches_folders_only(tmp_path: Path) -> None:
    import fsspec

    (tmp_path / "sub").mkdir()
    (tmp_path / "top.txt").write_text("top\n")
    (tmp_path / "sub" / "in.txt").write_text("in\n")
    assert read_lines(f"{tmp_path}/*/", 0, 1) == ["in"]  # as a shell's ls -d */
    assert read_lines(f"{tmp_path}/*", 0, 1) == ["in", "top"]
    memory = fsspec.filesystem("memory")
    memory.pipe("/slash/top.txt", b"top\n")
    memory.pipe("/slash/sub/in.txt", b"in\n")
    try:
        assert read_lines("memory://slash/*/", 0, 1) == ["in"]
    finally:
        memory.rm("/slash", recursive=True)


def test_a_recursive_folder_glob_takes_the_files_at_its_top_too_locally_and_remotely(
    tmp_path: Path
) -> None:
    import fsspec

    files = {"x/top.txt": "top", "x/a/in.txt": "in", "x/a/b/deep.txt": "deep", "y.txt": "y"}
    memory = fsspec.filesystem("memory")
    for name, line in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(line + "\n")
        memory.pipe(f"/folders/{name}", f"{line}\n".encode())
    try:
        for pattern, lines in (("x/**/", ["deep", "in", "top"]), ("**/", ["deep", "in", "top", "y"]),
                               ("x/*/", ["deep", "in"])):
            assert read_lines(f"{tmp_path}/{pattern}", 0, 1) == lines, pattern  # as Python's glob
            assert read_lines(f"memory://folders/{pattern}", 0, 1) == lines, pattern
    finally:
        memory.rm("/folders", recursive=True)


def test_a_glob_reads_a_directory_reached_by_two_names_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "a").mkdir(parents=True)
    (data / "a" / "x.txt").write_text("x\n")
    (data / "link").symlink_to(data / "a", target_is_directory=True)  # a sibling, not a loop
    for pattern in ("*", "*/x.txt", "**", "**/*.txt"):
        assert [s.name for s in plan(str(data / pattern), 1).sources] == [
            str(data / "a" / "x.txt")], pattern


def test_a_recursive_glob_names_a_folder_reached_by_two_names_as_pythons_glob_does(
        tmp_path: Path) -> None:
    """By the first name in sorted order, a link's even where the folder is nearer the top."""
    (tmp_path / "d").mkdir()
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "9.txt").write_text("9\n")
    (tmp_path / "d" / "ext").symlink_to(tmp_path / "e", target_is_directory=True)
    assert [s.name for s in plan(str(tmp_path / "**" / "*.txt"), 1).sources] == [
        str(tmp_path / "d" / "ext" / "9.txt")]


def _cross_linked(root: Path, count: int, *, back: bool = True) -> None:
    """``count`` sibling folders, each holding a file and a link to every later one (and to
    every earlier one, ``back``)."""
    for i in range(count):
        (root / f"s{i}").mkdir()
        (root / f"s{i}" / "f.txt").write_text(f"{i}\n")
    for i, j in itertools.permutations(range(count), 2):
        if back or j > i:
            (root / f"s{i}" / f"l{j}").symlink_to(root / f"s{j}", target_is_directory=True)


def test_a_recursive_glob_names_each_folder_by_pythons_first_name_for_it(tmp_path: Path) -> None:
    _cross_linked(tmp_path, 5, back=False)  # (no loop: Python's glob walks every path once)
    first: dict[int, str] = {}
    for match in sorted(glob.glob(str(tmp_path / "**" / "*.txt"), recursive=True)):
        first.setdefault(os.stat(os.path.dirname(match)).st_ino, match)
    assert [s.name for s in plan(str(tmp_path / "**" / "*.txt"), 1).sources] == sorted(
        first.values())


@pytest.mark.timeout(60)
def test_a_recursive_glob_through_many_cross_links_reads_each_folder_once(tmp_path: Path) -> None:
    _cross_linked(tmp_path, 12)  # 12! paths through the links, each folder found at once
    assert sorted(read_lines(str(tmp_path / "**" / "*.txt"), 0, 1), key=int) == [
        str(i) for i in range(12)]


def test_a_folder_linked_from_a_hidden_one_keeps_its_visible_name(tmp_path: Path) -> None:
    (tmp_path / "_staging" / "part").mkdir(parents=True)  # ("_" sorts before letters)
    (tmp_path / "_staging" / "part" / "a.txt").write_text("a\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "part").symlink_to(tmp_path / "_staging" / "part",
                                            target_is_directory=True)
    assert [s.name for s in plan(str(tmp_path / "**" / "*.txt"), 1).sources] == [
        str(tmp_path / "data" / "part" / "a.txt")]
    assert [s.name for s in plan(str(tmp_path / "**" / "_staging" / "*" / "*.txt"), 1).sources
            ] == [str(tmp_path / "_staging" / "part" / "a.txt")]


def test_a_glob_skips_files_in_hidden_folders_unless_it_names_them(tmp_path: Path) -> None:
    (tmp_path / "_tmp").mkdir()
    (tmp_path / "_tmp" / "part-1.txt").write_text("unfinished\n")
    (tmp_path / "part-0.txt").write_text("done\n")
    assert read_lines(str(tmp_path / "**" / "part-*.txt"), 0, 1) == ["done"]
    with pytest.raises(FileNotFoundError, match="names that start with . or _ are skipped"):
        read_lines(str(tmp_path / "*" / "part-*.txt"), 0, 1)
    assert read_lines(str(tmp_path / "_tmp" / "*.txt"), 0, 1) == ["unfinished"]


def test_broken_and_looping_symlinks_are_errors_naming_them(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a\n")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone.txt")
    with pytest.raises(FileNotFoundError, match=r"'.*dangling' is a symbolic link that leads "
                                                r"nowhere \(No such file"):
        plan(tmp_path, 1)
    (tmp_path / "dangling").unlink()
    (tmp_path / "one").symlink_to(tmp_path / "two")
    (tmp_path / "two").symlink_to(tmp_path / "one")
    with pytest.raises(FileNotFoundError, match=r"'.*one' is a symbolic link that leads nowhere "
                                                r"\(Too many levels"):
        plan(tmp_path, 1)
    (tmp_path / "one").unlink()
    (tmp_path / "two").unlink()
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ValueError, match=r"input '.*pipe' is neither a file nor a directory"):
        plan(tmp_path, 1)


def test_a_fifo_device_or_broken_link_named_directly_is_said_to_be_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    os.mkfifo("pipe")
    Path("dangling").symlink_to("nowhere")
    for name in ("pipe", os.devnull):
        with pytest.raises(ValueError, match=rf"^input '{name}' is neither a file nor a "
                                             r"directory \(a socket, FIFO or device\)"):
            plan(name, 1)
    with pytest.raises(FileNotFoundError, match=r"^input 'dangling' is a symbolic link that "
                                                r"leads nowhere"):
        plan("dangling", 1)


def test_messages_name_local_files_as_spelled_not_by_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("d").mkdir()
    Path("d/a.csv").write_text("1,2\n")
    os.mkfifo("d/pipe")
    for spelled in ("d", "d/*"):
        with pytest.raises(ValueError, match=r"^input 'd/pipe' is neither"):
            plan(spelled, 1)
    Path("d/pipe").unlink()
    Path("d/locked.csv").write_text("3,4\n")
    real_open = LocalFileSystem.open

    def denied(self, path, *args, **kwargs):  # as the OS answers a user without read rights
        if path.endswith("locked.csv"):
            raise PermissionError(13, "Permission denied", path)
        return real_open(self, path, *args, **kwargs)

    monkeypatch.setattr(LocalFileSystem, "open", denied)
    with pytest.raises(PermissionError, match=r"^input 'd/locked.csv' cannot be opened "
                                              r"\(Permission denied\): check its permissions$"):
        read_lines("d", 0, 1)


def test_a_folder_of_hidden_files_says_they_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "_part-0.csv").write_text("1,2\n")
    (tmp_path / ".part-1.csv").write_text("3,4\n")
    with pytest.raises(FileNotFoundError, match=r"holds no files \(names that start with \. or _ "
                                                r"are skipped\)"):
        plan(tmp_path, 1)


def test_a_file_that_shrank_after_planning_is_an_error_and_appended_bytes_are_not_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a.txt"
    path.write_text("1\n2\n3\n")
    the_plan = plan(path, 2)
    with open(path, "a") as f:
        f.write("4\n")
    assert [read_lines(the_plan, rank, 2) for rank in range(2)] == [["1", "2"], ["3"]]
    path.write_text("1\n")
    with pytest.raises(OSError, match=r"a.txt has 2 bytes but had 6 when the load was planned"):
        list(iter_chunks(the_plan, 1, 2))

    def grown(planned: str, added: str):  # a plan for 2 ranks, made before ``added`` came
        path.write_text(planned)
        the_plan = plan(path, 2)
        with open(path, "a") as f:
            f.write(added)
        return the_plan

    # A planned last line with no end, which the bytes added go on with, is not read cut short
    the_plan = grown("1,2\n3,4", "5\n")
    assert read_lines(the_plan, 0, 2) == ["1,2"]
    with pytest.raises(OSError, match=r"a.txt grew from 7 bytes.*to 9.*go on with its last line"):
        read_lines(the_plan, 1, 2)
    # Whichever rank reads that line is stopped (here the first, whose share runs to the end)
    the_plan = grown("1,2\n3,4,5,6,7,8,9", "0\n")
    assert read_lines(the_plan, 1, 2) == []
    with pytest.raises(OSError, match=r"a.txt grew from 17 bytes.*go on with its last line"):
        read_lines(the_plan, 0, 2)
    # Bytes added that begin with the line's end leave it whole: it is read as planned
    the_plan = grown("1,2\n3,4", "\n5\n")
    assert [read_lines(the_plan, rank, 2) for rank in range(2)] == [["1,2"], ["3,4"]]
    # Bytes added while the file is read, after its size was looked at, are seen too
    path.write_text("1\n2\n3\n4,5")
    chunks = iter_chunks(plan(path, 1), 0, 1, block_bytes=2)
    assert next(chunks).data == b"1\n"
    with open(path, "a") as f:
        f.write("6\n")
    with pytest.raises(OSError, match=r"a.txt grew from 9 bytes.*to 11.*go on with its last line"):
        list(chunks)


def test_a_wildcard_at_an_object_stores_root_matches_its_top_folders() -> None:
    import fsspec

    memory = fsspec.filesystem("memory")
    memory.pipe("/wild-a/top-of-store.txt", b"a\n")
    memory.pipe("/wild-b/deep/top-of-store.txt", b"b\n")
    try:
        for pattern, lines in (("memory://wild-*/top-of-store.txt", ["a"]), ("memory://**/top-of-store.txt", ["a", "b"]),
                               ("memory://wild-?/**", ["a", "b"])):
            assert read_lines(pattern, 0, 1) == lines, pattern
    finally:
        memory.rm("/wild-a", recursive=True)
        memory.rm("/wild-b", recursive=True)


def test_line_numbers_are_right_in_any_order_of_asking(tmp_path: Path) -> None:
    """Each count starts from the nearest place counted before: any order gives the same."""
    path = tmp_path / "lines.txt"
    lines = [f"{i}," * (i % 7) + "\n" for i in range(3000)]
    path.write_text("".join(lines))
    starts = list(itertools.accumulate(len(line) for line in lines))[:-1]
    (source,) = plan(path, 1).sources
    for line in [2999, 10, 1500, 1499, 0, 2998, 700, 1501, 1500]:
        start = 0 if line == 0 else starts[line - 1]
        assert Chunk(source, start, lines[line].encode()).line_number() == line + 1


def test_a_path_naming_a_file_is_that_file_even_with_glob_characters(tmp_path: Path) -> None:
    for name, text in (("a[12].txt", "1,2\n"), ("a1.txt", "7,8\n"), ("q?.txt", "9,9\n"),
                       ("qz.txt", "0,0\n")):
        (tmp_path / name).write_text(text)
    assert read_lines(tmp_path / "a[12].txt", 0, 1) == ["1,2"]
    assert read_lines(tmp_path / "q?.txt", 0, 1) == ["9,9"]
    assert sorted(read_lines(tmp_path / "q*.txt", 0, 1)) == ["0,0", "9,9"]  # a glob still


def test_an_empty_path_is_refused_rather_than_the_working_directory_read(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"an input path is empty \(''"):
        plan("", 1)
    with pytest.raises(ValueError, match="an input path is empty"):
        plan([tmp_path, ""], 1)


def test_file_names_show_as_they_are_in_the_plan_never_as_markup(tmp_path: Path) -> None:
    (tmp_path / "x[").mkdir()
    (tmp_path / "x[" / "y]z.txt").write_text("1,2\n")
    (tmp_path / "[bold]a.txt").write_text("3,4\n")
    shown = str(plan(tmp_path, 1))
    assert "[bold]a.txt@0" in shown and "x[/y]z.txt@4" in shown
    assert plan(tmp_path / "[bold]a.txt", 1).sources[0].name == str(tmp_path / "[bold]a.txt")


def test_a_file_named_again_through_a_hard_link_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("1,2\n")
    os.link(tmp_path / "a.txt", tmp_path / "b.txt")
    with pytest.raises(ValueError, match=r"b.txt \(the same file as .*a.txt\) is named twice"):
        plan([tmp_path / "a.txt", tmp_path / "b.txt"], 1)


def test_line_numbers_are_those_of_the_file_as_planned_when_rewritten_at_the_same_size(
        tmp_path: Path) -> None:
    path = tmp_path / "e.txt"
    for lines in (["a" * 9] * 10 + ["b"], ["a" * 4] * 20 + ["b"]):  # 101 bytes each time
        path.write_text("".join(f"{line}\n" for line in lines))
        (source,) = plan(path, 1).sources
        data = path.read_bytes()
        assert Chunk(source, data.index(b"b"), b"b\n").line_number() == len(lines)
