"""The discrete-event simulator of LLM serving: requests, the paged KV and prefix cache, the
schedulers (which the measured-run engine drives too), replicas, the router, the front end and the
client, prefill/decode disaggregation, and replications with ranges. Step times come from a
StepTimeModel (step_model); numpy only, pandas for its output files."""
