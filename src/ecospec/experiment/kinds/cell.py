"""cell: one (model, method, dataset, decoding settings) measured against AR (`experiment.cell`), or vLLM's
(`experiment.vllm_cell`, backend=vllm)."""

from ecospec.experiment.config import cell_directory, validate_cell
from ecospec.experiment.kinds import Job, JobKind, register


def run(job: Job, job_dir):
    if ((job.config.get("backend") or {}).get("name") or "hf") == "vllm":
        from ecospec.experiment.vllm_cell import run_vllm_cell

        return run_vllm_cell(job, job_dir)
    from ecospec.experiment.cell import run_cell

    return run_cell(job, job_dir)


def line(record: dict) -> str:
    """α, E, speedup vs AR (its interval) and the estimated weight bytes of a verify pass; vLLM's TPOT for its
    cells."""
    s = record["summary"]
    cpu = record.get("env", {}).get("device") == "cpu"
    clock = {"thread_cpu": " (CPU time)", "wall": " (CPU wall clock)"}.get(s.get("clock", "wall"), "") if cpu else ""
    if ((record.get("config") or {}).get("backend") or {}).get("name") == "vllm":  # vLLM reports no experts
        return (
            f"alpha {s['alpha']:.2f}  TPOT {1e3 * s['tpot_s']:.2f} ms vs AR "
            f"{1e3 * s['ar_tpot_s']:.2f} ms  speedup {s['speedup']:.2f}x (vLLM{', CPU wall clock' if clock else ''})"
        )
    iv = (s.get("intervals") or {}).get("speedup")
    band = f" [{iv['low']:.2f}, {iv['high']:.2f}]" if iv else ""
    env = record.get("env") or {}
    warm = f"  compiled, warm-up {env['compile_s']:.1f} s (untimed)" if env.get("engine") == "compiled" else ""
    return (
        f"alpha {s['alpha']:.2f}  E {s['experts_per_layer']:.2f}  "
        f"speedup {s['speedup']:.2f}x{band} vs AR{clock}  HBM per verify pass {s['hbm_bytes_per_verify'] / 1e6:.2f} MB "
        f"(est.){warm}"
    )


KIND = register(
    JobKind(
        name="cell",
        validate=validate_cell,
        run=run,
        line=line,
        directory=cell_directory,
        measures=True,
        order=10,
    )
)
