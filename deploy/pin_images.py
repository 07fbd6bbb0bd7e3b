"""Pins every third-party image the stack runs to the digest its registry gives for its tag, so that a tag moved
upstream (or a registry compromised) cannot change what runs. The tag stays beside the digest, for people:
`prom/prometheus:v2.53.2@sha256:...` (Docker and Kubernetes pull by the digest and ignore the tag).

    python -m deploy.pin_images            # resolve each tag's digest now and write it in (needs the registries)
    python -m deploy.pin_images --refresh  # the same, for references already pinned: after changing a tag
    python -m deploy.pin_images --check    # exit 1, listing them, while a reference is not pinned

Vigil's own images (built from this tree: vigil, vigil-canary, vigil-model) are not pinned here: pin them where
you push them (`images: [{name: vigil, newName: ..., digest: sha256:...}]` in the overlay)."""

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
# Where image references are written, relative to the repository, and the pattern that finds each.
SOURCES = {
    "compose.yaml": re.compile(r"^(\s*image:\s*)(\S+)\s*$", re.M),
    "Dockerfile": re.compile(r"^(FROM\s+)(\S+)", re.M),
    "deploy/kubernetes/base/track/epp.yaml": re.compile(r"^(\s*image:\s*)(\S+)\s*$", re.M),
}
OWN_IMAGES = ("vigil", "vigil-canary", "vigil-model")
# A manifest list or OCI index first: its digest is the same on every platform the image is built for.
MANIFEST_TYPES = ", ".join((
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
))


class PinError(RuntimeError):
    """A registry that could not be asked, or gave no digest."""


@dataclass(frozen=True)
class ImageReference:
    registry: str  # the host (and port) to ask: registry-1.docker.io for Docker Hub
    repository: str
    tag: str
    digest: str | None

    @classmethod
    def parse(cls, text: str) -> "ImageReference":
        name, _, digest = text.partition("@")
        first, _, rest = name.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            registry, path = first, rest
        else:
            registry, path = "registry-1.docker.io", name if "/" in name else f"library/{name}"
        repository, _, tag = path.rpartition(":") if ":" in path else (path, "", "latest")
        return cls(registry, repository, tag, digest or None)

    @property
    def base_url(self) -> str:
        host = self.registry.split(":")[0]
        scheme = "http" if host in ("localhost", "127.0.0.1") else "https"  # as Docker treats local registries
        return f"{scheme}://{self.registry}"


def own_image(text: str) -> bool:
    return text.split("@")[0].split(":")[0] in OWN_IMAGES or text.startswith("$")


def bearer_token(client: httpx.Client, challenge: str, repository: str) -> str:
    """The anonymous pull token a `WWW-Authenticate: Bearer realm=...,service=...` challenge points to."""
    fields = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    if not challenge.lower().startswith("bearer") or "realm" not in fields:
        raise PinError(f"the registry asks for credentials this tool does not have: {challenge}")
    params = {"scope": f"repository:{repository}:pull"}
    if "service" in fields:
        params["service"] = fields["service"]
    answer = client.get(fields["realm"], params=params)
    answer.raise_for_status()
    body = answer.json()
    return body.get("token") or body["access_token"]


def resolve(client: httpx.Client, reference: ImageReference) -> str:
    """The digest the registry serves for the reference's tag now."""
    url = f"{reference.base_url}/v2/{reference.repository}/manifests/{reference.tag}"
    headers = {"Accept": MANIFEST_TYPES}
    try:
        answer = client.head(url, headers=headers)
        if answer.status_code == 401:
            token = bearer_token(client, answer.headers.get("www-authenticate", ""), reference.repository)
            answer = client.head(url, headers={**headers, "Authorization": f"Bearer {token}"})
    except httpx.HTTPError as error:
        raise PinError(f"{reference.registry}/{reference.repository}:{reference.tag}: {error}") from error
    digest = answer.headers.get("docker-content-digest", "")
    if answer.status_code != 200 or not digest.startswith("sha256:"):
        raise PinError(f"{reference.registry}/{reference.repository}:{reference.tag}: the registry answered "
                       f"{answer.status_code} without a digest")
    return digest


def references(root: Path) -> list[tuple[str, str]]:
    """(file, reference) for every third-party image reference, in file order."""
    return [(name, match.group(2)) for name, pattern in SOURCES.items()
            for match in pattern.finditer((root / name).read_text()) if not own_image(match.group(2))]  # fmt: skip


def pinned(found: str, client: httpx.Client, refresh: bool) -> str:
    """``found`` with the digest its registry serves now, or as it is (Vigil's own, or pinned already)."""
    reference = ImageReference.parse(found)
    if own_image(found) or (reference.digest and not refresh):
        return found
    return f"{found.split('@')[0]}@{resolve(client, reference)}"


def pin(root: Path, client: httpx.Client, refresh: bool) -> list[str]:
    """Writes each reference's digest in; returns what changed, as 'file: old -> new'."""
    changed = []
    for name, pattern in SOURCES.items():
        path = root / name
        text = path.read_text()
        for match in reversed(list(pattern.finditer(text))):
            found = match.group(2)
            new = pinned(found, client, refresh)
            if new != found:
                changed.append(f"{name}: {found} -> {new}")
                text = text[: match.start(2)] + new + text[match.end(2):]
        path.write_text(text)
    return changed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.pin_images", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--check", action="store_true", help="list the references not pinned; exit 1 if any")
    parser.add_argument("--refresh", action="store_true", help="resolve pinned references again")
    args = parser.parse_args(argv)
    if args.check:
        loose = [f"{name}: {text}" for name, text in references(ROOT) if "@sha256:" not in text]
        print("\n".join(loose) if loose else "every third-party image is pinned by digest")
        return 1 if loose else 0
    try:
        with httpx.Client(timeout=30, follow_redirects=True) as client:
            changed = pin(ROOT, client, args.refresh)
    except PinError as error:
        print(f"pin_images: {error}", file=sys.stderr)
        return 1
    print("\n".join(changed) if changed else "nothing to change")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
