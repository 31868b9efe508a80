"""Expert predictor Π_θ: model, routing traces, training and accuracy (paper §4.1, App. B).

Typical use::

    traces_dir = collect_traces(target, dataset, "traces/")          # target router's top-k per token
    p = ExpertPredictor.from_target(target, "Qwen/Qwen3-0.6B")        # or a transformers config
    summary = train_predictor(p, traces_dir, epochs=100, out_dir="ckpt/", checkpoint_at_accuracy=(0.5, 0.6))
    ecospec.generate(target, ids, drafter=d, selector="ecospec", predictor=ExpertPredictor.load("ckpt/final"))
"""

from ecospec.lazy import lazy_attributes

# imported on first use: all but `trace_files` load torch, which what only reads traces does without
LAZY = {
    "ecospec.predictor.accuracy": ("topk_accuracy", "topk_overlap"),
    "ecospec.predictor.model": ("CheckpointMismatchError", "ExpertPredictor", "PredictorConfig", "PredictorSession"),
    "ecospec.predictor.trace_files": ("Traces", "load_traces"),
    "ecospec.predictor.traces": ("collect_traces",),
    "ecospec.predictor.train": (
        "Checkpoint",
        "TrainSummary",
        "evaluate",
        "routing_loss",
        "split_samples",
        "train_predictor",
    ),
}

__getattr__ = lazy_attributes(__name__, LAZY)

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
