"""One import root: the wheel installs `cts` and nothing else at the top of site-packages, so a
user's `eval.py` or `train.py` beside their script, or another package's `agents`, shadows
nothing of it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_source_tree_has_one_package_at_its_top():
    """Every folder with Python code that is installed is under cts/ (tests, bench and scripts
    are not installed)."""
    tops = {p.parent.relative_to(ROOT).parts[0] for p in ROOT.glob("*/__init__.py")}
    assert tops == {"cts", "tests"}


@pytest.mark.slow
def test_the_wheel_installs_cts_only_and_user_scripts_named_like_its_parts_shadow_nothing(
    tmp_path: Path,
):
    # Built from a copy: setuptools writes build/ beside the sources it builds.
    source = tmp_path / "source"
    shutil.copytree(ROOT / "cts", source / "cts", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE", "NOTICE"):
        shutil.copy(ROOT / name, source / name)
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(dist), str(source)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = dist.glob("clarify_then_search-*.whl")
    with zipfile.ZipFile(wheel) as z:
        tops = {name.split("/")[0] for name in z.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"cts"}

    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    before = set(p.name for p in site.iterdir())
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "-q", str(wheel)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-2000:]
    added = {p.name for p in site.iterdir()} - before
    assert {a for a in added if not a.endswith(".dist-info")} == {"cts"}

    work = tmp_path / "work"
    work.mkdir()
    for name in ("eval", "train", "agents", "serving"):
        (work / f"{name}.py").write_text(
            f"raise SystemExit('the user\\'s {name}.py was imported')\n"
        )
    script = textwrap.dedent(
        """
        import cts
        from cts.eval.report.frame import records_table
        from cts.cli import app
        from cts.eval.run.config import load_experiment
        resolved = load_experiment(None, ["dataset.limit=1"])
        print(cts.__file__, resolved.experiment.name, app.info.name or "cts")
        """
    )
    # The project's dependencies, not its code: a folder on PYTHONPATH has its .pth files (the
    # editable install's) ignored, so `cts` can only come from the fresh venv.
    deps = sysconfig.get_paths()["purelib"]
    ran = subprocess.run(
        [str(python), "-c", script],
        cwd=work, capture_output=True, text=True, timeout=600,
        env={"PYTHONPATH": deps, "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    where, name, _ = ran.stdout.split()
    assert Path(where).is_relative_to(venv) and name == "quickstart"


def test_the_front_door_lists_what_it_gives_and_imports_no_model_library():
    """`import cts` gives every name of `__all__`, each imported on first use: no torch,
    transformers or vLLM until a name that needs them is asked for."""
    script = (
        "import sys, cts\n"
        "heavy = [m for m in ('torch', 'transformers', 'vllm') if m in sys.modules]\n"
        "names = sorted(cts.__all__)\n"
        "missing = [n for n in names if getattr(cts, n, None) is None]\n"
        "print(heavy, missing, len(names))\n"
    )
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr[-2000:]
    # `heavy` is read right after `import cts`, before any name is asked for.
    assert ran.stdout.startswith("[] [] ") and ran.stdout.split()[-1] == "17", ran.stdout
