"""The built-in evaluation suites, one module each, registering itself on import (`register_suite` on its last
line); importing this package (which `import hf_posenc.evaluation` does) imports every module in it, so a new
built-in suite is one new file here. A suite of your own is one file anywhere: import it, or name it with
`hf-posenc eval --suite-module` (docs/extending.md)."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
