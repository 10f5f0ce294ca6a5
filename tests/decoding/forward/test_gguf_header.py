"""The GGUF header reader against the gguf package's own reader and writer: every value type,
arrays of numbers and of strings, both byte orders, custom alignment, and broken files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFEndian, GGUFReader, GGUFValueType, GGUFWriter

from speculative_complete.decoding.forward.gguf_header import GgufHeaderError, StringArray, read_header
from speculative_complete.decoding.models.loading import default_gguf_path


def _same(mine: object, theirs: object) -> bool:
    if isinstance(mine, StringArray):
        return isinstance(theirs, list) and mine.count == len(theirs)
    if isinstance(mine, np.ndarray):
        return mine.tolist() == list(theirs)
    return mine == theirs


def assert_as_gguf_reads(path: Path) -> None:
    """Every metadata value and tensor as ``GGUFReader`` reads the same file."""
    header, with_strings, reader = read_header(path), read_header(path, strings=True), GGUFReader(str(path))
    theirs = {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}
    assert set(header.fields) == set(theirs)
    for key, value in theirs.items():
        assert _same(header.fields[key], value), key
        if isinstance(header.fields[key], StringArray):
            assert with_strings.fields[key] == value, key
    assert list(header.tensors) == [t.name for t in reader.tensors]
    assert header.data_offset == reader.data_offset
    for t in reader.tensors:
        mine = header.tensors[t.name]
        assert mine.kind == t.tensor_type
        assert mine.shape == tuple(int(d) for d in reversed(t.shape))
        assert (mine.offset, mine.nbytes) == (t.data_offset, t.n_bytes)


def test_the_default_model_reads_as_the_gguf_package_reads_it() -> None:
    assert_as_gguf_reads(default_gguf_path())


def write_file(path: Path, endian: GGUFEndian, alignment: int | None = None) -> None:
    writer = GGUFWriter(str(path), "llama", endianess=endian)
    if alignment:
        writer.add_custom_alignment(alignment)
    writer.add_uint8("t.u8", 200)
    writer.add_int8("t.i8", -100)
    writer.add_uint16("t.u16", 60000)
    writer.add_int16("t.i16", -30000)
    writer.add_uint32("t.u32", 4_000_000_000)
    writer.add_int32("t.i32", -2_000_000_000)
    writer.add_float32("t.f32", 0.1)
    writer.add_uint64("t.u64", 2**63 + 5)
    writer.add_int64("t.i64", -(2**62))
    writer.add_float64("t.f64", 1e300)
    writer.add_bool("t.bool", True)
    writer.add_string("t.str", "héllo ✓")
    writer.add_array("t.ints", [3, -1, 7])
    writer.add_array("t.floats", [0.5, 1.5])
    writer.add_array("t.strs", ["a", "", "ü" * 40])
    writer.add_array("t.empty", [])
    writer.add_tensor("w", np.arange(96, dtype=np.float32).reshape(3, 32))
    writer.add_tensor("v", np.ones((64,), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("endian", [GGUFEndian.LITTLE, GGUFEndian.BIG])
@pytest.mark.parametrize("alignment", [None, 64])
def test_every_value_type_reads_as_written(tmp_path: Path, endian: GGUFEndian, alignment: int | None) -> None:
    path = tmp_path / "t.gguf"
    write_file(path, endian, alignment)
    header = read_header(path, strings=True)
    assert header.get("t.u64") == 2**63 + 5 and header.get("t.i16") == -30000 and header.get("t.bool") is True
    assert header.get("t.str") == "héllo ✓" and header.get("t.strs") == ["a", "", "ü" * 40]
    assert header.get("t.ints").tolist() == [3, -1, 7] and header.get("t.missing", 9) == 9
    assert read_header(path).get("t.strs") == StringArray(3)
    assert header.tensors["w"].kind == GGMLQuantizationType.F32 and header.tensors["w"].shape == (3, 32)
    data = np.memmap(path, mode="r")
    w = header.tensors["w"]
    order = "<" if endian == GGUFEndian.LITTLE else ">"
    values = np.frombuffer(data[w.offset : w.offset + w.nbytes], dtype=np.dtype(order + "f4"))
    assert values.tolist() == list(range(96))
    if endian == GGUFEndian.LITTLE:  # the gguf package reads only files in this machine's order
        assert_as_gguf_reads(path)


def test_broken_files_give_a_header_error(tmp_path: Path) -> None:
    path = tmp_path / "t.gguf"
    write_file(path, GGUFEndian.LITTLE)
    whole = path.read_bytes()
    version_1 = whole[:4] + (1).to_bytes(4, "little") + whole[8:]
    for broken in (b"", b"GGML" + whole[4:], version_1, whole[:300], whole[:-8]):
        path.write_bytes(broken)
        with pytest.raises(GgufHeaderError):
            read_header(path)
    with pytest.raises(OSError):
        read_header(tmp_path / "missing.gguf")


def test_a_value_type_the_format_does_not_have_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "t.gguf"
    write_file(path, GGUFEndian.LITTLE)
    whole = bytearray(path.read_bytes())
    at = whole.index(b"t.u8") + len(b"t.u8")  # the value type follows the key
    assert int.from_bytes(whole[at : at + 4], "little") == GGUFValueType.UINT8
    whole[at : at + 4] = (77).to_bytes(4, "little")
    path.write_bytes(bytes(whole))
    with pytest.raises(GgufHeaderError, match="value type 77"):
        read_header(path)
