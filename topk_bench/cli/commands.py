"""Imports every command module so that each registers its command on the app."""

from topk_bench.cli import (
    compare_cmd,  # noqa: F401 -- registers its command
    doctor_cmd,  # noqa: F401 -- registers its command
    gate_cmd,  # noqa: F401 -- registers its command
    list_cmd,  # noqa: F401 -- registers its command
    plot_cmd,  # noqa: F401 -- registers its command
    profile_cmd,  # noqa: F401 -- registers its command
    report_cmd,  # noqa: F401 -- registers its command
    run_cmd,  # noqa: F401 -- registers its command
    show_cmd,  # noqa: F401 -- registers its command
)
