"""The step log's table: decode runs expanded step by step, list columns that read back as int64 arrays."""
import numpy as np
import pandas as pd

from stepcal.core.batch import StepFeatures, feature_row
from stepcal.core.io import atomic_write_table
from stepcal.core.step_log import StepLogBuilder


def _log_with_a_step_and_a_run() -> StepLogBuilder:
    log = StepLogBuilder(replica=2)
    q, kv = np.array([5, 1]), np.array([0, 7])
    log.add_step(0.0, 3.0, feature_row(q, kv), (11, 12), q, kv)
    ones, kv0 = np.array([1, 1, 1]), np.array([5, 8, 20])
    log.add_steps(np.array([0.003, 0.005, 0.007]), np.array([2.0, 2.0, 2.0]), StepFeatures.decode_run(kv0, 3),
                  (11, 12, 13), ones, kv0)
    return log


def test_decode_runs_expand_into_one_row_per_step(tmp_path):
    frame = _log_with_a_step_and_a_run().to_frame()
    assert frame["step"].tolist() == [0, 1, 2, 3] and (frame["replica"] == 2).all()
    assert [r.tolist() for r in frame["request_ids"]] == [[11, 12], [11, 12, 13], [11, 12, 13], [11, 12, 13]]
    assert [k.tolist() for k in frame["kv_lens"]] == [[0, 7], [5, 8, 20], [6, 9, 21], [7, 10, 22]]
    assert [q.tolist() for q in frame["q_lens"]] == [[5, 1], [1, 1, 1], [1, 1, 1], [1, 1, 1]]
    assert frame["decode_kv_sum"].tolist() == [7, 33, 36, 39]
    # written as it is, the table reads back as the frame it gives in memory
    atomic_write_table(_log_with_a_step_and_a_run().to_table(), tmp_path / "steps.parquet")
    back = pd.read_parquet(tmp_path / "steps.parquet")
    assert back.dtypes.equals(frame.dtypes) and back["kv_lens"][3].dtype == np.int64
    assert all(np.array_equal(a, b) for a, b in zip(back["kv_lens"], frame["kv_lens"]))


def test_an_empty_log_has_every_column():
    frame = StepLogBuilder(replica=0).to_frame()
    assert len(frame) == 0 and {"request_ids", "q_lens", "kv_lens", "num_seqs"} <= set(frame.columns)
    assert "request_ids" not in StepLogBuilder(replica=0, record_batches=False).to_frame().columns
