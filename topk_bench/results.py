"""The results CSV: its columns, appending a row, loading a file or a directory."""

from __future__ import annotations

# Required columns, in this order, after which come one column per suite
# parameter and the optional columns a suite asks for (DESIGN.md, "Contracts").
REQUIRED_COLUMNS = (
    "suite", "case_id", "workload", "impl", "label", "mode", "device", "device_name", "method",
    "status", "error", "peak_bytes", "reserved_bytes", "baseline_bytes", "time_median_s",
    "time_iqr_s", "time_mean_s", "time_min_s", "repeats", "times_s", "flops", "torch_version",
    "git_sha", "timestamp",
)
OPTIONAL_COLUMNS = ("rel_err", "grad_cos", "fidelity_seq_len", "emb_cos", "nn_agree", "nn_spearman")
