"""The Slurm clusters the tests beside run against (tests/slurm_clusters.py), as fixtures."""

from slurm_clusters import private_cluster, private_slurm, slurm_cluster, slurm_conf  # noqa: F401 -- the fixtures
