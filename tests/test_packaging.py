"""pyproject.toml lists every package folder: a kernel folder missing from `packages` works in an
editable install and vanishes from a regular one."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = cfg["package-dir"]
    found = set()
    for name, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    assert found == set(cfg["packages"]), (
        f"missing from pyproject packages: {sorted(found - set(cfg['packages']))}; "
        f"listed but absent: {sorted(set(cfg['packages']) - found)}")


def test_no_top_level_passes_or_runtime_module():
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    assert mapping == {"lingc": "lingc", "lingc.passes": "passes", "lingc.runtime": "runtime"}
