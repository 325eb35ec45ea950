"""What every part stands on and nothing here stands on another part: one loader for every YAML
config (yaml_config), whole-or-absent writes and storage errors (disk), file checks and reads
(files), the filesystem a path lives on (filesystems), and secrets from the environment
(secrets). It imports nothing else of `cts`."""
