"""deploy/pin_images.py against the real registry (Debian's docker-registry, the CNCF distribution registry) on
127.0.0.1: each third-party reference of a copy of the tree, moved to that registry, gets the digest the registry
serves for its tag; a moved tag is followed on --refresh only; a tag the registry lacks fails with one line."""

import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from deploy.pin_images import SOURCES, ImageReference, references
from server.bench.local_server import free_port
from tests.ops_stack import ROOT

MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


@pytest.fixture
def registry(tmp_path):
    binary = shutil.which("docker-registry")
    assert binary, "`docker-registry` is not installed: apt-get install docker-registry (make test does it as root)"
    port = free_port()
    config = {"version": 0.1, "storage": {"filesystem": {"rootdirectory": str(tmp_path / "storage")}},
              "http": {"addr": f"127.0.0.1:{port}"}, "log": {"level": "error"}}  # fmt: skip
    (tmp_path / "registry.yml").write_text(yaml.safe_dump(config))
    process = subprocess.Popen([binary, "serve", str(tmp_path / "registry.yml")], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/v2/", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and process.poll() is None, "the registry did not start"
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)


def push(registry: str, repository: str, tag: str, content: str) -> str:
    """An image of one config blob (no layers) pushed as repository:tag; returns the manifest's digest."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Labels": {"content": content}},
                         "rootfs": {"type": "layers", "diff_ids": []}}).encode()  # fmt: skip
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    base = f"http://{registry}/v2/{repository}"
    upload = httpx.post(f"{base}/blobs/uploads/")
    assert upload.status_code == 202, upload.text
    location = upload.headers["location"]
    location = location if location.startswith("http") else f"http://{registry}{location}"
    separator = "&" if "?" in location else "?"
    done = httpx.put(f"{location}{separator}digest={config_digest}", content=config,
                     headers={"Content-Type": "application/octet-stream"})  # fmt: skip
    assert done.status_code == 201, done.text
    manifest = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST, "layers": [], "config": {
        "mediaType": "application/vnd.docker.container.image.v1+json", "size": len(config),
        "digest": config_digest}}).encode()  # fmt: skip
    put = httpx.put(f"{base}/manifests/{tag}", content=manifest, headers={"Content-Type": MANIFEST})
    assert put.status_code == 201, put.text
    return put.headers["docker-content-digest"]


def tree_on(registry: str, root: Path) -> list[ImageReference]:
    """A copy of the files the tool reads and of the tool, every third-party image moved to ``registry``."""
    (root / "deploy").mkdir(parents=True)
    shutil.copy(ROOT / "deploy/pin_images.py", root / "deploy/pin_images.py")
    moved = []
    for name in SOURCES:
        text = (ROOT / name).read_text()
        for _, found in [entry for entry in references(ROOT) if entry[0] == name]:
            reference = ImageReference.parse(found)
            moved.append(reference)
            text = text.replace(found, f"{registry}/{reference.repository}:{reference.tag}")
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return moved


def run(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(root / "deploy/pin_images.py"), *args], capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_references_are_read_as_docker_reads_them():
    assert ImageReference.parse("haproxy:3.0.5-alpine") == ImageReference(
        "registry-1.docker.io", "library/haproxy", "3.0.5-alpine", None)
    assert ImageReference.parse("prom/prometheus:v2.53.2@sha256:ab") == ImageReference(
        "registry-1.docker.io", "prom/prometheus", "v2.53.2", "sha256:ab")
    assert ImageReference.parse("nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5-3.4.1-ubuntu22.04").registry == "nvcr.io"
    assert ImageReference.parse("localhost:5000/team/app").tag == "latest"
    found = dict(references(ROOT))
    assert "compose.yaml" in found and "Dockerfile" in found
    assert not [text for _, text in references(ROOT) if text.split(":")[0] in ("vigil", "vigil-canary")]


def test_every_third_party_image_is_pinned_to_what_its_registry_serves(registry, tmp_path):
    root = tmp_path / "tree"
    moved = tree_on(registry, root)
    assert len(moved) >= 10
    digests = {(r.repository, r.tag): push(registry, r.repository, r.tag, "first") for r in moved}
    assert run(root, "--check").returncode == 1
    pinned = run(root)
    assert pinned.returncode == 0, pinned.stderr
    after = dict(references(root))
    for _, text in references(root):
        reference = ImageReference.parse(text)
        assert reference.digest == digests[(reference.repository, reference.tag)], text
    assert run(root, "--check").returncode == 0
    # A tag moved upstream changes nothing until --refresh, which follows it.
    first = moved[0]
    moved_to = push(registry, first.repository, first.tag, "second")
    assert run(root).stdout.strip() == "nothing to change" and dict(references(root)) == after
    refreshed = run(root, "--refresh")
    assert refreshed.returncode == 0 and moved_to in refreshed.stdout
    assert sum(ImageReference.parse(t).digest == moved_to for _, t in references(root)) >= 1


def test_a_tag_the_registry_lacks_fails_with_one_line(registry, tmp_path):
    root = tmp_path / "tree"
    tree_on(registry, root)
    failed = run(root)
    assert failed.returncode == 1
    assert failed.stderr.startswith("pin_images: ") and len(failed.stderr.strip().splitlines()) == 1
    assert "404" in failed.stderr
