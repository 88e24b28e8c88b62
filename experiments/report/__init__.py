"""`stepcal report`: validation and cost-model results as markdown, a self-contained HTML page and PNGs.

inputs.py reads the directories, plots.py draws (matplotlib, imported lazily), document.py renders
markdown and HTML, build.py puts them together and logs them to MLflow.
"""
