"""Trace readers and the writer: tiny fixtures, the real shared traces, and every error case."""
from pathlib import Path

import numpy as np
import pytest

from stepcal.core.errors import InputError
from stepcal.core.trace import Trace
from stepcal.core.workload import read_trace, write_trace

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "data"
SHARED_DATA = REPO.parent / "shared" / "data"
AZURE = SHARED_DATA / "traces" / "azure_llm_2023"
MOONCAKE = SHARED_DATA / "traces" / "mooncake" / "conversation_trace.jsonl"


def shared(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"shared data not present: {path}")
    return path


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---- each format on a tiny fixture ----

def test_azure_keeps_the_seventh_fractional_digit():
    trace = read_trace(FIXTURES / "azure_tiny.csv")
    assert trace.arrival_s[0] == 0.0
    assert trace.arrival_s[1] == pytest.approx(1e-7, abs=1e-12)      # .6805900 -> .6805901
    assert trace.arrival_s[2] == pytest.approx(4.314579, abs=1e-9)
    assert trace.arrival_s[3] == pytest.approx(14.31941, abs=1e-9)
    assert trace.num_prompt_tokens.tolist() == [374, 396, 879, 91]
    assert trace.num_output_tokens.tolist() == [44, 109, 17, 1]
    assert trace.prefix_hash_ids is None


def test_mooncake_converts_ms_and_keeps_hash_ids():
    trace = read_trace(FIXTURES / "mooncake_tiny.jsonl")
    np.testing.assert_allclose(trace.arrival_s, [0.0, 3.053, 3.053])
    assert trace.num_prompt_tokens.tolist() == [6955, 6472, 400]
    assert trace.num_output_tokens.tolist() == [52, 26, 3]
    assert trace.prefix_hash_ids[1][-1] == 2366 and trace.prefix_hash_ids[2] == [7]


def test_vidur_shifts_to_zero():
    trace = read_trace(FIXTURES / "vidur_tiny.csv")
    np.testing.assert_allclose(trace.arrival_s, [0.0, 0.75, 2.5])
    assert trace.num_prompt_tokens.tolist() == [120, 2048, 64]
    assert trace.num_output_tokens.tolist() == [30, 1, 256]


def test_stepcal_reads_optional_columns():
    trace = read_trace(FIXTURES / "stepcal_tiny.csv")
    assert trace.request_id.tolist() == [10, 11, 12]
    assert trace.arrival_s.tolist() == [0.0, 0.25, 1.5]
    assert trace.priority.tolist() == [1, 0, 2]
    np.testing.assert_array_equal(trace.slo_ttft_ms, [500.0, np.nan, 1000.0])
    np.testing.assert_array_equal(trace.slo_tpot_ms, [50.0, np.nan, np.nan])
    assert trace.prefix_hash_ids == [[1, 2, 3], [], [1, 2]]


def test_forced_format_and_unknown_format(tmp_path):
    path = write(tmp_path, "t.txt", "arrived_at,num_prefill_tokens,num_decode_tokens\n2,5,6\n")
    assert read_trace(path, "vidur").num_prompt_tokens.tolist() == [5]
    with pytest.raises(InputError, match=r"t\.txt: missing column 'TIMESTAMP'"):
        read_trace(path, "azure")
    with pytest.raises(InputError, match="unknown trace format 'sharegpt'"):
        read_trace(path, "sharegpt")


def test_unsorted_arrivals_are_sorted_with_hashes_kept_in_step(tmp_path):
    path = write(tmp_path, "m.jsonl",
                 '{"timestamp": 900, "input_length": 9, "output_length": 1, "hash_ids": [9]}\n'
                 '\n'
                 '{"timestamp": 100, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n')
    trace = read_trace(path)
    assert trace.arrival_s.tolist() == [0.0, 0.8]
    assert trace.num_prompt_tokens.tolist() == [1, 9]
    assert trace.prefix_hash_ids == [[1], [9]]
    assert any("not sorted" in w for w in trace.warnings)


# ---- the real shared traces ----

@pytest.mark.parametrize("name, rows", [("AzureLLMInferenceTrace_conv.csv", 19_366),
                                        ("AzureLLMInferenceTrace_code.csv", 8_819)])
def test_real_azure_traces(name, rows):
    trace = read_trace(shared(AZURE / name))
    assert len(trace) == rows
    assert trace.arrival_s[0] == 0.0 and (np.diff(trace.arrival_s) >= 0).all()
    assert trace.warnings == []
    assert 3400 < trace.arrival_s[-1] < 3600                 # one hour of requests


def test_real_azure_conv_values():
    trace = read_trace(shared(AZURE / "AzureLLMInferenceTrace_conv.csv"))
    # first rows: 18:15:46.6805900 (374, 44) and 18:15:50.9951690 (396, 109)
    assert trace.arrival_s[1] == pytest.approx(4.314579, abs=1e-9)
    assert trace.num_prompt_tokens[:2].tolist() == [374, 396]
    assert trace.num_output_tokens.mean() == pytest.approx(211.126, abs=0.01)


def test_real_mooncake_trace():
    trace = read_trace(shared(MOONCAKE))
    assert len(trace) == 12_031
    assert trace.arrival_s[0] == 0.0 and (np.diff(trace.arrival_s) >= 0).all()
    assert trace.arrival_s[-1] == pytest.approx(3536.999)
    assert trace.prefix_hash_ids[0] == list(range(14))
    assert trace.num_prompt_tokens.mean() == pytest.approx(12_035, rel=1e-3)


# ---- errors name the file, the row and the column ----

HEADER = "arrival_s,num_prompt_tokens,num_output_tokens\n"


@pytest.mark.parametrize("body, pattern", [
    ("0,10,5\n1,-3,5\n", r"line 3 \(data row 2\): column 'num_prompt_tokens' must be positive, got -3"),
    ("0,10,5\n1,10,0\n", r"line 3 \(data row 2\): column 'num_output_tokens' must be positive, got 0"),
    ("0,10,5\n1,,5\n", r"line 3 \(data row 2\): column 'num_prompt_tokens' is missing"),
    ("0,10,5\n1,NaN,5\n", r"line 3 \(data row 2\): column 'num_prompt_tokens' is missing"),
    ("0,10,5\nsoon,10,5\n", r"line 3 \(data row 2\): column 'arrival_s' is not a number, got 'soon'"),
    ("0,10,5\n1,2.5,5\n", r"line 3 \(data row 2\): column 'num_prompt_tokens' must be a whole number"),
    ("0,10,5\n-1,10,5\n", r"line 3 \(data row 2\): column 'arrival_s' must not be negative"),
    ("0,10,5\n\n1,10,x\n", r"line 4 \(data row 3\): column 'num_output_tokens' is not a number, got 'x'"),
])
def test_stepcal_csv_errors(tmp_path, body, pattern):
    path = write(tmp_path, "bad.csv", HEADER + body)
    with pytest.raises(InputError, match=r"bad\.csv: " + pattern):
        read_trace(path)


def test_azure_errors(tmp_path):
    header = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    path = write(tmp_path, "az.csv", header + "2023-11-16 18:15:46.6805900,5,5\nyesterday,5,5\n")
    with pytest.raises(InputError, match=r"az\.csv: line 3 \(data row 2\): column 'TIMESTAMP' "
                                         r"is not a date-time.*got 'yesterday'"):
        read_trace(path)
    path = write(tmp_path, "az.csv", header + "2023-11-16 18:15:46.6805900,5,0\n")
    with pytest.raises(InputError, match=r"line 2 \(data row 1\): column 'GeneratedTokens' must be positive"):
        read_trace(path)


def test_mooncake_errors(tmp_path):
    good = '{"timestamp": 0, "input_length": 5, "output_length": 5}\n'
    cases = [
        ('{"timestamp": 0, "input_length": 5, "output_length": -1}\n',
         r"line 2: column 'output_length' must be positive, got -1"),
        ('{"timestamp": "noon", "input_length": 5, "output_length": 1}\n',
         r"line 2: column 'timestamp' is not a number, got 'noon'"),
        ('{"timestamp": 1, "input_length": 5}\n', r"line 2: column 'output_length' is missing"),
        ('{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": "abc"}\n',
         r"line 2: column 'hash_ids' must be a list of integers"),
        ('{"timestamp": 1, \n', r"line 2: not valid JSON"),
    ]
    for line, pattern in cases:
        path = write(tmp_path, "mc.jsonl", good + line)
        with pytest.raises(InputError, match=r"mc\.jsonl: " + pattern):
            read_trace(path)


def test_file_level_errors(tmp_path):
    with pytest.raises(InputError, match=r"nothing\.csv: no such file"):
        read_trace(tmp_path / "nothing.csv")
    with pytest.raises(InputError, match="is a directory"):
        read_trace(tmp_path)
    with pytest.raises(InputError, match=r"empty\.csv: the file is empty"):
        read_trace(write(tmp_path, "empty.csv", ""))
    with pytest.raises(InputError, match=r"header\.csv: the trace has no requests"):
        read_trace(write(tmp_path, "header.csv", HEADER))
    with pytest.raises(InputError, match=r"odd\.csv: cannot tell the trace format.*--trace-format"):
        read_trace(write(tmp_path, "odd.csv", "a,b\n1,2\n"))
    with pytest.raises(InputError, match=r"v\.csv: missing column 'num_decode_tokens'"):
        read_trace(write(tmp_path, "v.csv", "arrived_at,num_prefill_tokens\n1,2\n"))
    with pytest.raises(InputError, match=r"x\.parquet: not a readable Parquet file"):
        read_trace(write(tmp_path, "x.parquet", "not parquet"))
    with pytest.raises(InputError, match=r"dup\.csv: line 3 \(data row 2\): column 'request_id' repeats"):
        read_trace(write(tmp_path, "dup.csv", "request_id," + HEADER + "4,0,1,1\n4,1,1,1\n"))


def test_parquet_errors_count_data_rows(tmp_path):
    import pandas as pd
    path = tmp_path / "bad.parquet"
    pd.DataFrame({"arrival_s": [0.0, 1.0], "num_prompt_tokens": [3, 0],
                  "num_output_tokens": [1, 1]}).to_parquet(path)
    with pytest.raises(InputError, match=r"bad\.parquet: data row 2 \(1-based\): column 'num_prompt_tokens'"):
        read_trace(path)


# ---- writing ----

def assert_same_trace(a: Trace, b: Trace):
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)     # exact: no precision lost
    for name in ("num_prompt_tokens", "num_output_tokens", "request_id", "priority",
                 "slo_ttft_ms", "slo_tpot_ms"):
        left, right = getattr(a, name), getattr(b, name)
        assert (left is None) == (right is None), name
        if left is not None:
            np.testing.assert_array_equal(left, right, err_msg=name)
    assert a.prefix_hash_ids == b.prefix_hash_ids


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_round_trip_with_every_column(tmp_path, suffix):
    trace = read_trace(FIXTURES / "stepcal_tiny.csv")
    trace.arrival_s = trace.arrival_s + 1 / 3     # a float that needs all 17 digits
    path = write_trace(trace, tmp_path / f"t{suffix}")
    assert_same_trace(read_trace(path), trace)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_round_trip_of_mooncake_hashes(tmp_path, suffix):
    trace = read_trace(FIXTURES / "mooncake_tiny.jsonl")
    back = read_trace(write_trace(trace, tmp_path / f"m{suffix}"))
    assert_same_trace(back, trace)
    assert back.prefix_hash_ids[0] == [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2353, 2354]


def test_parquet_keeps_all_empty_hash_lists(tmp_path):
    trace = read_trace(FIXTURES / "vidur_tiny.csv")
    trace.prefix_hash_ids = [[], [], []]
    assert read_trace(write_trace(trace, tmp_path / "e.parquet")).prefix_hash_ids == [[], [], []]


def test_write_rejects_other_suffixes_and_leaves_nothing(tmp_path):
    trace = read_trace(FIXTURES / "vidur_tiny.csv")
    with pytest.raises(InputError, match=r"t\.json: a trace is written as \.csv or \.parquet"):
        write_trace(trace, tmp_path / "t.json")
    assert list(tmp_path.iterdir()) == []
