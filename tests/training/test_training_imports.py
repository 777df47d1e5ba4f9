"""Serving never loads torch: `reef.training` imports it only when a training name is used."""

from __future__ import annotations

import subprocess
import sys


def imported_after(code: str) -> set[str]:
    probe = code + "\nimport sys\nprint(' '.join(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    return set(result.stdout.split())


def test_importing_the_package_and_the_server_does_not_import_torch() -> None:
    modules = imported_after("import reef.training\nimport reef.cli\nimport reef.server.app")
    assert "torch" not in modules and "peft" not in modules and "transformers" not in modules


def test_using_a_training_name_imports_its_module() -> None:
    modules = imported_after("from reef.training import LoraSettings")
    assert {"reef.training.adapter", "torch", "peft"} <= modules
