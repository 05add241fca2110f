"""Which step costs (memplanner/batch_step_costs.py) price a batch's forwards: this machine's, cached in
POCKETSPEC_HOME/costs by `pocketspec doctor --calibrate --batch` (pocketspec/batch/step_calibration.py) for
this model, settings and batch shape, else the roofline of the model's shape. The batch engine and
`pocketspec plan --batch` read them alike; nothing here loads a model."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from memplanner.batch_rows import kv_dtype_for
from memplanner.batch_step_costs import StepCosts, shape_step_costs
from memplanner.shapes import shape_from_gguf
from memplanner.torch_sizes import gguf_layout, resolve_weights_format
from pocketspec.backends.torch_open import self_skip_layers, self_sparse_window
from pocketspec.calibrate import cost_key
from pocketspec.loader import ModelChoice
from pocketspec.measured_cache import costs_dir, read_json, write_json
from pocketspec.settings import BatchSettings, ModelSettings, SpeculationSettings


@dataclass(frozen=True)
class BatchShape:
    """What a batch's forward costs depend on besides the model file and its settings."""

    num_rows: int  # rows stepped together at most
    max_context: int  # per row (a self-sparse draft's: its window)
    width: int  # a row's widest forward (verify rows)
    is_batch_invariant: bool
    kv_dtype: str
    num_layers: int  # a self-skip draft runs fewer than the model has


@dataclass(frozen=True)
class BatchModel:
    """One model of a batch engine, as its forwards are priced: the target, or its draft."""

    role: str  # "target", or "draft (<kind>)"
    path: Path  # the model file (a self-draft's is the target's)
    shape: BatchShape
    is_window: bool = False  # a self-sparse draft: every forward attends over its whole window


def batch_models(choice: ModelChoice, target_settings: ModelSettings, speculation: SpeculationSettings,
                 batch: BatchSettings) -> list[BatchModel]:
    """The target and the draft (if any) that pocketspec/batch/open.py opens on these settings (speculation as
    batch_speculation made it), by the shapes that price their forwards: one answer for the engine, `plan
    --batch` and `doctor --calibrate --batch`, so a table one measures is the table the others read."""
    on_gpu = target_settings.is_on_gpu
    weights = resolve_weights_format(target_settings.weights, on_gpu)
    kv_dtype = kv_dtype_for(target_settings.torch_kv_type, weights, on_gpu)
    num_layers = shape_from_gguf(choice.target_path).num_layers
    rows = dict(num_rows=min(batch.max_batch, batch.num_rows or batch.max_batch), width=speculation.max_gamma + 1)
    target = BatchShape(max_context=target_settings.max_context, kv_dtype=kv_dtype, num_layers=num_layers,
                        is_batch_invariant=batch.batch_invariance_on("cuda" if on_gpu else "cpu"), **rows)
    models = [BatchModel("target", choice.target_path, target)]
    if speculation.drafter not in ("auto", "model"):
        return models
    fast = replace(target, is_batch_invariant=False)  # a draft runs the fast kernels
    if choice.drafter == "self-sparse":
        window = replace(fast, max_context=self_sparse_window(target_settings, speculation),
                         kv_dtype=kv_dtype_for(speculation.self_draft_kv_type, weights, on_gpu))
        models.append(BatchModel("draft (self-sparse)", choice.target_path, window, is_window=True))
    elif choice.drafter == "self-skip":
        models.append(BatchModel("draft (self-skip)", choice.target_path,
                                 replace(fast, num_layers=self_skip_layers(num_layers, speculation))))
    elif choice.draft_path is not None:
        draft_layers = shape_from_gguf(choice.draft_path).num_layers
        models.append(BatchModel("draft (model)", choice.draft_path, replace(fast, num_layers=draft_layers)))
    return models


def step_costs_key(model_path: Path, settings: ModelSettings, shape: BatchShape) -> str:
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


def batch_step_costs(model: BatchModel, settings: ModelSettings, *, may_be_measured: bool = True) -> StepCosts:
    """The measured costs of this model's shape (unless may_be_measured is False), else its roofline (the
    controller corrects either from the forwards it times); a self-sparse draft's over its window."""
    measured = cached_step_costs(step_costs_key(model.path, settings, model.shape)) if may_be_measured else None
    on_gpu = settings.is_on_gpu
    costs = measured or shape_step_costs(
        shape_from_gguf(model.path), weights_format=resolve_weights_format(settings.weights, on_gpu),
        kv_dtype=model.shape.kv_dtype, is_tied=gguf_layout(model.path)[0], on_gpu=on_gpu,
        num_layers=model.shape.num_layers)
    return costs.with_window(model.shape.max_context) if model.is_window else costs
