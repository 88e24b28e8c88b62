import sys, time
sys.path.insert(0, ".")
from tests.experiments.test_calibrate import synthetic_run
from experiments.validation.calibration import calibrate, _shape_start, _Fit
from simulator.step_model import HostTerms, HostTermsModel, LinearStepModel
from simulator.workload import load_workload
base = LinearStepModel(4.0, 0.02, 0.0005)
truth = HostTerms(per_request_ms=25.0, per_request_sigma=0.5, per_stream_ms=3.0)
n, budget = int(sys.argv[1]), int(sys.argv[2])
trace = load_workload(f"poisson:rate=12,n={n},prompt=uniform:64:512,output=uniform:16:128", seed=3)
run = synthetic_run(trace, HostTermsModel(base, truth), front_end_seed=99)
fit=_Fit(run, base)
print("start", _shape_start(fit, HostTerms()))
t=time.perf_counter()
r = calibrate(run, base, max_simulations=budget)
print(time.perf_counter()-t, r.num_simulations, r.terms, r.std_err, r.front_end["kept"])
