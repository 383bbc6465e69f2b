"""Imports every command module so that each registers its command on the app."""

from topk_bench.cli import list_cmd  # noqa: F401 -- registers its command
from topk_bench.cli import plot_cmd  # noqa: F401 -- registers its command
from topk_bench.cli import profile_cmd  # noqa: F401 -- registers its command
from topk_bench.cli import compare_cmd  # noqa: F401 -- registers its command
from topk_bench.cli import doctor_cmd  # noqa: F401 -- registers its command
from topk_bench.cli import run_cmd  # noqa: F401 -- registers its command
from topk_bench.cli import show_cmd  # noqa: F401 -- registers its command
