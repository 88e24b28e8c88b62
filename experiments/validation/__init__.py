"""Validation: how far a simulation is from a measured run of the same workload.

measured.py reads a measured run (core.measured_run's layout) as validation compares it;
errors.py holds relative errors and one error cell; steps.py the step-level error and the
step-time noise floor; compare.py the validation record (validation.json) and the errors left
with step time matched; validate.py the work of `stepcal validate`; table.py its markdown table;
noise.py the scatter of step time; vllm_bench.py imports a `vllm bench serve` result as a measured
run, llmservingsim_run.py a vLLM run recorded by LLMServingSim's bench. Calibration, which fits host terms to a measured run, is experiments.calibration.
"""
