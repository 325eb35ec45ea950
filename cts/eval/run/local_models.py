"""An experiment's hub models fetched once (`cts models download`), and the experiment that runs
on the local copies: its models' `path` pointing at the snapshots, so compute nodes without
internet start from them. The served names stay, so requests and caches do not change."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from cts.eval.run.config import ResolvedExperiment
from cts.serving.download import Downloaded, Snapshot, download, hub_models, write_manifest


@dataclass(frozen=True)
class LocalModels:
    downloaded: list[Downloaded]
    manifest: Path
    #: The experiment with every downloaded model's `path` on its snapshot.
    experiment: Path


def local_experiment(resolved: ResolvedExperiment, downloaded: list[Downloaded]) -> str:
    """The experiment's YAML with every model inlined (as a frozen experiment has them) and the
    downloaded ones' `path` on their local snapshots."""
    document = resolved.experiment.model_dump(mode="json")
    local = {d.key: d.path for d in downloaded}
    document["models"] = {
        key: {**m.model_dump(mode="json"), **({"path": local[key]} if key in local else {})}
        for key, m in resolved.model_configs.items()
    }
    header = (
        f"# {resolved.path} with its models' weights on local disk (`cts models download`; "
        "manifest.json beside this file says what was fetched).\n"
    )
    return header + yaml.safe_dump(document, sort_keys=False, allow_unicode=True)


def download_experiment(
    resolved: ResolvedExperiment, to: Path, snapshot: Snapshot | None = None
) -> LocalModels:
    """Every hub model of the experiment fetched into `to`, then `to/manifest.json` and
    `to/<experiment name>.yaml`, the experiment that runs on the local copies."""
    to.mkdir(parents=True, exist_ok=True)
    downloaded = [
        download(key, model, to, snapshot)
        for key, model in hub_models(resolved.model_configs).items()
    ]
    manifest = write_manifest(to, downloaded)
    experiment = to / f"{resolved.experiment.name}.yaml"
    partial = experiment.with_suffix(".partial")
    partial.write_text(local_experiment(resolved, downloaded))
    partial.replace(experiment)
    return LocalModels(downloaded, manifest, experiment)
