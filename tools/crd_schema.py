"""Writes the OpenAPI schema of one version of a CustomResourceDefinition as JSON, for tests/k8s_schemas/:

    git show v2.20.2:config/crd/bases/keda.sh_scaledobjects.yaml | python tools/crd_schema.py v1alpha1 > out.json
"""

import json
import sys

import yaml


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads a bare ``=`` (an enum value of AlertmanagerConfig's matchType) as the "value" tag."""


_Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def main(version: str) -> int:
    crd = yaml.load(sys.stdin, Loader=_Loader)
    [served] = [entry for entry in crd["spec"]["versions"] if entry["name"] == version]
    json.dump(served["schema"]["openAPIV3Schema"], sys.stdout, sort_keys=True, separators=(",", ":"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
