"""The registered MLflow model: a pyfunc that maps step-batch features to T_step via the tables.

Imported only by costmodel.tracking (it loads mlflow at import).
"""
from __future__ import annotations

import mlflow.pyfunc
import numpy as np

from stepcal.core.batch import StepFeatures


class TStepPyfunc(mlflow.pyfunc.PythonModel):
    """Input: a DataFrame with the batch feature columns. Output: T_step and its spread, in ms."""

    def load_context(self, context):
        from stepcal.costmodel.tables import load_step_model  # lazy: loads pandas
        self.model = load_step_model(context.artifacts["tables"])

    def predict(self, context, model_input, params=None):
        import pandas as pd  # lazy: loads pandas

        features = StepFeatures.from_columns(model_input)
        return pd.DataFrame({"t_step_ms": self.model.features_ms(features),
                             "spread_ms": np.asarray(self.model.features_spread_ms(features))})
