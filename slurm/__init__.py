"""sbatch templates and the submit/merge logic that renders them (built with the Slurm issue)."""
