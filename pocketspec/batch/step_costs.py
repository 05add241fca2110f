"""Which step costs (memplanner/batch_step_costs.py) price a batch's forwards: this machine's, cached in
POCKETSPEC_HOME/costs by `pocketspec doctor --calibrate --batch` (pocketspec/batch/step_calibration.py) for
this model, settings and batch shape, else the roofline of the model's shape. The batch engine and
`pocketspec plan --batch` read them alike; nothing here loads a model."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from memplanner.batch_step_costs import StepCosts, shape_step_costs
from memplanner.shapes import shape_from_gguf
from memplanner.torch_sizes import gguf_layout
from pocketspec.calibrate import cost_key
from pocketspec.measured_cache import costs_dir, read_json, write_json

if TYPE_CHECKING:
    from pocketspec.batch.batched_model import BatchedModel


@dataclass(frozen=True)
class BatchShape:
    """What a batch's forward costs depend on besides the model file and its settings."""

    num_rows: int  # rows stepped together at most
    max_context: int  # per row (a self-sparse draft's: its window)
    width: int  # a row's widest forward (verify rows)
    is_batch_invariant: bool
    kv_dtype: str
    num_layers: int  # a self-skip draft runs fewer than the model has

    @classmethod
    def of(cls, model: BatchedModel, max_rows: int) -> BatchShape:
        return cls(min(max_rows, model.num_rows), model.max_context, model.max_logits_rows,
                   model.settings.is_batch_invariant, model.cache.kv_dtype, model.num_layers)


def step_costs_key(model_path: Path, settings, shape: BatchShape) -> str:
    """The cost_key of the model file under these settings (ModelSettings), with the batch's shape."""
    return json.dumps({"model": json.loads(cost_key(model_path, settings)), **asdict(shape)}, sort_keys=True)


def _path(key: str) -> Path:
    return costs_dir() / f"batch-{hashlib.sha1(key.encode()).hexdigest()[:20]}.json"


def cached_step_costs(key: str) -> StepCosts | None:
    data = read_json(_path(key))
    try:
        costs = StepCosts.from_json(data) if data is not None else None
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return costs if costs is not None and costs.key == key else None


def store_step_costs(costs: StepCosts) -> bool:
    return write_json(_path(costs.key), costs.to_json())


def batch_step_costs(model_path: Path, settings, shape: BatchShape, *, weights_format: str, on_gpu: bool,
                     is_window: bool = False, may_be_measured: bool = True) -> StepCosts:
    """The measured costs of this shape (unless may_be_measured is False), else its roofline (the controller
    corrects either from the forwards it times); is_window: a self-sparse draft, whose every forward attends
    over its whole window."""
    measured = cached_step_costs(step_costs_key(model_path, settings, shape)) if may_be_measured else None
    costs = measured or shape_step_costs(
        shape_from_gguf(model_path), weights_format=weights_format, kv_dtype=shape.kv_dtype,
        is_tied=gguf_layout(model_path)[0], on_gpu=on_gpu, num_layers=shape.num_layers)
    return costs.with_window(shape.max_context) if is_window else costs
