"""PASS, FAIL and SKIP lines for the prepared device checks (gpu_check/gpu_check.sh reads them), and the exit status."""

import sys


class Checks:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def record(self, name: str, ok: bool, detail: str = "") -> bool:
        if not ok:
            self.failed.append(name)
        print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
        return ok

    def skip(self, name: str, reason: str) -> None:
        print(f"SKIP {name}: {reason}", flush=True)

    def exit(self) -> None:
        sys.exit(1 if self.failed else 0)
