"""Results files as users leave them: random bytes are one clear error, a corrupt middle line is a warning
and every good record is kept, a torn last line (a crash while appending) is skipped quietly."""

from __future__ import annotations

import json
import logging
import os

import pytest

from gpuwise.errors import GpuwiseError
from gpuwise.jsonl import append_line, read_lines


def test_random_bytes_are_one_clear_error(tmp_path):
    path = tmp_path / "tune.jsonl"
    path.write_bytes(os.urandom(4096).replace(b"\n", b"\x00") + b"\n" + os.urandom(100))
    with pytest.raises(GpuwiseError, match="is not a gpuwise results file"):
        read_lines(path)


def test_a_corrupt_middle_line_warns_and_keeps_every_good_record(tmp_path, caplog):
    path = tmp_path / "tune.jsonl"
    good = [{"n": i} for i in range(4)]
    path.write_bytes(b"\n".join([json.dumps(good[0]).encode(), json.dumps(good[1]).encode(), b"\xff\xfe{garbage",
                                 json.dumps(good[2]).encode(), b"[1, 2]", json.dumps(good[3]).encode()]) + b"\n")
    with caplog.at_level(logging.WARNING, logger="gpuwise"):
        assert read_lines(path) == good
    assert "skipped 2 corrupt line(s) (line 3, 5); kept 4 good records" in caplog.text


def test_a_torn_last_line_is_quiet_and_the_next_append_starts_a_new_line(tmp_path, caplog):
    path = tmp_path / "tune.jsonl"
    append_line(path, {"n": 1})
    with open(path, "ab") as fh:
        fh.write(b'{"n": 2, "sta')  # killed mid-write
    with caplog.at_level(logging.WARNING, logger="gpuwise"):
        assert read_lines(path) == [{"n": 1}]
    assert caplog.text == ""
    append_line(path, {"n": 3})
    assert read_lines(path) == [{"n": 1}, {"n": 3}]


def test_the_cli_says_it_in_one_line(tmp_path, capsys):
    from gpuwise.cli import main

    path = tmp_path / "tune.jsonl"
    path.write_bytes(os.urandom(2048).replace(b"\n", b" "))
    assert main(["tune", "examples:mlp", "--results", str(path), "--budget", "10s"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a gpuwise results file" in err[0]
