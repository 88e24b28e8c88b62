"""Importers of measured runs written by other tools (today: `vllm bench serve --save-result`)."""
