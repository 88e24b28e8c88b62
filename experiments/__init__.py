"""The `stepcal` CLI and what it runs over the other packages.

cli.py          the entry point; commands/ one thin handler per command (flags.py: shared flags)
campaign/       the quickstart pipeline, stage by stage
validation/     measured runs against simulations, step-time noise, the vLLM bench import
calibration/    host terms fitted to a measured run (`stepcal calibrate`)
capacity/       the highest rate within SLOs; sweep/ grids of simulations; report/ md + html reports
profiling.py    the kernel sweep as `stepcal profile` runs it; step_models.py resolves --step-model

Scripts that are not part of the package live at the repository root: bench/, studies/, gpu/.
"""
