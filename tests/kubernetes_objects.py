"""deploy/kubernetes built the way `kubectl apply -k` builds it (Debian's `kubectl`, its kustomize), for the static
tests and the end-to-end test: every overlay, alone and with each component."""

import os
import shutil
import subprocess
from itertools import combinations
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
KUBERNETES = ROOT / "deploy/kubernetes"
OVERLAYS = ("cpu", "gpu")
COMPONENTS = ("hpa", "canary", "alerting")
# Alternatives to each other and to the baked-in model: each is built alone, and after the canary.
MODEL_COMPONENTS = ("model-volume", "model-init")


def kubectl() -> str:
    found = shutil.which("kubectl")
    if not found:
        raise RuntimeError("`kubectl` is not installed: apt-get install kubectl (make test does it as root)")
    return found


class _Loader(yaml.SafeLoader):
    """kustomize writes AlertmanagerConfig's matchType ``=`` bare, which YAML 1.1 reads as the "value" tag."""


_Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def kustomize(directory: Path) -> list[dict]:
    result = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {directory} failed:\n{result.stderr}")
    return [document for document in yaml.load_all(result.stdout, Loader=_Loader) if document]


def variants() -> list[tuple[str, tuple[str, ...]]]:
    """(overlay, components) for every overlay with every subset of the components, and with the canary and each
    way of delivering the model."""
    every = [(overlay, chosen) for overlay in OVERLAYS
             for size in range(len(COMPONENTS) + 1) for chosen in combinations(COMPONENTS, size)]  # fmt: skip
    return every + [(overlay, ("canary", model)) for overlay in OVERLAYS for model in MODEL_COMPONENTS]


def build(overlay: str, components: tuple[str, ...], workdir: Path, namespace: str = "vigil") -> list[dict]:
    """An overlay, with ``components`` added to it the way its comments show: its own kustomization with a
    `components:` list, written beside ``workdir`` (kustomize takes relative paths only); and with its
    `namespace:` changed to ``namespace``, as an operator would."""
    source = KUBERNETES / "overlays" / overlay
    if not components and namespace == "vigil":
        return kustomize(source)
    directory = workdir / f"{overlay}-{'-'.join(components)}-{namespace}"
    directory.mkdir(parents=True, exist_ok=True)
    kustomization = yaml.safe_load((source / "kustomization.yaml").read_text())
    kustomization["namespace"] = namespace
    moved = [os.path.relpath((source / path).resolve(), directory) for path in kustomization["resources"]]
    kustomization["resources"] = moved
    kustomization["components"] = [os.path.relpath(KUBERNETES / "components" / name, directory) for name in components]
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return kustomize(directory)


def find(objects: list[dict], kind: str, name: str) -> dict:
    found = [obj for obj in objects if obj["kind"] == kind and obj["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]


def of_kind(objects: list[dict], kind: str) -> list[dict]:
    return [obj for obj in objects if obj["kind"] == kind]
