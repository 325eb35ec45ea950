"""Layer 3: exchanging a run's judged answers and a dataset's nuggets with other tools' file
formats (nuggetizer's assignments and nuggets), both ways."""
