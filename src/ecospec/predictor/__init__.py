"""Expert predictor Π_θ: model, routing traces, training and accuracy (paper §4.1, App. B).

Typical use::

    traces_dir = collect_traces(target, dataset, "traces/")          # target router's top-k per token
    p = ExpertPredictor.from_target(target, "Qwen/Qwen3-0.6B")        # or a transformers config
    summary = train_predictor(p, traces_dir, epochs=100, out_dir="ckpt/", checkpoint_at_accuracy=(0.5, 0.6))
    ecospec.generate(target, ids, drafter=d, selector="ecospec", predictor=ExpertPredictor.load("ckpt/final"))
"""

from ecospec.predictor.accuracy import topk_accuracy, topk_overlap
from ecospec.predictor.model import CheckpointMismatchError, ExpertPredictor, PredictorConfig, PredictorSession
from ecospec.predictor.traces import Traces, collect_traces, load_traces
from ecospec.predictor.train import Checkpoint, TrainSummary, evaluate, routing_loss, split_samples, train_predictor

__all__ = [
    "Checkpoint",
    "CheckpointMismatchError",
    "ExpertPredictor",
    "PredictorConfig",
    "PredictorSession",
    "TrainSummary",
    "Traces",
    "collect_traces",
    "evaluate",
    "load_traces",
    "routing_loss",
    "split_samples",
    "topk_accuracy",
    "topk_overlap",
    "train_predictor",
]
