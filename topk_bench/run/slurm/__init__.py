"""Cases as Slurm jobs through submitit: ``executor`` (the run's jobs submitted, polled and read back),
``requests`` (what each job asks for, checked against the partition), ``jobs`` (a job's fate from squeue and
sacct), ``journal`` (the jobs of a run on disk, adopted by the next)."""
