"""Bad sweep configs, table-driven: each key gets the check its flag gets, and every case is one
`stepcal: ` line on stderr naming the file and the key, exit 2, no traceback, nothing written. A
hypothesis test throws values of every TOML type at the known keys: a run succeeds or is one such line."""
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepcal.core.workload import TRACE_FORMATS
from stepcal.experiments.cli import main
from stepcal.experiments.sweep.config import LATENCY_METRICS, MAX_SWEEP_POINTS, SCHEDULER_KEYS, SLO_KEYS, TOP_KEYS
from stepcal.experiments.value_checks import ROUTER_NAMES
from stepcal.simulator.router import ROUTERS

TRACE = "poisson:rate=5,n=5,prompt=fixed:8,output=fixed:2"


def _config(top: str = "", scheduler: str = "", tail: str = "") -> str:
    """A minimal valid sweep (one point) with `top` lines, `scheduler` settings and `tail` tables added."""
    return (f'trace = "{TRACE}"\nstep_models = ["const:5"]\n{top}\n'
            f'[[schedulers]]\nname = "vllm"\n{scheduler}\n{tail}\n')


def _slo(body: str, name: str = "chat") -> str:
    return f'[[slos]]\nname = "{name}"\n{body}\n'


RANGED = "ranges = 2\n"
AXIS_300 = "[" + ", ".join(str(i) for i in range(1, 301)) + "]"

# name -> (config text, the key the line names, what else it says)
CASES = {
    # step_overhead_ms: --step-overhead-ms's check (>= 0, at most an hour)
    "step overhead -5": (_config("step_overhead_ms = -5"), "step_overhead_ms", "finite number >= 0 and <= 3.6e+06, got -5"),
    "step overhead nan": (_config("step_overhead_ms = nan"), "step_overhead_ms", "got nan"),
    "step overhead inf": (_config("step_overhead_ms = inf"), "step_overhead_ms", "got inf"),
    "step overhead 2 hours": (_config("step_overhead_ms = 7200000"), "step_overhead_ms", "<= 3.6e+06"),
    "step overhead string": (_config('step_overhead_ms = "5"'), "step_overhead_ms", "must be a number, got '5'"),
    # SLOs: --slo-ttft-ms / --slo-tpot-ms, capacity's --attainment
    "slo ttft nan": (_config(tail=_slo("ttft_ms = nan")), "slos[0].ttft_ms", "finite number > 0"),
    "slo tpot -1": (_config(tail=_slo("tpot_ms = -1")), "slos[0].tpot_ms", "got -1"),
    "slo ttft string": (_config(tail=_slo('ttft_ms = "500"')), "slos[0].ttft_ms", "must be a number, got '500'"),
    "slo attainment 0": (_config(tail=_slo("ttft_ms = 5\nattainment = 0")), "slos[0].attainment", "> 0 and <= 1"),
    "slo attainment 1.5": (_config(tail=_slo("ttft_ms = 5\nattainment = 1.5")), "slos[0].attainment", "got 1.5"),
    "slo same name twice": (_config(tail=_slo("ttft_ms = 5") + _slo("tpot_ms = 5")), "slos[1].name",
                            "'chat' is already the name of slos[0]"),
    "slo default name taken": (_config(tail=_slo("ttft_ms = 5", name="slo1") + "[[slos]]\ntpot_ms = 5\n"),
                               "slos[1].name", "'slo1' is already the name of slos[0]"),
    "slo name with a space": (_config(tail=_slo("ttft_ms = 5", name="a b")), "slos[0].name", "plain identifier"),
    "slo unknown key": (_config(tail=_slo("ttft = 5")), "slos[0].ttft", "did you mean slos[0].ttft_ms?"),
    "slo without limits": (_config(tail=_slo("attainment = 0.9")), "slos[0]", "give ttft_ms and/or tpot_ms"),
    "slos a number": (_config("slos = 5"), "slos", "must be a list of tables"),
    # block_size, kv_blocks: --block-size, --kv-blocks
    "block size 0": (_config("block_size = 0"), "block_size", "whole number from 1 to 65,536, got 0"),
    "block size 1e9": (_config("block_size = 1000000000"), "block_size", "got 1000000000"),
    "block size 2.5": (_config("block_size = 2.5"), "block_size", "got 2.5"),
    "block size bool": (_config("block_size = true"), "block_size", "must be a number, got True"),
    "kv blocks 0": (_config("kv_blocks = 0"), "kv_blocks", "whole number from 1"),
    "kv blocks -4": (_config("kv_blocks = -4"), "kv_blocks", "got -4"),
    "kv cache smaller than a request": (_config("kv_blocks = 2\nblock_size = 1"), "kv_blocks",
                                        "kv_blocks = 2 blocks of block_size = 1 tokens cannot hold request 0 (row 0) "
                                        "of the trace, which needs 9; raise kv_blocks"),
    # the workload: --seed, --trace, --trace-format, --num-requests, --duration, --rate
    "seed -1": (_config("seed = -1"), "seed", "whole number from 0 to 9,223,372,036,854,775,807, got -1"),
    "seed string": (_config('seed = "5"'), "seed", "must be a number, got '5'"),
    "seed 1e30": (_config("seed = 1e30"), "seed", "got 1e+30"),
    "seed a date": (_config("seed = 1979-05-27"), "seed", "must be a number, got datetime.date(1979, 5, 27)"),
    "trace a number": ('trace = 5\nstep_models = ["const:5"]\n[[schedulers]]\nname = "vllm"\n', "trace",
                       "must be a string, got 5"),
    "trace a list": (f'trace = ["{TRACE}"]\nstep_models = ["const:5"]\n[[schedulers]]\nname = "vllm"\n', "trace",
                     "must be a string, got ["),
    "trace format 5": (_config("trace_format = 5"), "trace_format", "must be a string, got 5"),
    "trace format csv": (_config('trace_format = "csv"'), "trace_format", "must be one of stepcal, azure"),
    "num requests 0": (_config("num_requests = 0"), "num_requests", "whole number from 1 to 50,000,000, got 0"),
    "num requests 1e18": (_config("num_requests = 1000000000000000000"), "num_requests", "50,000,000"),
    "duration -3": (_config("duration_s = -3"), "duration_s", "finite number > 0"),
    "duration string": (_config('duration_s = "600"'), "duration_s", "must be a number, got '600'"),
    "rates nan": (_config("rates_rps = [2.0, nan]"), "rates_rps[1]", "got nan"),
    "rates -1": (_config("rates_rps = -1"), "rates_rps", "finite number > 0"),
    "rates strings": (_config('rates_rps = ["a"]'), "rates_rps[0]", "must be a number, got 'a'"),
    "rates 1e9": (_config("rates_rps = [1e9]"), "rates_rps[0]", "<= 1e+06"),
    "rates a table": (_config("rates_rps = {low = 1}"), "rates_rps", "a number or a non-empty list of them"),
    # replicas: --replicas (at most bounds.MAX_REPLICAS)
    "replicas 100000": (_config("replicas = [1, 100000]"), "replicas[1]", "whole number from 1 to 10,000, got 100000"),
    "replicas 0": (_config("replicas = 0"), "replicas", "got 0"),
    "replicas empty": (_config("replicas = []"), "replicas", "non-empty list of them, got []"),
    "replicas nested list": (_config("replicas = [[1]]"), "replicas[0]", "must be a number, got [1]"),
    # router, latency
    "router random": (_config('router = "random"'), "router", "must be one of round-robin, least-tokens"),
    "router a number": (_config("router = 1"), "router", "must be a string, got 1"),
    "latency p99": (_config('latency = "p99"'), "latency", "must be one of ttft_ms, tpot_ms"),
    "latency a list": (_config('latency = ["ttft_ms"]'), "latency", "must be a string, got ['ttft_ms']"),
    # step models and host defaults: --step-model, --host-defaults
    "step models empty": (f'trace = "{TRACE}"\nstep_models = []\n[[schedulers]]\nname = "vllm"\n', "step_models",
                          "non-empty list"),
    "step model const nan": (f'trace = "{TRACE}"\nstep_models = ["const:nan"]\n[[schedulers]]\nname = "vllm"\n',
                             "step_models[0]", "values must be finite numbers"),
    "step model unknown": (f'trace = "{TRACE}"\nstep_models = ["nope"]\n[[schedulers]]\nname = "vllm"\n',
                           "step_models[0]", "expected const:MS, linear:A,B,C or a T_step table directory"),
    "step models a table": (f'trace = "{TRACE}"\n[step_models]\na = 1\n[[schedulers]]\nname = "vllm"\n',
                            "step_models", "a string or a non-empty list of them"),
    "step models missing": (f'trace = "{TRACE}"\n[[schedulers]]\nname = "vllm"\n', "step_models", "missing key"),
    "host defaults tgi": (_config('host_defaults = "tgi"'), "host_defaults", "must be one of none, vllm"),
    # ranges: --ranges, --scatter-cv, --scatter-rho, --scatter-run-cv, --ranges-seed
    "ranges -1": (_config("ranges = -1"), "ranges", "whole number from 0 to 10,000"),
    "ranges 20000": (_config("ranges = 20000"), "ranges", "got 20000"),
    "scatter cv 2": (_config(RANGED + "scatter_cv = 2"), "scatter_cv", "finite number >= 0 and <= 1, got 2"),
    "scatter rho 1": (_config(RANGED + "scatter_rho = 1"), "scatter_rho", "must be below 1"),
    "scatter run cv nan": (_config(RANGED + "scatter_run_cv = nan"), "scatter_run_cv", "got nan"),
    "ranges seed -1": (_config(RANGED + "ranges_seed = -1"), "ranges_seed", "whole number from 0"),
    "scatter cv without ranges": (_config("scatter_cv = 0.1"), "scatter_cv", "need(s) ranges = N"),
    # schedulers: --scheduler, --max-num-seqs, --max-batched-tokens, --chunk-size
    "scheduler fifo": (_config().replace('name = "vllm"', 'name = "fifo"'), "schedulers[0].name",
                       "must be one of static, continuous"),
    "scheduler without name": (f'trace = "{TRACE}"\nstep_models = ["const:5"]\n[[schedulers]]\nchunk_size = 8\n',
                               "schedulers[0]", "missing key 'name'"),
    "max num seqs 0": (_config(scheduler="max_num_seqs = [8, 0]"), "schedulers[0].max_num_seqs[1]", "got 0"),
    "chunk size 2.5": (_config(scheduler="chunk_size = 2.5"), "schedulers[0].chunk_size", "got 2.5"),
    "max batched tokens string": (_config(scheduler='max_batched_tokens = "8192"'), "schedulers[0].max_batched_tokens",
                                  "must be a number"),
    "max num seqs 1e18": (_config(scheduler="max_num_seqs = [1e18]"), "schedulers[0].max_num_seqs[0]", "10,000,000"),
    "scheduler unknown setting": (_config(scheduler="max_seqs = 8"), "schedulers[0].max_seqs",
                                  "did you mean schedulers[0].max_num_seqs?"),
    "schedulers one table": (f'trace = "{TRACE}"\nstep_models = ["const:5"]\n[schedulers]\nname = "vllm"\n',
                             "schedulers", "must be a list of tables ([[schedulers]])"),
    "schedulers empty": (f'trace = "{TRACE}"\nstep_models = ["const:5"]\nschedulers = []\n', "schedulers",
                         "give at least one [[schedulers]] table"),
    # unknown keys: one line naming the key, a close match where there is one
    "unknown key close": (_config("rate_rps = [5]"), "rate_rps", "did you mean rates_rps?"),
    "unknown key far": (_config("zzz = 1"), "zzz", "known: block_size, duration_s"),
    # the grid's size, bounded before it is built: 300 x 300 x 300 points
    "grid 27M points": (_config(f"rates_rps = {AXIS_300}\nreplicas = {AXIS_300}", f"max_num_seqs = {AXIS_300}"),
                        "rates_rps", f"the grid has 27,000,000 points (the schedulers' settings x step_models x "
                                     f"host_defaults x replicas x rates_rps), more than the {MAX_SWEEP_POINTS:,}"),
}


def _sweep(path: Path, out: Path, capsys) -> tuple[int, str]:
    code = main(["sweep", str(path), "--quiet", "--out", str(out)])
    return code, capsys.readouterr().err


def _assert_one_line(code: int, err: str, path: Path, out: Path, *needles: str) -> None:
    assert code == 2, err
    assert err.startswith("stepcal: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{path}: " in err, err
    for needle in needles:
        assert needle in err, err
    assert not out.exists()


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_bad_key_is_one_line_naming_the_file_and_the_key(name, tmp_path, capsys):
    text, key, needle = CASES[name]
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    code, err = _sweep(path, tmp_path / "out", capsys)
    _assert_one_line(code, err, path, tmp_path / "out", key, needle)
    assert "--" not in err.split(f"{path}: ", 1)[1], err     # a key, never a flag the sweep does not have


def test_the_minimal_config_runs(tmp_path, capsys):
    """The base of every case is valid: each case fails for its one bad key."""
    path = tmp_path / "sweep.toml"
    path.write_text(_config("step_overhead_ms = 0\nblock_size = 1\nseed = 0\nreplicas = 2.0",
                            tail=_slo("ttft_ms = 500\nattainment = 1")))
    code, err = _sweep(path, tmp_path / "out", capsys)
    assert code == 0, err
    assert (tmp_path / "out" / "summaries.parquet").exists()


def test_the_help_states_the_grid_limit():
    from stepcal.experiments.commands.sweep import HELP
    assert f"at most {MAX_SWEEP_POINTS:,} points" in HELP


def test_the_router_names_are_the_simulators():
    assert ROUTER_NAMES == tuple(ROUTERS)


# --- any TOML value at any known key: a run, or one line -------------------------------------

SCALARS = st.one_of(
    st.integers(-2, 3), st.sampled_from([10**18, 2**63, -(2**63)]),
    st.sampled_from([0.0, 0.5, 1.0, -0.5, 2.5, float("nan"), float("inf"), -float("inf"), 1e300]),
    st.booleans(), st.sampled_from(["", "x", "5", "nan", "vllm", "none", "const:5", "ttft_ms", "least-tokens"]))
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3), st.dictionaries(st.sampled_from(["a", "name"]), SCALARS,
                                                                           max_size=2))


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(value), repr(value))
    if isinstance(value, str):
        return '"' + value + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def _number(low: float, high: float):
    return st.one_of(st.integers(int(low) + 1, int(high)), st.floats(low, high, exclude_min=True))


# A value each key takes (so that some runs go through), beside VALUES of any type
VALID = {
    "trace_format": st.sampled_from(TRACE_FORMATS), "num_requests": st.integers(1, 10), "duration_s": _number(0, 100),
    "seed": st.integers(0, 2**63 - 1), "rates_rps": st.lists(_number(0, 50), min_size=1, max_size=2),
    "replicas": st.integers(1, 3), "host_defaults": st.sampled_from(["none", "vllm", ["none", "vllm"]]),
    "latency": st.sampled_from(LATENCY_METRICS), "block_size": st.integers(1, 32), "kv_blocks": st.integers(1, 64),
    "router": st.sampled_from(ROUTER_NAMES), "step_overhead_ms": _number(0, 50), "ranges": st.integers(0, 2),
    "scatter_cv": st.floats(0, 1), "scatter_rho": st.floats(-0.9, 0.9), "scatter_run_cv": st.floats(0, 0.5),
    "ranges_seed": st.integers(0, 100),
    "name": st.sampled_from(["vllm", "sarathi", "static"]), "max_num_seqs": st.integers(1, 64),
    "max_batched_tokens": st.integers(1, 64), "chunk_size": st.integers(1, 64),
}
VALID_SLO = {"name": st.sampled_from(["a", "b"]), "ttft_ms": _number(0, 1000), "tpot_ms": _number(0, 1000),
             "attainment": st.floats(0.01, 1)}


def _table(keys: list[str], valid: dict) -> st.SearchStrategy:
    """Some of `keys`, each with a value it takes (three times in four) or any value."""
    return st.lists(st.sampled_from(keys), unique=True, max_size=3).flatmap(lambda chosen: st.fixed_dictionaries(
        {key: st.one_of(valid[key], valid[key], valid[key], VALUES) for key in chosen}))


TOP = _table(sorted(set(TOP_KEYS) - {"trace", "step_models"}), VALID)   # the trace and the model stay tiny


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(top=TOP, scheduler=_table(sorted(SCHEDULER_KEYS), VALID), slo=_table(sorted(SLO_KEYS), VALID_SLO))
def test_any_value_at_any_key_runs_or_is_one_line(capsys, top, scheduler, slo):
    top_lines = "\n".join(f"{k} = {_toml_value(v)}" for k, v in top.items())
    scheduler_lines = "\n".join(f"{k} = {_toml_value(v)}" for k, v in {"name": "vllm", **scheduler}.items())
    slo_lines = "[[slos]]\n" + "\n".join(f"{k} = {_toml_value(v)}" for k, v in slo.items()) if slo else ""
    text = f'trace = "{TRACE}"\nstep_models = ["const:5"]\n{top_lines}\n[[schedulers]]\n{scheduler_lines}\n{slo_lines}\n'
    with tempfile.TemporaryDirectory() as folder:
        path, out = Path(folder) / "sweep.toml", Path(folder) / "out"
        path.write_text(text)
        code, err = _sweep(path, out, capsys)
        if code != 0:
            _assert_one_line(code, err, path, out)
