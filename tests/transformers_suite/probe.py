"""Which registered schemes apply to each model class of transformers' own tests, on those tests' own tiny configs.

Run inside the built tree (its `tests` package is transformers', not ours), as `tree.probe` does:
`python probe.py FAMILY=tests/models/...py ...` prints {family: {"TestClass::ModelClass": [schemes]}} as JSON.
A test case is set up as unittest would (`setUp` builds the model tester), and each class of `all_model_classes`
is built from the config the tests use; `hf_posenc.supports` answers on that model.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import unittest
from typing import Any


def test_cases(module: Any) -> list[type]:
    """The module's test classes that build models (they have `all_model_classes`)."""
    return [obj for _, obj in inspect.getmembers(module, inspect.isclass)
            if issubclass(obj, unittest.TestCase) and obj.__module__ == module.__name__
            and hasattr(obj, "all_model_classes")]  # None until setUp on CausalLMModelTest


def supported(path: str) -> dict[str, list[str]]:
    """{"TestClass::ModelClass": schemes `supports` accepts} for every model class a test file builds."""
    import hf_posenc

    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    found: dict[str, list[str]] = {}
    for case_class in test_cases(module):
        case = case_class(methodName="setUp")
        case.setUp()
        config = case.model_tester.prepare_config_and_inputs_for_common()[0]
        for model_class in case.all_model_classes:
            model = model_class(config)
            found[f"{case_class.__name__}::{model_class.__name__}"] = [
                name for name in hf_posenc.list_schemes() if hf_posenc.supports(model, name)]
    return found


def main(argv: list[str]) -> None:
    importlib.import_module("conftest")  # the tree's: the constant causal_lm_tester.py imports
    print(json.dumps({family: supported(path) for family, path in (arg.split("=", 1) for arg in argv)}))


if __name__ == "__main__":
    main(sys.argv[1:])
