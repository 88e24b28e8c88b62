"""Profiling to a budget: the plan of a campaign before any device time (`stepcal profile plan`),
and budgeted adaptive sampling (`stepcal profile --budget-s N`)."""
