"""costmodel: profiles in, T_step tables out.

importers/ (every profile format -> one record frame), features (per-target features and
physics terms), regressors / additive (scikit-learn estimators), tuning (Optuna), fitting
(held-out errors per target), compose + build + tables (T_step grids, meta.json, and
`load_step_model` for the simulator), tracking (MLflow), predict and export.

Importing this package loads neither torch nor scikit-learn; those load where they are used.
"""
