"""The YAML configs shipped with the toolkit (models/, experiments/, search/, slurm/).

A package only so that they travel with a pip install; `CONFIG_DIR` is where they are.
"""

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent
DEFAULT_EXPERIMENT = CONFIG_DIR / "experiments" / "quickstart.yaml"
