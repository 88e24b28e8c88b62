"""The step's parts: table terms grouped into kernels, element-wise work and host time, calibrated
host terms counted as host time, and the front end per request beside them."""
import numpy as np
import pandas as pd
import pytest

from stepcal.core.batch import StepFeatures, batch_row
from stepcal.costmodel.tables import TableStepModel
from stepcal.costmodel.terms import FeatureCurve
from stepcal.experiments.validation.split import describe_split, step_split, term_parts_ms
from stepcal.simulator.step_model import HostTerms, HostTermsModel, ScaledStepModel


def _curve(name, axis, per_unit_ms):
    knots = np.array([1.0, 1024.0])
    return FeatureCurve(name, axis, knots, per_unit_ms * knots, np.zeros(2), name)


def _tables():
    terms = [_curve("linear", "num_tokens", 0.02), _curve("lm_head", "num_seqs", 0.01),
             _curve("elementwise", "num_tokens", 0.005), _curve("sampling", "num_seqs", 0.001),
             _curve("overhead", "num_seqs", 0.003)]
    return TableStepModel(terms)


def _steps():
    return pd.DataFrame([batch_row([1] * 4, [100] * 4), batch_row([64], [0])])


def test_terms_go_to_their_parts_and_calibrated_host_terms_are_host_time():
    features = StepFeatures.from_columns(_steps())     # (4 seqs, 4 tokens) and (1 seq, 64 tokens)
    parts = term_parts_ms(_tables(), features)
    np.testing.assert_allclose(parts["kernels"], [0.02 * 4 + 0.01 * 4, 0.02 * 64 + 0.01])
    np.testing.assert_allclose(parts["elementwise"], [0.005 * 4 + 0.001 * 4, 0.005 * 64 + 0.001])
    np.testing.assert_allclose(parts["host"], [0.003 * 4, 0.003])
    calibrated = HostTermsModel(_tables(), HostTerms(per_step_ms=0.5, per_seq_ms=0.1, per_token_ms=0.01))
    with_terms = term_parts_ms(calibrated, features)
    np.testing.assert_allclose(with_terms["host"], parts["host"] + [0.5 + 0.4 + 0.04, 0.5 + 0.1 + 0.64])
    np.testing.assert_allclose(with_terms["kernels"], parts["kernels"])
    doubled = term_parts_ms(ScaledStepModel(calibrated, 2.0), features)
    np.testing.assert_allclose(doubled["host"], 2 * with_terms["host"])
    # a calibrated base scale scales each of the base's parts, before the host terms are added
    halved = term_parts_ms(HostTermsModel(_tables(), HostTerms(per_step_ms=0.5, base_scale=0.5)), features)
    np.testing.assert_allclose(halved["kernels"], 0.5 * parts["kernels"])
    np.testing.assert_allclose(halved["elementwise"], 0.5 * parts["elementwise"])
    np.testing.assert_allclose(halved["host"], 0.5 * parts["host"] + 0.5)


def test_the_split_sums_the_parts_over_the_steps_and_says_it_in_one_line():
    split = step_split(_tables(), _steps(), front_end_ms=3.0)
    assert split["num_steps"] == 2
    total = sum(split["total_ms"].values())
    assert total == pytest.approx(_tables().features_ms(StepFeatures.from_columns(_steps())).sum())
    assert sum(split["share"].values()) == pytest.approx(1.0)
    line = describe_split(split)
    assert line.startswith("predicted step time over the measured steps: kernels ") and "element-wise" in line
    assert line.endswith("; front end 3 ms per request (TTFT and E2E)")


def test_a_calibrated_base_scale_is_recorded_and_said():
    scaled = HostTermsModel(_tables(), HostTerms(per_step_ms=0.5, base_scale=0.8))
    split = step_split(scaled, _steps(), front_end_ms=None)
    assert split["base_scale"] == 0.8
    assert describe_split(split).endswith("; the base's times x 0.800 (calibrated: it priced the calibration run too slow)")
    assert "base_scale" not in step_split(HostTermsModel(_tables(), HostTerms(per_step_ms=0.5)), _steps(), None)
    assert step_split(ScaledStepModel(scaled, 2.0), _steps(), None)["base_scale"] == 0.8   # under a rescale too


def test_no_split_without_terms_or_steps():
    from stepcal.simulator.step_model import LinearStepModel
    assert step_split(LinearStepModel(5.0, 0.1, 0.0), _steps(), None) is None
    assert step_split(_tables(), _steps().iloc[:0], None) is None
    assert describe_split(None) is None


def test_the_report_shows_each_part_and_the_front_end_apart():
    from stepcal.experiments.report.build import split_rows
    rows = split_rows(step_split(_tables(), _steps(), front_end_ms=2.5))
    assert [r[0] for r in rows] == ["kernels", "element-wise", "host",
                                    "front end (per request, TTFT and E2E; not step time)"]
    assert rows[-1][1:] == ["2.5 per request", "-"]
    scaled = split_rows(step_split(HostTermsModel(_tables(), HostTerms(base_scale=0.8)), _steps(), front_end_ms=None))
    assert scaled[-1] == ["the base's times, scaled by calibration (in the parts above)", "x 0.800", "-"]


def test_the_front_ends_mean_delay_counts_the_streams_each_arrival_found():
    from stepcal.core.trace import Trace
    from stepcal.experiments.validation.split import mean_front_end_ms
    from stepcal.simulator.frontend import FrontEnd
    trace = Trace.from_arrays([0.0, 1.0, 2.0], [10, 20, 30], [5, 5, 5])
    # the first is still in the system at 1.0 and 2.0, the second left at 1.5
    requests = pd.DataFrame({"arrival_s": [0.0, 1.0, 2.0], "finish_s": [3.0, 1.5, 4.0]})
    front = FrontEnd(median_ms=2.0, per_prompt_token_ms=0.1, per_stream_ms=1.0)
    assert mean_front_end_ms(front, trace, requests, seed=0) == pytest.approx(2.0 + 0.1 * 20 + (0 + 1 + 1) / 3)
    assert mean_front_end_ms(FrontEnd(), trace, requests, seed=0) is None
