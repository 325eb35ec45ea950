"""The benchmark as Slurm jobs: sbatch templates, `cts slurm submit` (array evaluation job +
afterok merge job) and `cts slurm status`."""
