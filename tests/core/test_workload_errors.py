"""Bad workloads through the CLI: generator specs, trace files and vLLM bench imports past the bounds
of core.bounds end in exit 2 and one `stepcal: ` line naming the spec parameter or the file line,
with no traceback and nothing written."""
import json
import re
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepcal.core.errors import InputError
from stepcal.core.workload import read_trace
from stepcal.core.workload.generators import generate
from stepcal.core.workload.spec import parse_spec
from stepcal.experiments import cli

REPO = Path(__file__).resolve().parents[2]
BENCH = json.loads((REPO / "tests" / "data" / "vllm_bench_tiny.json").read_text())
MOONCAKE = REPO.parent / "shared" / "data" / "traces" / "mooncake" / "conversation_trace.jsonl"
BENCH_FLAGS = ["--model-spec", "tiny", "--scheduler", "continuous", "--max-num-seqs", "8", "--kv-blocks", "64"]
LENGTHS = "prompt=fixed:8,output=fixed:2"
SESSION_HEADER = "arrival_s,num_prompt_tokens,num_output_tokens,session_id,turn,think_time_s\n"


def gen(spec: str) -> list[str]:
    return ["trace", "generate", spec, "--out", "{tmp}/out.csv"]


def stats(path: str) -> list[str]:
    return ["trace", "stats", "{tmp}/" + path]


def simulate(trace: str) -> list[str]:
    return ["simulate", "--trace", trace, "--step-model", "const:1", "--out", "{tmp}/run"]


def bench(**changes) -> dict:
    """The tiny bench JSON with `changes` laid over it, as a file for `import vllm-bench`."""
    return {"bench.json": json.dumps(BENCH | changes)}


IMPORT = ["import", "vllm-bench", "{tmp}/bench.json", *BENCH_FLAGS, "--out", "{tmp}/run"]


def parquet_ids(ids) -> dict:
    frame = pd.DataFrame({"arrival_s": [0.0, 1.0], "num_prompt_tokens": [5, 5], "num_output_tokens": [1, 1],
                          "request_id": np.asarray(ids, dtype=np.uint64)})
    return {"ids.parquet": frame}


# name: (argv, input files, pattern the one stderr line must match, an allocation bomb if not stopped)
CASES = {
    # arrival processes
    "gamma cv tiny": (gen(f"gamma:rate=5,cv=1e-200,n=10,{LENGTHS}"), {}, r"'cv=1e-200': must be a positive", False),
    "gamma cv huge": (gen(f"gamma:rate=5,cv=1e200,n=10,{LENGTHS}"), {}, r"'cv=1e200': .*up to 10", False),
    "gamma cv zero": (gen(f"gamma:rate=5,cv=0,n=10,{LENGTHS}"), {}, r"'cv=0'", False),
    "gamma cv nan": (gen(f"gamma:rate=5,cv=nan,n=10,{LENGTHS}"), {}, r"'cv=nan'", False),
    "rate tiny": (gen(f"poisson:rate=1e-300,n=10,{LENGTHS}"), {}, r"'rate=1e-300': .*requests per second", False),
    "rate huge": (gen(f"poisson:rate=1e7,n=10,{LENGTHS}"), {}, r"'rate=1e7': .*up to 1e\+06", False),
    "rate flag tiny": (gen(f"poisson:n=10,{LENGTHS}") + ["--rate", "1e-300"], {}, r"--rate: must be", False),
    "arrivals past a year": (gen(f"poisson:rate=1e-7,n=30,{LENGTHS}"), {}, r"past a year .*rate=", False),
    "gamma arrivals past a year": (gen(f"gamma:rate=1e-7,cv=2,n=30,{LENGTHS}"), {}, r"rate= and cv=", False),
    "onoff off too long": (gen(f"onoff:rate=1,on=1,off=1e9,n=10,{LENGTHS}"), {}, r"'off=1e9': .*a year", False),
    "onoff arrivals past a year": (gen(f"onoff:rate=100,on=0.001,off=3e7,n=50,{LENGTHS}"), {},
                                   r"past a year .*rate=, on= and off=", False),
    "duration past a year": (gen(f"poisson:rate=1,n=5,duration=4e7,{LENGTHS}"), {}, r"duration=4e\+07 s is past a year",
                             False),
    "rate x duration": (gen(f"poisson:rate=1,duration=1e300,{LENGTHS}"), {}, r"rate x duration asks for", True),
    "n too large": (gen(f"poisson:rate=1,n=1000000000,{LENGTHS}"), {}, r"'n=1000000000': must be", True),
    # lengths
    "lognormal sigma huge": (gen("poisson:rate=5,n=10,prompt=lognormal:500:1000,output=fixed:5"), {},
                             r"'prompt=lognormal:500:1000': .*sigma", False),
    "lognormal sigma negative": (gen("poisson:rate=5,n=10,prompt=fixed:5,output=lognormal:50:-1"), {},
                                 r"'output=lognormal:50:-1'", False),
    "lognormal mean huge": (gen("poisson:rate=5,n=10,prompt=lognormal:1e9:1,output=fixed:5"), {},
                            r"'prompt=lognormal:1e9:1': .*MAX_TOKENS_PER_REQUEST", False),
    "lognormal draws past the limit": (gen("poisson:rate=5,n=1000,prompt=lognormal:9000000:2,output=fixed:1"), {},
                                       r"prompt= drew a [\d,]+-token length, past 10,000,000", False),
    "output draws past the limit": (gen("poisson:rate=5,n=1000,prompt=fixed:1,output=lognormal:9000000:2"), {},
                                    r"output= drew a", False),
    "fixed past the limit": (gen("poisson:rate=5,n=10,prompt=fixed:10000001,output=fixed:1"), {},
                             r"'prompt=fixed:10000001': must be a positive integer up to 10,000,000", False),
    "uniform past the limit": (gen("poisson:rate=5,n=10,prompt=fixed:1,output=uniform:1:20000000"), {},
                               r"'output=uniform:1:20000000'", False),
    # system prompts and sessions
    "system past the limit": (gen(f"poisson:rate=5,n=10,system=20000000,{LENGTHS}"), {}, r"'system=20000000'", False),
    "system plus prompt past the limit": (gen("poisson:rate=5,n=10,system=9000000,prompt=fixed:2000000,output=fixed:1"),
                                          {}, r"turn 0 of a session has a 11,000,000-token prompt", False),
    "turns past the limit": (gen(f"poisson:rate=5,n=10,turns=fixed:20000,{LENGTHS}"), {},
                             r"at most 10,000 turns per session", False),
    "session prompt grows past the limit": (gen("poisson:rate=5,n=10,turns=fixed:5000,prompt=fixed:2000,"
                                                "output=fixed:1000"), {}, r"turn \d+ of a session .*turns=", True),
    "session prefix ids bomb": (gen("poisson:rate=5,n=10,turns=fixed:10000,prompt=fixed:1,output=fixed:1"), {},
                                r"MAX_PREFIX_IDS.*turns=", True),
    "think too long": (gen(f"poisson:rate=5,n=10,turns=fixed:3,think=1e9,{LENGTHS}"), {}, r"'think=1e9'", False),
    "think times past a year": (gen(f"poisson:rate=5,n=30,turns=fixed:100,think=3e7,{LENGTHS}"), {},
                                r"think= times put a turn at .* past a year", False),
    "open-loop think past a year": (gen(f"poisson:rate=5,n=30,turns=fixed:100,think=3e7,loop=open,{LENGTHS}"), {},
                                    r"think= times", False),
    "stats of a bad spec": (["trace", "stats", f"gamma:rate=5,cv=1e200,n=10,{LENGTHS}"], {}, r"'cv=1e200'", False),
    "simulate a bad spec": (simulate(f"gamma:rate=5,cv=1e-200,n=10,{LENGTHS}"), {}, r"'cv=1e-200'", False),
    "simulate a session bomb": (simulate("poisson:rate=5,n=10,turns=fixed:10000,prompt=fixed:1,output=fixed:1"), {},
                                r"MAX_PREFIX_IDS", True),
    # vLLM bench imports
    "itl huge": (IMPORT, bench(itls=[[0.01, 1e308, 0.011], [0.015, 0.013], [], [], [], []]), r"'itls\[0\]'\[1\] is 1e\+308 s",
                 False),
    "itl over an hour": (IMPORT, bench(itls=[[0.01, 4000.0, 0.011], [0.015, 0.013], [], [], [], []]),
                         r"'itls\[0\]'\[1\] is 4000.0 s, more than 3600 s", False),
    "ttft huge": (IMPORT, bench(ttfts=[1e308] + BENCH["ttfts"][1:]), r"'ttfts'\[0\] is 1e\+308 s", False),
    "more gaps than tokens": (IMPORT, bench(itls=[[0.01] * 9, [0.015, 0.013], [], [], [], []]),
                              r"'itls'\[0\] has 9 inter-token gaps but 'output_lens'\[0\] is 4 tokens", False),
    "start times over a year": (IMPORT, bench(start_times=[1000.0, 1e10] + BENCH["start_times"][2:]),
                                r"'start_times'\[1\] is .* more than a year", False),
    # trace files: sessions
    "turn before previous turn": (stats("s.csv"), {"s.csv": SESSION_HEADER + "0,10,5,7,0,\n5,20,5,7,1,\n3,30,5,7,2,\n"},
                                  r"s\.csv: line 3 \(data row 2\) and line 4 \(data row 3\): session 7: an open-loop "
                                  r"turn", False),
    "simulate turn before previous turn": (simulate("{tmp}/s.csv"), {"s.csv": SESSION_HEADER + "9,10,5,3,0,\n2,20,5,3,1,\n"},
                                           r"s\.csv: line 2 \(data row 1\) and line 3 \(data row 2\): session 3", False),
    "turn twice": (stats("s.csv"), {"s.csv": SESSION_HEADER + "0,10,5,7,0,\n5,20,5,7,0,\n"},
                   r"s\.csv: line 2 \(data row 1\) and line 3 \(data row 2\): session 7 has turn 0 twice", False),
    "think on a first turn": (stats("s.csv"), {"s.csv": SESSION_HEADER + "0,10,5,7,0,2\n"},
                              r"s\.csv: line 2 \(data row 1\): think_time_s is given for the first turn", False),
    "think negative": (stats("s.csv"), {"s.csv": SESSION_HEADER + "0,10,5,7,0,\n0,10,5,7,1,-2\n"},
                       r"s\.csv: line 3 \(data row 2\): column 'think_time_s' must be non-negative", False),
    "think past a year": (stats("s.csv"), {"s.csv": SESSION_HEADER + "0,10,5,7,0,\n0,10,5,7,1,1e9\n"},
                          r"s\.csv: line 3 \(data row 2\): column 'think_time_s' must be at most", False),
    "think chain past a year": (stats("s.csv"), {"s.csv": SESSION_HEADER + "0,10,5,7,0,\n0,10,5,7,1,2e7\n0,10,5,7,2,2e7\n"},
                                r"s\.csv: line 4 \(data row 3\): column 'think_time_s': .* past a year", False),
    "turn negative": (stats("s.csv"), {"s.csv": SESSION_HEADER + "0,10,5,7,-1,\n"},
                      r"s\.csv: line 2 \(data row 1\): column 'turn' must not be negative", False),
    # trace files: prefix ids, clocks, ids
    "prefix id repeated": (stats("h.csv"), {"h.csv": "arrival_s,num_prompt_tokens,num_output_tokens,prefix_hash_ids\n"
                                            "0,100,5,1 2\n1,100,5,5 5 5\n"},
                           r"h\.csv: line 3 \(data row 2\): column 'prefix_hash_ids' repeats id 5", False),
    "prefix id repeated apart": (stats("h.csv"), {"h.csv": "arrival_s,num_prompt_tokens,num_output_tokens,"
                                                  "prefix_hash_ids\n0,100,5,1 2 1\n"}, r"repeats id 1", False),
    "mooncake hash id repeated": (stats("m.jsonl"), {"m.jsonl": '{"timestamp": 0, "input_length": 2000, '
                                                     '"output_length": 5, "hash_ids": [4, 4]}\n'},
                                  r"m\.jsonl: line 1: column 'hash_ids' repeats id 4", False),
    "mooncake timestamp past a year": (stats("m.jsonl"), {"m.jsonl": '{"timestamp": 0, "input_length": 10, '
                                                          '"output_length": 5}\n\n{"timestamp": 4e13, '
                                                          '"input_length": 10, "output_length": 5}\n'},
                                       r"m\.jsonl: line 3: column 'timestamp' is more than a year", False),
    "mooncake timestamps overflow": (simulate("{tmp}/m.jsonl"), {"m.jsonl": '{"timestamp": -1e308, "input_length": 10, '
                                                                 '"output_length": 5}\n{"timestamp": 1e308, '
                                                                 '"input_length": 10, "output_length": 5}\n'},
                                     r"m\.jsonl: line 2: column 'timestamp' is more than a year", False),
    "vidur clock past a year": (stats("v.csv"), {"v.csv": "arrived_at,num_prefill_tokens,num_decode_tokens\n"
                                                 "5,10,5\n1e9,10,5\n"},
                                r"v\.csv: line 3 \(data row 2\): column 'arrived_at' is more than a year", False),
    "azure clock past a year": (stats("a.csv"), {"a.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                                 "2023-11-16 18:15:46.6805900,10,5\n2025-11-16 18:15:46,10,5\n"},
                                r"a\.csv: line 3 \(data row 2\): column 'TIMESTAMP' is more than a year", False),
    "parquet id past int64": (stats("ids.parquet"), parquet_ids([2**64 - 1, 3]),
                              r"ids\.parquet: data row 1 \(1-based\): column 'request_id' is too large", False),
}


def _write_inputs(tmp_path: Path, files: dict) -> set[str]:
    for name, content in files.items():
        if isinstance(content, pd.DataFrame):
            content.to_parquet(tmp_path / name)
        else:
            (tmp_path / name).write_text(content)
    return set(files)


@pytest.mark.parametrize("argv, files, pattern, bomb", CASES.values(), ids=CASES.keys())
def test_bad_workload_exits_2_with_one_line(tmp_path, monkeypatch, capsys, argv, files, pattern, bomb):
    monkeypatch.chdir(tmp_path)    # a stray relative write lands where the check below sees it
    inputs = _write_inputs(tmp_path, files)
    started = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:    # the CLI would print them to stderr
        warnings.simplefilter("always", RuntimeWarning)
        code = cli.main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    elapsed_s = time.monotonic() - started
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]
    captured = capsys.readouterr()
    assert code == 2, captured.err
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("stepcal: "), captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    assert re.search(pattern, lines[0]), lines[0]
    assert {p.name for p in tmp_path.iterdir()} == inputs    # nothing written, not even a temporary
    if bomb:   # refused before allocating: these would take minutes and gigabytes otherwise
        assert elapsed_s < 5.0, f"took {elapsed_s:.1f} s"


def test_there_are_at_least_forty_cases():
    assert len(CASES) >= 40


def test_a_parquet_id_past_2_to_the_53_is_read_exactly(tmp_path):
    _write_inputs(tmp_path, parquet_ids([2**60 + 1, 3]))
    assert read_trace(tmp_path / "ids.parquet").request_id.tolist() == [2**60 + 1, 3]


def test_a_closed_loop_turn_may_carry_an_earlier_placeholder_arrival(tmp_path):
    # its arrival_s is replaced when the simulator releases it, so its order in the file does not matter
    _write_inputs(tmp_path, {"s.csv": SESSION_HEADER + "9,10,5,3,0,\n2,20,5,3,1,1.5\n"})
    trace = read_trace(tmp_path / "s.csv")
    assert trace.turn.tolist() == [1, 0]


def test_the_mooncake_trace_repeats_no_id_within_a_chain():
    if not MOONCAKE.exists():
        pytest.skip(f"shared data not present: {MOONCAKE}")
    trace = read_trace(MOONCAKE)
    assert len(trace) == 12031 and all(len(set(ids)) == len(ids) for ids in trace.prefix_hash_ids)


def test_a_session_spec_at_the_edge_of_the_limits_still_generates():
    spec = parse_spec("poisson:rate=5,n=3,system=4096:2,turns=fixed:4,think=1e6,prompt=lognormal:300:3:2000,"
                      "output=uniform:1:50,seed=1").complete()
    trace = generate(spec)
    assert len(trace) == 12 and trace.num_prompt_tokens.max() <= 4096 + 4 * 2000 + 3 * 50


def test_a_sigma_of_minus_zero_is_zero():
    trace = generate(parse_spec("poisson:rate=5,n=4,prompt=lognormal:9:-0,output=fixed:5").complete())
    assert trace.num_prompt_tokens.tolist() == [9, 9, 9, 9]


# ---- any numbers in a spec: a trace or an InputError, never another exception ----

WILD = st.one_of(
    st.builds(lambda m, e: f"{m}e{e}", st.integers(1, 9), st.integers(-330, 330)),   # tiny to overflowing
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-10, max_value=10**12).map(str),
    st.sampled_from(["0", "-0", "1e-200", "1e200", "1000", "nan", "inf", "-inf", "x", ""]),
)
ORDINARY_FLOAT = st.floats(min_value=0.05, max_value=8).map(repr)
ORDINARY_INT = st.integers(1, 3000)


@st.composite
def specs(draw) -> str:
    # each number is wild one time in four, so that most specs get past the parser to the generator
    def real() -> str:
        return draw(WILD if draw(st.integers(0, 3)) == 0 else ORDINARY_FLOAT)

    def whole(low: int = 0) -> str:
        return draw(WILD) if draw(st.integers(0, 3)) == 0 else str(low + draw(ORDINARY_INT))

    process = draw(st.sampled_from(["poisson", "gamma", "onoff"]))
    params = [f"rate={real()}", f"n={draw(st.integers(1, 40))}"]
    params += {"poisson": [], "gamma": [f"cv={real()}"], "onoff": [f"on={real()}", f"off={real()}"]}[process]
    if draw(st.booleans()):
        params.append(f"duration={real()}")
    mean = whole()
    params.append(draw(st.sampled_from([f"prompt=lognormal:{mean}:{real()}", f"prompt=fixed:{whole()}",
                                        f"prompt=uniform:{mean}:{whole(int(mean) if mean.isdigit() else 0)}",
                                        f"prompt=lognormal:{mean}:{real()}:{whole()}"])))
    params.append(f"output=lognormal:{whole()}:{real()}")
    if draw(st.booleans()):
        params.append(f"system={whole()}:{draw(st.integers(1, 4))}")
    if draw(st.booleans()):
        params += [f"turns=uniform:1:{draw(st.integers(1, 8))}", f"think={real()}",
                   f"loop={draw(st.sampled_from(['open', 'closed']))}"]
    return f"{process}:" + ",".join(params)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_random_specs_give_a_trace_or_an_input_error(text):
    try:
        trace = generate(parse_spec(text).complete())
    except InputError as exc:
        assert "\n" not in str(exc)
        return
    assert np.isfinite(trace.arrival_s).all() and trace.arrival_s.max() <= 366 * 24 * 3600.0
    assert 1 <= trace.num_prompt_tokens.min() and trace.num_prompt_tokens.max() <= 10_000_000
