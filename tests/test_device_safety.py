"""The step path builds no tensor on the CPU by default: a torch factory call there must say its device. On a GPU,
a tensor made on the CPU by mistake either fails against CUDA tensors or silently copies every step; this test
finds such calls without a GPU, by reading the source."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Files that run on every step: the engine, the models, tensor parallelism, the attention backends and the sampler.
STEP_PATH = [*sorted((ROOT / "server" / "engine").glob("*.py")), *sorted((ROOT / "server" / "models").glob("*.py")),
             *sorted((ROOT / "server" / "distributed").glob("*.py")), ROOT / "kernels" / "backend.py"]
FACTORIES = {"tensor", "empty", "zeros", "ones", "full", "arange", "Generator", "randn", "rand", "randint",
             "as_tensor", "bincount"}
# Run once at start-up (weights, tables), where a CPU tensor that is moved to the device afterwards is fine; and
# the loaders, which read files into host memory on purpose.
START_UP = {"__init__", "load_weights", "from_folder"}
HOST_SIDE_FILES = {"loader.py", "gguf_convert.py", "gguf_tokenizer.py", "quantization.py"}


def factory_calls_without_device(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            scope = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                    and isinstance(child.func.value, ast.Name) and child.func.value.id == "torch"
                    and child.func.attr in FACTORIES and function not in START_UP
                    and not any(keyword.arg == "device" for keyword in child.keywords)):
                found.append(f"{path.relative_to(ROOT)}:{child.lineno} torch.{child.func.attr}(...) in "
                             f"{function or 'module scope'}")
            visit(child, scope)

    visit(tree, None)
    return found


@pytest.mark.parametrize("path", [p for p in STEP_PATH if p.name not in HOST_SIDE_FILES], ids=lambda p: p.name)
def test_tensors_on_the_step_path_name_their_device(path):
    assert not factory_calls_without_device(path)
