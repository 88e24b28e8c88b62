"""The ground floor: what every stage of stepcal shares, and nothing that belongs to one stage.

The one error type (errors), atomic writes and checked readers (io, readers), the step batch and
its derived columns (batch, schemas), the metrics' one definition (metrics), model specs,
Hugging Face configs and the tp / ep splits a model allows (model_spec, hf_config, model_files,
parallel_layout), and the files passed between stages:
traces and the workload generators (trace, workload), step logs (step_log) and measured runs
(measured_run). It imports no other part of stepcal; every stage may import it.
"""
