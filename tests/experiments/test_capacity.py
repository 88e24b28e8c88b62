import json

import numpy as np
import pytest

from stepcal.core.errors import InputError
from stepcal.core.workload import load_workload, rescale_rate
from stepcal.core.workload.transforms import mean_rate_rps
from stepcal.experiments.capacity import RateEvaluator, aggregated, check_above, search_capacity
from stepcal.experiments.cli import main
from stepcal.experiments.step_models import resolve_step_model
from stepcal.simulator.simulation import SimConfig, simulate
from tests.experiments.ray_cluster import ray_cluster  # noqa: F401  (a fixture)

TRACE = "poisson:rate=4,n=200,prompt=uniform:32:512,output=uniform:8:128,seed=3"
STEP_MODEL = "linear:8,0.03,0.0002"
SLO = ["--slo-ttft-ms", "300", "--slo-tpot-ms", "40"]


def step_attainment(boundary_rps: float):
    """A fake deployment: every request meets its SLO below the boundary, half of them above."""
    calls = []

    def evaluate(rate):
        calls.append(rate)
        return {"slo_attainment": 1.0 if rate <= boundary_rps else 0.5}
    return evaluate, calls


@pytest.mark.parametrize("start", [0.3, 7.0, 500.0])
def test_search_brackets_then_bisects_to_the_tolerance(start):
    evaluate, calls = step_attainment(12.5)
    result = search_capacity(evaluate, start_rps=start, target_attainment=0.9, tolerance=0.02)
    assert result.max_rate_rps <= 12.5 < result.upper_rate_rps
    assert result.upper_rate_rps <= result.max_rate_rps * 1.02
    assert result.bracketed and result.best.feasible and result.best.rate_rps == result.max_rate_rps
    assert len(calls) == len(set(calls)) == len(result.probes) <= 30   # no rate probed twice


def test_search_reports_no_feasible_rate_and_an_unbounded_one():
    never, _ = step_attainment(0.0)
    result = search_capacity(never, start_rps=1.0, target_attainment=0.9, min_rps=0.1)
    assert result.max_rate_rps is None and result.upper_rate_rps == pytest.approx(0.1)
    always, _ = step_attainment(1e9)
    result = search_capacity(always, start_rps=1.0, target_attainment=0.9, max_rps=100.0)
    assert result.max_rate_rps == 100.0 and result.upper_rate_rps is None and not result.bracketed


@pytest.mark.parametrize("kwargs,flag", [({"tolerance": 0.0}, "--tolerance"), ({"target_attainment": 1.5}, "--attainment"),
                                         ({"start_rps": -1.0}, "--rate-start")])
def test_search_rejects_bad_arguments(kwargs, flag):
    args = {"start_rps": 1.0, "target_attainment": 0.9, "tolerance": 0.02, **kwargs}
    with pytest.raises(InputError, match=flag):
        search_capacity(lambda r: {"slo_attainment": 1.0}, **args)


@pytest.fixture(scope="module")
def capacity_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("capacity") / "run"
    assert main(["capacity", "--trace", TRACE, "--step-model", STEP_MODEL, "--scheduler", "sarathi", *SLO,
                 "--attainment", "0.9", "--quiet", "--out", str(out)]) == 0
    return out, json.loads((out / "capacity.json").read_text())


def test_capacity_holds_at_its_rate_and_fails_5_percent_above(capacity_run):
    """The issue's check, recomputed here independently of the search: simulate at the answer and 5% above."""
    _, record = capacity_run
    rate = record["max_rate_rps"]
    trace = load_workload(TRACE)
    model_config = SimConfig(scheduler="sarathi", slo_ttft_ms=300, slo_tpot_ms=40)
    model = resolve_step_model(STEP_MODEL)
    at = simulate(rescale_rate(trace, rate), model, model_config).summary
    above = simulate(rescale_rate(trace, rate * 1.05), model, model_config).summary
    assert at["slo_attainment"] >= 0.9 > above["slo_attainment"]
    assert record["slo_attainment"] == at["slo_attainment"] and record["goodput_rps"] == at["goodput_rps"]
    assert record["check_above"]["slo_attainment"] == above["slo_attainment"]
    assert record["check_above"]["feasible"] is False


def test_capacity_json_has_the_answer_metrics_and_probes(capacity_run):
    out, record = capacity_run
    assert record["upper_rate_rps"] <= record["max_rate_rps"] * 1.02 and record["tolerance"] == 0.02
    assert record["metrics"]["ttft_ms"]["p99"] is not None and record["metrics"]["num_requests"] == 200
    probes = record["probes"]
    assert [p["rate_rps"] for p in probes] == sorted(p["rate_rps"] for p in probes)
    assert all(p["feasible"] == (p["slo_attainment"] >= 0.9) for p in probes)
    assert record["trace_rate_rps"] == pytest.approx(mean_rate_rps(load_workload(TRACE)))
    assert (out / "capacity.png").read_bytes()[:4] == b"\x89PNG"


def test_capacity_search_is_deterministic(capacity_run, tmp_path):
    out = tmp_path / "again"
    assert main(["capacity", "--trace", TRACE, "--step-model", STEP_MODEL, "--scheduler", "sarathi", *SLO,
                 "--quiet", "--out", str(out)]) == 0
    again = json.loads((out / "capacity.json").read_text())
    first = capacity_run[1]
    for key in ("max_rate_rps", "upper_rate_rps", "probes", "metrics", "check_above"):
        assert again[key] == first[key]


def test_rate_evaluator_rescales_the_same_requests():
    trace = load_workload(TRACE)
    seen = []
    evaluator = RateEvaluator(trace, lambda t: seen.append(t) or {"slo_attainment": 1.0})
    evaluator(10.0)
    evaluator(10.0)   # cached
    assert len(seen) == 1 and mean_rate_rps(seen[0]) == pytest.approx(10.0)
    assert (seen[0].num_prompt_tokens == trace.num_prompt_tokens).all()


def test_check_above_is_the_target_tested_5_percent_higher():
    model = resolve_step_model(STEP_MODEL)
    evaluate = RateEvaluator(load_workload(TRACE), aggregated(model, SimConfig(scheduler="vllm", slo_ttft_ms=200)))
    result = search_capacity(evaluate, start_rps=5.0, target_attainment=0.95, tolerance=0.01)
    check = check_above(evaluate, result)
    assert check.rate_rps == pytest.approx(result.max_rate_rps * 1.05) and not check.feasible


def test_disaggregated_comparison_uses_the_same_number_of_devices(tmp_path, capsys):
    out = tmp_path / "pd"
    assert main(["capacity", "--trace", TRACE, "--step-model", STEP_MODEL, *SLO, "--disaggregated", "1:2",
                 "--model-spec", "llama-3-8b", "--tolerance", "0.05", "--out", str(out)]) == 0
    record = json.loads((out / "capacity.json").read_text())
    assert record["num_replicas"] == 3 and record["metrics"]["num_replicas"] == 3
    dis = record["disaggregated"]
    assert dis["num_prefill_replicas"] == 1 and dis["num_decode_replicas"] == 2
    assert dis["metrics"]["num_replicas"] == 3 and dis["metrics"]["kv_transfer_ms"]["p50"] > 0.5
    c = record["comparison"]
    assert c["num_devices"] == 3
    assert c["disaggregated_over_aggregated"] == pytest.approx(dis["max_rate_rps"] / record["max_rate_rps"])
    assert capsys.readouterr().out.splitlines()[-2] == (f"same 3 devices: disaggregated / aggregated max rate = "
                                                        f"{c['disaggregated_over_aggregated']:.3f}")


@pytest.mark.parametrize("extra,needle", [
    ([], "needs an SLO"),
    ([*SLO, "--disaggregated", "2"], "--disaggregated"),
    ([*SLO, "--disaggregated", "1:1"], "--model-spec"),
    ([*SLO, "--disaggregated", "1:1", "--replicas", "3", "--model-spec", "tiny"], "--replicas 3"),
    ([*SLO, "--tolerance", "2"], "--tolerance"),
])
def test_bad_input_is_one_line_exit_2_and_no_output(tmp_path, capsys, extra, needle):
    out = tmp_path / "out"
    code = main(["capacity", "--trace", TRACE, "--step-model", "const:5", *extra, "--out", str(out)])
    err = capsys.readouterr().err
    # "stepcal: ..." for input errors, "stepcal capacity: argument ..." for flags refused at parse time
    assert code == 2 and err.startswith("stepcal") and err.count("\n") == 1 and needle in err
    assert not out.exists()


# --- ranges: the capacity's 90% interval -------------------------------------------------------

SMALL_TRACE = "poisson:rate=4,n=60,prompt=uniform:32:512,output=uniform:8:128,seed=3"


def replicated_steps(boundaries_rps: list[float]):
    """Fake replications: replication i meets every SLO up to its own boundary, half of them above it."""
    from stepcal.experiments.capacity.ranges import ReplicatedRates

    def run(seeds, rate):
        return [{"slo_attainment": 1.0 if rate <= boundaries_rps[s] else 0.5} for s in seeds]
    return ReplicatedRates(run, tuple(range(len(boundaries_rps))))


def test_each_bound_is_where_its_percentile_of_the_replications_crosses_the_target():
    from stepcal.experiments.capacity.ranges import search_capacity_ranges
    boundaries = [float(b) for b in np.linspace(8.0, 16.0, 21)]   # replication i fails above 8 + 0.4 i req/s
    replicated = replicated_steps(boundaries)
    curves = search_capacity_ranges(replicated, start_rps=5.0, target_attainment=0.9, tolerance=0.01)
    # The q-th percentile of 21 step curves is >= 0.9 exactly while at least (1 - q) of them still hold.
    for name, expected in (("low", np.percentile(boundaries, 5)), ("median", 12.0), ("high", np.percentile(boundaries, 95))):
        curve = curves[name]
        assert curve.beyond is None
        assert curve.max_rate_rps <= expected < curve.upper_rate_rps <= curve.max_rate_rps * 1.01, name
    assert curves["low"].max_rate_rps < curves["median"].max_rate_rps < curves["high"].max_rate_rps
    # every rate simulated once, for all replications and all three searches
    assert replicated.num_simulations == len(replicated.cache) * 21


def test_a_bound_that_never_crosses_is_beyond_the_searched_range_not_a_number():
    from stepcal.experiments.capacity.ranges import format_ranges, search_capacity_ranges
    replicated = replicated_steps([6.0, 8.0, 10.0, 200.0, 300.0])
    curves = search_capacity_ranges(replicated, start_rps=5.0, target_attainment=0.9, tolerance=0.02, max_rps=50.0)
    assert curves["median"].beyond is None and curves["median"].max_rate_rps <= 10.0
    high = curves["high"]
    assert (high.max_rate_rps, high.beyond, high.limit_rps) == (None, "above", 50.0)
    replicated = replicated_steps([0.5, 6.0, 8.0])
    curves = search_capacity_ranges(replicated, start_rps=5.0, target_attainment=0.9, tolerance=0.02, min_rps=1.0)
    low = curves["low"]
    assert (low.max_rate_rps, low.beyond, low.limit_rps) == (None, "below", 1.0)
    block = {"curves": {n: c.to_dict() for n, c in curves.items()}, "drawn_terms": [], "num_replications": 3,
             "scatter_cv": 0.0, "scatter_rho": 0.0, "num_simulations": 9, "wall_s": 1.0, "workers": 1}
    line = format_ranges(block, 3, 0.5).splitlines()[0]
    assert line == (f"capacity {curves['median'].max_rate_rps:.3g} req/s (90% interval beyond the search floor of "
                    f"1 req/s to {curves['high'].max_rate_rps:.3g})")


def capacity_ranges(tmp_path, name: str, *extra: str, quiet: bool = True) -> dict:
    out = tmp_path / name
    assert main(["capacity", "--trace", SMALL_TRACE, "--step-model", STEP_MODEL, "--scheduler", "sarathi", *SLO,
                 "--tolerance", "0.05", *(["--quiet"] if quiet else []), "--out", str(out), *extra]) == 0
    return json.loads((out / "capacity.json").read_text())


def test_capacity_without_spread_or_scatter_has_a_zero_width_interval_at_the_plain_capacity(tmp_path):
    """A linear: model has no spread to draw; with no scatter either, every replication is the plain run."""
    record = capacity_ranges(tmp_path, "zero", "--ranges", "3", "--scatter-cv", "0")
    ranges = record["ranges"]
    assert ranges["max_rate_rps"] == {"median": record["max_rate_rps"], "low": record["max_rate_rps"],
                                      "high": record["max_rate_rps"]}
    assert ranges["num_replications"] == 3 and ranges["drawn_terms"] == []
    plain = {p["rate_rps"]: p["slo_attainment"] for p in record["probes"]}
    for probe in ranges["probes"]:
        cell = probe["slo_attainment"]
        assert cell["low"] == cell["median"] == cell["high"]
        if probe["rate_rps"] in plain:
            assert cell["median"] == plain[probe["rate_rps"]]
    assert ranges["num_simulations"] == 3 * len(ranges["probes"])


def test_the_capacity_interval_widens_with_the_scatter_and_the_png_shows_it(tmp_path):
    widths = []
    for cv in ("0.05", "0.3"):
        record = capacity_ranges(tmp_path, f"cv{cv}", "--ranges", "5", "--scatter-cv", cv, "--scatter-rho", "0.5",
                                 "--workers", "2" if cv == "0.3" else "1")
        rates = record["ranges"]["max_rate_rps"]
        assert rates["low"] <= rates["median"] <= rates["high"]
        widths.append(rates["high"] - rates["low"])
    assert 0 < widths[0] < widths[1]
    assert (tmp_path / "cv0.3" / "capacity.png").read_bytes()[:4] == b"\x89PNG"


def capacity_ranges_on(backend: str, workers: int) -> tuple[dict, dict]:
    """Each curve's capacity and every probed rate's replications, run on `backend`."""
    from stepcal.experiments.capacity.ranges import ReplicatedRates, search_capacity_ranges
    from stepcal.experiments.replications import ReplicaPool, keep_summary
    from stepcal.simulator.scatter import Scatter
    trace, model = load_workload(SMALL_TRACE), resolve_step_model(STEP_MODEL)
    config = SimConfig(scheduler="sarathi", slo_ttft_ms=300, slo_tpot_ms=40, scatter=Scatter(0.2, 0.5))
    with ReplicaPool(trace, model, config, workers, backend=backend) as pool:
        replicated = ReplicatedRates(lambda seeds, rate: pool.map(keep_summary, seeds, rate), (4, 5, 6))
        curves = search_capacity_ranges(replicated, start_rps=20.0, target_attainment=0.9, tolerance=0.1)
    return {n: c.max_rate_rps for n, c in curves.items()}, replicated.cache


def test_capacity_ranges_are_the_same_in_a_process_pool():
    assert capacity_ranges_on("local", 1) == capacity_ranges_on("local", 2)


@pytest.mark.slow   # a local Ray cluster
def test_capacity_ranges_are_the_same_on_ray(ray_cluster):  # noqa: F811
    assert capacity_ranges_on("ray", 2) == capacity_ranges_on("local", 1)


def test_capacity_prints_the_rate_and_its_interval(tmp_path, capsys):
    record = capacity_ranges(tmp_path, "print", "--ranges", "4", "--scatter-cv", "0.2", quiet=False)
    lines = capsys.readouterr().out.splitlines()
    rates = record["ranges"]["max_rate_rps"]
    assert f"capacity {rates['median']:.3g} req/s (90% interval {rates['low']:.3g}-{rates['high']:.3g})" in lines
    assert any(line.startswith("  over 4 replications (drawn: no term spread; scatter cv 0.2, rho 0, run cv 0): ")
               for line in lines)


def test_capacity_ranges_refuse_disaggregation_in_one_line(tmp_path, capsys):
    code = main(["capacity", "--trace", SMALL_TRACE, "--step-model", STEP_MODEL, *SLO, "--disaggregated", "1:1",
                 "--model-spec", "tiny", "--ranges", "3", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--ranges" in err and not (tmp_path / "o").exists()


def test_capacity_options_default_to_the_capacity_flags():
    """CapacityOptions' defaults, what a caller from code gets, are what `stepcal capacity` does by default."""
    from dataclasses import replace

    from stepcal.experiments.capacity.run import CapacityOptions
    from stepcal.experiments.cli import build_parser
    from stepcal.experiments.commands.capacity import options_from_args
    options = options_from_args(build_parser().parse_args(["capacity", "--trace", TRACE, "--step-model", STEP_MODEL,
                                                           "--out", "o"]))
    assert replace(options, flags={}) == CapacityOptions(trace=TRACE, step_model=STEP_MODEL, out="o")
