"""The replay device: `stepcal profile --device replay:PROFILE` answers each measurement from a
profile measured before (ours, Vidur, AIConfigurator, LLMServingSim), so campaign logic, budgets
and resumption run without a GPU, on a GPU's real timings."""
