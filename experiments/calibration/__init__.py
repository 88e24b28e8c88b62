"""Calibration: fit the host terms that kernel profiles miss, from one measured run.

Tables composed from kernel profiles leave out what the serving engine does on the host. A
calibration adds host terms to a step model (per step, per sequence and per token of a step, per
request, and the request path's spread) so that serving the measured workload in simulation
matches the run, and gives each term a standard error.

objective.py     the statistics matched and the loss (_Fit: simulations of the run under candidate terms)
search.py        the bounded Powell search of the step terms and its starts
stages.py        calibrate: which terms are fitted in which order, which are held, the base's scale
front_end.py     the front end's shape: the per-request delay's spread and its part per active stream
uncertainty.py   the terms' standard errors and covariance
result.py        Calibration, the result, and its meta.json record
writing.py       calibrate_step_model: the work of `stepcal calibrate`, writing the calibrated tables
step_log_terms.py  the step terms read off a run's step log
request_stats.py   the per-request statistics and their bootstrap noise
"""
from stepcal.experiments.calibration.objective import OBJECTIVE, SUMMARY_OBJECTIVE
from stepcal.experiments.calibration.result import Calibration
from stepcal.experiments.calibration.search import GAP_STD_ERRS, TERM_NAMES
from stepcal.experiments.calibration.stages import UNTOLD_TOKEN, calibrate, held_terms, untold_terms
from stepcal.experiments.calibration.writing import calibrate_step_model, scatter_of

__all__ = ["GAP_STD_ERRS", "OBJECTIVE", "SUMMARY_OBJECTIVE", "TERM_NAMES", "UNTOLD_TOKEN", "Calibration", "calibrate",
           "calibrate_step_model", "held_terms", "scatter_of", "untold_terms"]
