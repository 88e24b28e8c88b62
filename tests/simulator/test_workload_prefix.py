"""Prefix hash ids in traces: the readers' contract and `stepcal trace stats`' reuse figure."""
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stepcal.core.errors import InputError
from stepcal.core.trace import Trace
from stepcal.core.workload import lru_prefix_hits, read_trace, trace_stats, unbounded_prefix_hits, write_trace
from stepcal.experiments import cli

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "data"
MOONCAKE_TINY = FIXTURES / "mooncake_tiny.jsonl"


@pytest.fixture(autouse=True)
def only_the_trace_command(monkeypatch):
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("trace",))


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def reuse_trace() -> Trace:
    """Six requests over 4-token blocks; the hits each should get are worked out in the test."""
    prompts = [10, 12, 10, 8, 20, 5]
    ids = [[1, 2, 3], [1, 2, 7], [1, 2, 3], [9, 1], [1], []]
    return Trace.from_arrays(np.arange(6.0), prompts, [1] * 6, prefix_hash_ids=ids, prefix_block_tokens=4)


# ---- the readers ----

def test_csv_ids_read_as_lists_including_single_and_empty_cells(tmp_path):
    # A column whose cells each hold one id is parsed by pandas as numbers: still lists.
    path = write(tmp_path, "one.csv", "arrival_s,num_prompt_tokens,num_output_tokens,prefix_hash_ids\n"
                                      "0,20,1,5\n1,20,1,\n2,40,1,7\n")
    trace = read_trace(path)
    assert trace.prefix_hash_ids == [[5], [], [7]]
    assert trace.prefix_block_tokens == 16


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_stepcal_ids_round_trip(tmp_path, suffix):
    trace = Trace.from_arrays([0.0, 1.0, 2.0], [40, 16, 17], [1, 1, 1],
                              prefix_hash_ids=[[0, 1, 2], [0], [2**62, 3]])
    back = read_trace(write_trace(trace, tmp_path / f"t{suffix}"))
    assert back.prefix_hash_ids == [[0, 1, 2], [0], [2**62, 3]]
    assert back.prefix_block_tokens == 16


def test_mooncake_sets_512_token_blocks_and_the_flag_overrides_it(tmp_path):
    trace = read_trace(MOONCAKE_TINY)
    assert trace.prefix_block_tokens == 512
    assert trace.prefix_hash_ids[0] == [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2353, 2354]
    assert read_trace(MOONCAKE_TINY, prefix_block_tokens=256).prefix_block_tokens == 256
    # The flag sets what the file's ids mean, so a list too long for it is refused.
    with pytest.raises(InputError, match=r"line 1: column 'hash_ids' has 14 ids, more than the 7 blocks"):
        read_trace(MOONCAKE_TINY, prefix_block_tokens=1024)
    # A converted Mooncake trace keeps its ids; its block size is given when reading it back.
    csv = write_trace(trace, tmp_path / "m.csv")
    assert read_trace(csv, prefix_block_tokens=512).prefix_hash_ids == trace.prefix_hash_ids


HEADER = "arrival_s,num_prompt_tokens,num_output_tokens,prefix_hash_ids\n0,32,1,1 2\n"


@pytest.mark.parametrize("row, message", [
    ("1,32,1,3 -4", "column 'prefix_hash_ids' must hold ids in [0, 2^63), got '3 -4'"),
    ("1,32,1,1.5", "column 'prefix_hash_ids' must be a list of integers, got '1.5'"),
    ("1,32,1,1 x", "column 'prefix_hash_ids' must be a list of integers, got '1 x'"),
    ("1,32,1,1 2 3", "column 'prefix_hash_ids' has 3 ids, more than the 2 blocks of 16 tokens "
                     "(--prefix-block-tokens) in its 32-token prompt"),
    ("1,33,1,1 2 3 4", "column 'prefix_hash_ids' has 4 ids, more than the 3 blocks of 16 tokens"),
])
def test_bad_csv_ids_name_file_row_and_column(tmp_path, row, message):
    path = write(tmp_path, "bad.csv", HEADER + row + "\n")
    with pytest.raises(InputError) as info:
        read_trace(path)
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(f"{path}: line 3 (data row 2): ")
    assert message in text


def test_bad_parquet_and_mooncake_ids_name_file_row_and_column(tmp_path):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"arrival_s": [0.0, 1.0], "num_prompt_tokens": [16, 16],
                             "num_output_tokens": [1, 1], "prefix_hash_ids": [[1], [-1]]}), path)
    with pytest.raises(InputError, match=r"bad\.parquet: data row 2 \(1-based\): column 'prefix_hash_ids' "
                                         r"must hold ids in \[0, 2\^63\), got \[-1\]"):
        read_trace(path)
    path = write(tmp_path, "bad.jsonl", '{"timestamp": 0, "input_length": 512, "output_length": 1, '
                                        '"hash_ids": [1, 2]}\n')
    with pytest.raises(InputError, match=r"bad\.jsonl: line 1: column 'hash_ids' has 2 ids, more than "
                                         r"the 1 blocks of 512 tokens"):
        read_trace(path)


# ---- the unbounded-cache figure ----

def test_unbounded_prefix_hits_by_hand():
    hits = unbounded_prefix_hits(reuse_trace())
    # r0 sees nothing; r1 hits 1,2 (2 blocks = 8); r2 hits 1,2,3 = 12 tokens, capped at 10 - 1;
    # r3's first id 9 is new, so the chain stops there although 1 is known; r4 hits its one
    # listed block (4 tokens; its list stops short); r5 has no ids.
    assert hits.tolist() == [0, 8, 9, 0, 4, 0]
    stats = trace_stats(reuse_trace())
    assert stats["prefix_hit_share"] == pytest.approx(21 / 65)     # prompts: 10+12+10+8+20+5
    assert stats["prefix_hit_requests"] == 3
    assert stats["prefix_block_tokens"] == 4


def test_hits_follow_arrival_order_not_file_order():
    trace = Trace.from_arrays([1.0, 0.0], [8, 8], [1, 1], prefix_hash_ids=[[1, 2], [1]], prefix_block_tokens=4)
    # The second row arrives first: it sees nothing, then the first row hits block 1.
    assert unbounded_prefix_hits(trace).tolist() == [0, 4]


def test_no_ids_no_figure():
    stats = trace_stats(Trace.from_arrays([0.0], [8], [1]))
    assert unbounded_prefix_hits(Trace.from_arrays([0.0], [8], [1])) is None
    assert stats["prefix_hit_share"] is None and stats["prefix_hit_requests"] is None


# ---- the command ----

def test_stats_prints_the_reuse_figure(tmp_path, capsys):
    path = write_trace(reuse_trace(), tmp_path / "r.csv")
    assert cli.main(["trace", "stats", str(path), "--prefix-block-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert ("prefix reuse 32.3% of prompt tokens hit an unbounded cache (4-token blocks); "
            "3 of 6 requests hit") in out
    assert cli.main(["trace", "stats", str(path), "--prefix-block-tokens", "4", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["prefix_hit_share"] == pytest.approx(21 / 65) and stats["prefix_hit_requests"] == 3


def test_stats_of_mooncake_and_its_conversion(tmp_path, capsys):
    assert cli.main(["trace", "stats", str(MOONCAKE_TINY), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    # Request 2 (6472 tokens) hits the 12 blocks 46..57 that request 1 brought: 12 * 512 tokens.
    assert stats["prefix_block_tokens"] == 512 and stats["prefix_hit_requests"] == 1
    assert stats["prefix_hit_share"] == pytest.approx(12 * 512 / (6955 + 6472 + 400))
    out = tmp_path / "m.parquet"
    assert cli.main(["trace", "generate", str(MOONCAKE_TINY), "--out", str(out)]) == 0
    back = read_trace(out)   # the file states its block size
    assert back.prefix_block_tokens == 512 and back.prefix_hash_ids == read_trace(MOONCAKE_TINY).prefix_hash_ids


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_the_block_size_travels_with_the_ids(tmp_path, suffix):
    path = write_trace(read_trace(MOONCAKE_TINY), tmp_path / f"m{suffix}")
    assert read_trace(path).prefix_block_tokens == 512
    assert read_trace(path, prefix_block_tokens=512).prefix_block_tokens == 512
    with pytest.raises(InputError, match=r"m\.(csv|parquet): --prefix-block-tokens 16 contradicts the "
                                         r"trace's own prefix_block_tokens 512"):
        read_trace(path, prefix_block_tokens=16)


def test_a_block_size_column_with_two_values_is_refused(tmp_path):
    path = write(tmp_path, "two.csv", "arrival_s,num_prompt_tokens,num_output_tokens,prefix_hash_ids,"
                                      "prefix_block_tokens\n0,20,1,5,16\n1,20,1,6,32\n")
    with pytest.raises(InputError, match=r"two.csv: line 3 \(data row 2\): column 'prefix_block_tokens' differs from the first row's 16"):
        read_trace(path)


def test_lru_prefix_hits_by_hand():
    trace = reuse_trace()   # 4-token blocks
    assert lru_prefix_hits(trace, 10**6).tolist() == unbounded_prefix_hits(trace).tolist()
    # room for 3 blocks: request 1 brings 1 2 7 (3 evicted), so request 2 hits 1 2 only
    assert lru_prefix_hits(trace, 12).tolist() == [0, 8, 8, 0, 4, 0]
    assert lru_prefix_hits(trace, 0).sum() == 0
    assert lru_prefix_hits(Trace.from_arrays([0.0], [5], [1]), 100) is None


def test_stats_reports_the_lru_share(capsys):
    assert cli.main(["trace", "stats", str(MOONCAKE_TINY), "--cache-tokens", "100000"]) == 0
    assert "with an LRU cache of 100000 tokens" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["0", "x", "1000001"])
def test_bad_block_size_flag_exits_2(capsys, value):
    assert cli.main(["trace", "stats", str(MOONCAKE_TINY), "--prefix-block-tokens", value]) == 2
    assert "argument --prefix-block-tokens: the value must be a whole number from 1 to 1,000,000" \
        in capsys.readouterr().err
