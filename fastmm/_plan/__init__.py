"""Problem -> kernel: the heuristic table, precision modes, forced and tuned kernels, and what `explain` prints.

Pure Python by design (no CuPy, no CUDA): the plan runs and is tested on a machine without a GPU. The dispatcher
describes each product as a `Problem`; `choose` looks it up in the table (`RULES`, in order: the first rule whose
test holds names the kernel), unless a kernel is forced or an autotuned entry covers it.
"""

from .accuracy import SERIAL_RUN_BOUND, serial_run
from .describe import cublas_ahead_of_parts, describe, settings
from .cublas_ahead import CUBLAS_AHEAD, CublasAhead, cublas_ahead, yield_to_cublas, yielding_to_cublas
from .forced import forced_kernel, invalid, kernel_names, kernels_on, use_kernel, validated
from . import ozaki
from .precision import (PRECISIONS, ozaki_fallback, _check_precision, current_precision, get_float32_matmul_precision,
                        matmul_precision, set_float32_matmul_precision)
from .problem import Choice, Device, Problem, Rule, RuleName, few_rows
from .table import (RULES, after_out_of_memory, aligned_copies, choose, interior, items_in_turn, padded_k, split_cut,
                    without_copies)
from .tiles import wave_efficiency
from .tuned import on_reload, reload_tuned, tune_bucket, tune_cache_path, tuned_entries

__all__ = ["serial_run", "SERIAL_RUN_BOUND", "Problem", "Device", "Choice", "Rule", "RuleName", "RULES", "choose",
           "describe", "settings", "cublas_ahead_of_parts", "use_kernel", "forced_kernel", "kernel_names", "kernels_on",
           "invalid", "validated",
           "tune_bucket", "tune_cache_path", "tuned_entries", "reload_tuned", "on_reload", "wave_efficiency",
           "few_rows", "aligned_copies", "interior", "items_in_turn", "padded_k", "split_cut",
           "without_copies", "after_out_of_memory", "CUBLAS_AHEAD", "cublas_ahead", "CublasAhead", "yielding_to_cublas",
           "yield_to_cublas", "PRECISIONS", "current_precision", "set_float32_matmul_precision",
           "get_float32_matmul_precision", "matmul_precision", "_check_precision", "ozaki", "ozaki_fallback"]
