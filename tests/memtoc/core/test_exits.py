"""The job boundary (memtoc.core.exits): an outside library's decoding error becomes one line naming the file being
read; an error of our own code keeps its traceback."""

from __future__ import annotations

import json
import struct

import pytest

from memtoc.core.errors import MemtocError
from memtoc.core.exits import InputDecodeError, input_errors, reported


def _read_text(path) -> str:
    with open(path, encoding="utf-8") as fh:       # the open file names the input
        return fh.read()


def _read_json(path) -> object:
    return json.loads(path.read_bytes().decode("utf-8", errors="replace"))


def _read_header(path) -> tuple[int, ...]:
    data = path.read_bytes()
    return struct.unpack("<IQ", data[:12])


@pytest.mark.parametrize("reader, content, kind", [
    (_read_text, b"\x89HDF\r\n\x1a\n\xff\xfe", "UnicodeDecodeError"),
    (_read_json, b'{"a": 1,', "JSONDecodeError"),
    (_read_header, b"GGUF", "error"),
], ids=["binary-as-text", "broken-json", "short-header"])
def test_a_decoding_error_becomes_one_line_naming_the_file(tmp_path, reader, content, kind) -> None:
    path = tmp_path / "input.bin"
    path.write_bytes(content)
    with pytest.raises(InputDecodeError) as info:
        with input_errors():
            reader(path)
    text = str(info.value)
    assert len(text.splitlines()) == 1 and str(path) in text and kind in text, text
    assert isinstance(info.value, MemtocError)


def test_a_library_error_known_by_name_is_converted(tmp_path) -> None:
    """safetensors' own error type (matched by module and name: the core layer imports no library)."""
    error = type("SafetensorError", (Exception,), {"__module__": "safetensors._safetensors_rust"})
    path = tmp_path / "lens.safetensors"
    path.write_bytes(b"\0" * 4)

    def read(p):
        raise error("Error while deserializing header: HeaderTooSmall")

    with pytest.raises(InputDecodeError, match="lens.safetensors cannot be read .*HeaderTooSmall"):
        with input_errors():
            read(path)


def test_without_a_file_in_reach_the_line_says_an_input(tmp_path) -> None:
    with pytest.raises(InputDecodeError, match="an input could not be read"):
        with input_errors():
            b"\xff".decode("utf-8")


@pytest.mark.parametrize("bug", [KeyError("episodes"), ValueError("n_splits=0"), TypeError("None"),
                                 ZeroDivisionError("division by zero")], ids=lambda e: type(e).__name__)
def test_an_error_of_our_own_code_is_not_hidden(bug, tmp_path) -> None:
    path = tmp_path / "input.json"
    path.write_text("{}", encoding="utf-8")

    def job():
        _ = path           # a file in reach changes nothing: only decoding errors are converted
        raise bug

    with pytest.raises(type(bug)):
        with input_errors():
            job()
    with pytest.raises(type(bug)):
        reported("x", job)


def test_reported_prints_one_line_and_exit_2(tmp_path, capsys) -> None:
    path = tmp_path / "questions.jsonl"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff")
    assert reported("evaluate", lambda: _read_text(path)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("memtoc evaluate: error: ") and str(path) in err and len(err.splitlines()) == 1, err


def test_the_api_and_the_cli_say_the_same_for_a_binary_benchmark(tmp_path, capsys, monkeypatch) -> None:
    """``--benchmark <binary file>`` (a UnicodeDecodeError inside the loader): one line on both front doors,
    before any model loads."""
    import memtoc as mt
    import memtoc.backends.factory as factory
    from memtoc.cli import main

    monkeypatch.setattr(factory, "load_backend", lambda *a, **k: pytest.fail("the model loader was reached"))
    bench = tmp_path / "bench.jsonl"
    bench.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(range(128, 256)))
    model = tmp_path / "model"                  # a model's config alone: the pre-load checks read only that
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 8}))
    assert main(["evaluate", "--model", str(model), "--benchmark", str(bench), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bench) in err, err
    with pytest.raises(MemtocError) as info:
        mt.evaluate(model=str(model), benchmark=str(bench), out=str(tmp_path / "r2"))
    assert str(bench) in str(info.value) and err.endswith(str(info.value))


@pytest.mark.parametrize("name", ["two\nlines.jsonl", "tab\there.jsonl", "esc\x1b[2J.jsonl"])
def test_an_error_naming_a_path_with_a_control_character_is_one_line(tmp_path, capsys, name) -> None:
    """A path holding a newline (or another control character) is escaped in the one-line error."""
    from memtoc.cli import main

    path = tmp_path / name
    assert reported("evaluate", lambda: _read_text(path)) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and not any(c in err.strip() for c in "\t\x1b"), err
    assert repr(name)[1:-1] in err, err
    assert main(["direction", "--activations", str(path), "--contrast", "tool_wrong:tool_right", "--all-questions",
                 "--out", str(tmp_path / "d.json")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and repr(name)[1:-1] in err, err
