"""Generators and the spec grammar: seeded, the right rate / burstiness / lengths, clear errors."""
from pathlib import Path

import numpy as np
import pytest

from stepcal.core.errors import InputError
from stepcal.core.workload import (
    Empirical,
    Fixed,
    Gamma,
    LogNormal,
    OnOff,
    Poisson,
    Uniform,
    WorkloadSpec,
    arrivals_s,
    generate,
    mean_rate_rps,
    parse_spec,
    read_trace,
)

FIXTURES = Path(__file__).resolve().parents[1] / "data"
AZURE_TINY = FIXTURES / "azure_tiny.csv"


POISSON_5 = Poisson(5.0)
PROMPT_8, OUTPUT_4 = Fixed(8), Fixed(4)


def make(process=POISSON_5, prompt=PROMPT_8, output=OUTPUT_4, **size):
    size = size or {"num_requests": 100}
    return generate(WorkloadSpec(process, prompt, output, **size))


def gaps_cv(arrival):
    gaps = np.diff(arrival)
    return gaps.std() / gaps.mean()


# ---- arrivals ----

def test_same_seed_same_trace_other_seed_other_trace():
    spec = parse_spec("poisson:rate=5,n=200,prompt=lognormal:512:1.0,output=uniform:16:256,seed=7")
    a, b = generate(spec.complete()), generate(spec.complete())
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    np.testing.assert_array_equal(a.num_prompt_tokens, b.num_prompt_tokens)
    np.testing.assert_array_equal(a.num_output_tokens, b.num_output_tokens)
    c = generate(spec.complete(seed=8))          # the spec's seed=7 wins over a default
    np.testing.assert_array_equal(a.arrival_s, c.arrival_s)
    d = generate(parse_spec(spec.text.replace("seed=7", "seed=8")).complete())
    assert not np.array_equal(a.arrival_s, d.arrival_s)


def test_poisson_mean_rate_and_cv():
    trace = make(Poisson(5.0), num_requests=20_000)
    assert len(trace) == 20_000 and trace.arrival_s[0] == 0.0
    assert (np.diff(trace.arrival_s) >= 0).all()
    assert mean_rate_rps(trace) == pytest.approx(5.0, rel=0.03)
    assert gaps_cv(trace.arrival_s) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("cv", [0.5, 3.0])
def test_gamma_burstiness(cv):
    trace = make(Gamma(5.0, cv), num_requests=20_000)
    assert gaps_cv(trace.arrival_s) == pytest.approx(cv, rel=0.10)
    assert mean_rate_rps(trace) == pytest.approx(5.0, rel=0.10)


def test_onoff_is_silent_when_off():
    trace = make(OnOff(20.0, on_s=10.0, off_s=30.0), duration_s=400.0)
    phase_s = trace.arrival_s % 40.0
    assert (phase_s < 10.0).all()
    assert (trace.arrival_s < 400.0).all()
    # ten on periods of 10 s at 20 req/s
    assert len(trace) == pytest.approx(2000, rel=0.1)


def test_sized_by_duration_or_both():
    by_duration = make(Poisson(10.0), duration_s=100.0)
    assert (by_duration.arrival_s < 100.0).all()
    assert len(by_duration) == pytest.approx(1000, rel=0.1)
    assert by_duration.arrival_s[-1] > 95.0                       # it fills the whole window
    capped = make(Poisson(10.0), num_requests=50, duration_s=100.0)
    assert len(capped) == 50
    short = make(Poisson(10.0), num_requests=5000, duration_s=10.0)
    assert len(short) < 200 and (short.arrival_s < 10.0).all()


def test_arrivals_need_a_size():
    with pytest.raises(InputError, match="needs a size"):
        arrivals_s(Poisson(1.0), np.random.default_rng(0))


def test_one_request():
    assert make(num_requests=1).arrival_s.tolist() == [0.0]


# ---- lengths ----

def test_lognormal_mean_and_clamp():
    rng = np.random.default_rng(0)
    values = LogNormal(512.0, 1.0).sample(rng, 20_000)
    assert values.dtype == np.int64
    assert values.mean() == pytest.approx(512.0, rel=0.03)
    clamped = LogNormal(512.0, 2.0, max_tokens=1000).sample(rng, 20_000)
    assert clamped.min() >= 1 and clamped.max() == 1000


def test_uniform_includes_both_ends():
    values = Uniform(16, 20).sample(np.random.default_rng(0), 2000)
    assert set(values.tolist()) == {16, 17, 18, 19, 20}


def test_empirical_resamples_pairs_from_the_source():
    source = read_trace(AZURE_TINY)
    source_pairs = set(zip(source.num_prompt_tokens.tolist(), source.num_output_tokens.tolist()))
    trace = make(prompt=Empirical(str(AZURE_TINY)), output=Empirical(str(AZURE_TINY)),
                 num_requests=1000)
    pairs = set(zip(trace.num_prompt_tokens.tolist(), trace.num_output_tokens.tolist()))
    assert pairs == source_pairs            # only source pairs, and with n=1000 all four of them


def test_empirical_prompt_with_independent_output():
    source = read_trace(AZURE_TINY)
    trace = make(prompt=Empirical(str(AZURE_TINY)), output=Uniform(1, 3), num_requests=500)
    assert set(trace.num_prompt_tokens.tolist()) == set(source.num_prompt_tokens.tolist())
    assert set(trace.num_output_tokens.tolist()) == {1, 2, 3}


# ---- the spec grammar ----

def test_spec_examples_from_the_brief():
    poisson = parse_spec("poisson:rate=5,n=1000,prompt=lognormal:512:1.0,output=uniform:16:256,seed=0")
    assert poisson.complete() == WorkloadSpec(Poisson(5.0), LogNormal(512.0, 1.0), Uniform(16, 256),
                                              num_requests=1000, seed=0)
    gamma = parse_spec("gamma:rate=5,cv=3,duration=60,prompt=fixed:100,output=lognormal:64:0.5:512")
    assert gamma.complete().process == Gamma(5.0, 3.0)
    assert gamma.complete().output == LogNormal(64.0, 0.5, 512)
    assert gamma.complete().duration_s == 60.0
    onoff = parse_spec(f"onoff:rate=20,on=10,off=30,n=50,prompt=empirical:{AZURE_TINY},output=fixed:1")
    assert onoff.complete().process == OnOff(20.0, 10.0, 30.0)
    assert onoff.complete().prompt == Empirical(str(AZURE_TINY))
    both = parse_spec(f"poisson:rate=1,n=5,lengths=empirical:{AZURE_TINY}").complete()
    assert both.prompt == both.output == Empirical(str(AZURE_TINY))


def test_spec_flags_fill_gaps_and_rate_overrides():
    partial = parse_spec("poisson:prompt=fixed:3,output=fixed:2")
    spec = partial.complete(rate_rps=4.0, num_requests=30, seed=3)
    assert (spec.process, spec.num_requests, spec.seed) == (Poisson(4.0), 30, 3)
    assert parse_spec("poisson:rate=1,n=5,prompt=fixed:3,output=fixed:2").complete(
        rate_rps=9.0).process == Poisson(9.0)


def test_spec_path_with_a_comma(tmp_path):
    path = tmp_path / "a,b.csv"
    path.write_text(AZURE_TINY.read_text())
    spec = parse_spec(f"poisson:rate=1,prompt=empirical:{path},output=fixed:2,n=3").complete()
    assert spec.prompt == Empirical(str(path)) and spec.num_requests == 3


@pytest.mark.parametrize("text, pattern", [
    ("uniform:rate=5", "must start with one of poisson, gamma, onoff"),
    ("poisson", "must start with one of"),
    ("poisson:rate=5,n=10,prompt=fixed:3,output=fixed:3,cv=2", r"unknown key 'cv' for poisson \(keys:"),
    ("poisson:rate=fast", r"'rate=fast': must be a positive number, got 'fast'"),
    ("poisson:rate=-1", "must be a positive number"),
    ("poisson:rate=5,n=2.5", r"'n=2.5': must be a positive integer"),
    ("poisson:rate=5,n=0", "must be a positive integer"),
    ("poisson:rate=5,rate=6", "rate is given twice"),
    ("poisson:rate=5,prompt", r"'prompt': expected KEY=VALUE"),
    ("poisson:rate=5,prompt=zipf:3", "unknown length distribution 'zipf'"),
    ("poisson:rate=5,prompt=uniform:10", r"uniform takes LO:HI"),
    ("poisson:rate=5,prompt=uniform:10:5", "uniform needs LO <= HI"),
    ("poisson:rate=5,prompt=lognormal:512:1:2:3", r"lognormal takes MEAN:SIGMA:\[MAX\]"),
    ("poisson:rate=5,prompt=empirical:", "empirical needs a file"),
    ("poisson:rate=5,lengths=fixed:3", "lengths= takes empirical:PATH"),
    ("poisson:rate=5,lengths=empirical:x.csv,prompt=fixed:2", "prompt is given twice"),
])
def test_spec_syntax_errors(text, pattern):
    with pytest.raises(InputError, match=pattern) as info:
        parse_spec(text)
    assert str(info.value).startswith(f"generator spec {text!r}")


@pytest.mark.parametrize("text, pattern", [
    ("poisson:n=10,prompt=fixed:3,output=fixed:3", r"rate= is missing"),
    ("gamma:rate=5,n=10,prompt=fixed:3,output=fixed:3", r"cv= is missing"),
    ("onoff:rate=5,on=1,n=10,prompt=fixed:3,output=fixed:3", r"off= is missing"),
    ("poisson:rate=5,prompt=fixed:3,output=fixed:3", r"give its size, n=REQUESTS or duration=SECONDS"),
    ("poisson:rate=5,n=10,output=fixed:3", r"prompt= is missing"),
])
def test_spec_missing_parts(text, pattern):
    with pytest.raises(InputError, match=pattern):
        parse_spec(text, label="--trace").complete(label="--trace")
