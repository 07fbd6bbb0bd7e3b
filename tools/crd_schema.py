"""Writes the OpenAPI schema of one version of a CustomResourceDefinition as JSON, for tests/k8s_schemas/:

    git show v2.20.2:config/crd/bases/keda.sh_scaledobjects.yaml | python tools/crd_schema.py v1alpha1 > out.json
"""

import json
import sys

import yaml


def main(version: str) -> int:
    crd = yaml.safe_load(sys.stdin)
    [served] = [entry for entry in crd["spec"]["versions"] if entry["name"] == version]
    json.dump(served["schema"]["openAPIV3Schema"], sys.stdout, sort_keys=True, separators=(",", ":"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
